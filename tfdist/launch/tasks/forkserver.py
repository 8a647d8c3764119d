"""The fork server: a Python interpreter with TensorFlow imported, which forks task programs on request.

The local engine starts it as ``python -m tfdist.launch.tasks.forkserver FD`` (with ``preload``, see
:mod:`tfdist.launch.engines._forkserver`), with the environment its tasks share, FD being its end of a Unix
``SOCK_SEQPACKET`` socket pair. It imports ``tensorflow`` (and ``tf_keras`` when ``TF_USE_LEGACY_KERAS`` is
"1" or "true" and tf-keras is installed) once, then serves requests, one message each: ``{"argv": [python, "-m", MODULE, *ARGS],
"env": {...}, "cwd": DIR}`` with the task's stdout and stderr write ends attached (``SCM_RIGHTS``). For each it
forks a child that runs ``MODULE`` as ``python -m`` would (see :func:`run_child`) and replies ``{"pid": PID}``
(or ``{"error": TEXT}``); when a child ends it sends ``{"pid": PID, "status": WAIT_STATUS}``. It exits when
the launcher's end closes; children still running are then the launcher reaper's.

Example:
    >>> import socket
    >>> a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    >>> send_message(a, {"pid": 12})
    >>> receive_message(b)
    ({'pid': 12}, [])
    >>> a.close(); receive_message(b)
    (None, [])
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from tfdist.runtime import exit_codes, logs

MAX_MESSAGE = 1 << 20  # bytes of one message (a request's argv and env)
_TRUE = ("1", "true")


def send_message(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """Sends ``message`` (JSON) as one packet, with ``fds`` attached."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the fds that came with it; ``(None, [])`` once the other end has closed."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def preload(env: Mapping[str, str]) -> None:
    """Imports what every task imports: ``tensorflow``, and ``tf_keras`` under ``TF_USE_LEGACY_KERAS`` where
    tf-keras is installed (TensorFlow 2.22 has none: its tasks use Keras 3)."""
    importlib.import_module("tensorflow")
    if env.get("TF_USE_LEGACY_KERAS", "").strip().lower() in _TRUE:
        with contextlib.suppress(ImportError):
            importlib.import_module("tf_keras")


def _reset_signals() -> None:
    """The signal dispositions of a fresh interpreter: defaults, Python's SIGINT, SIGPIPE and SIGXFSZ ignored."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python ignores these at start-up (EPIPE is an exception).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _run_module(module: str, args: Sequence[str]) -> int:
    """Runs ``module`` as ``__main__`` with ``args``; its exit code as the interpreter would give it."""
    sys.argv = ["-m", *args]  # run_module puts the module's file in sys.argv[0]
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    # The server's imports may hold the module already (tfdist.launch imports the function runner); as in a
    # new interpreter, __main__ is a fresh run of it, beside that copy (and runpy does not warn of it).
    sys.modules.pop(module, None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exit_:
        if exit_.code is not None and not isinstance(exit_.code, int):
            sys.stderr.write(f"{exit_.code}\n")
        return exit_codes.from_exit_value(exit_.code)
    except BaseException:
        traceback.print_exc()
        return 1


def _finish() -> None:
    """What an interpreter does at the end: join non-daemon threads, run atexit, flush stdio."""
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon and thread.is_alive():
            thread.join()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()


def run_child(request: Mapping[str, Any], out: int, err: int) -> NoReturn:
    """In a forked child: becomes the task ``request`` describes (``out``/``err`` its stdout/stderr fds).

    Its own session; /dev/null for stdin; a fresh interpreter's signals; exactly the request's environment
    and working directory; ``sys.argv`` and ``sys.path[0]`` as ``python -m`` sets them. Never returns.
    """
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        _reset_signals()
        os.environ.clear()
        os.environ.update(request["env"])  # This child's own environment: it is a new task.
        _reinstall_logging()
        _reseed()
        os.chdir(request["cwd"])
        argv = list(request["argv"])
        code = _run_module(argv[2], argv[3:])
        _finish()
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        os._exit(code)


def _reseed() -> None:
    """NumPy's global generator as a new interpreter has it: seeded afresh (Python's ``random`` reseeds itself
    after a fork; NumPy's would otherwise repeat the server's sequence in every task)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _reinstall_logging() -> None:
    """``import tfdist`` set the ``tfdist`` logger from the server's TFDIST_LOG_LEVEL: set it from the task's."""
    logs.install_default()


class _Server:
    """The serving loop: one thread (forking a multi-threaded process is unsafe), woken by SIGCHLD."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd hears SIGCHLD

    def serve(self) -> int:
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [])
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_r, 4096)
            if not self._reap():
                return 0
            if self.sock.fileno() in ready:
                request, fds = receive_message(self.sock, max_fds=2)
                if request is None:
                    return 0  # The launcher is gone or done; live children are its reaper's.
                if not self._fork(request, fds):
                    return 0

    def _fork(self, request: Mapping[str, Any], fds: list[int]) -> bool:
        try:
            if len(fds) != 2:
                raise ValueError(f"a request needs 2 fds (stdout, stderr), got {len(fds)}")
            pid = os.fork()
        except (OSError, ValueError) as err:
            for fd in fds:
                os.close(fd)
            return self._send({"error": repr(err)})
        if pid == 0:
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            run_child(request, fds[0], fds[1])
        for fd in fds:
            os.close(fd)
        return self._send({"pid": pid})

    def _reap(self) -> bool:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            if not self._send({"pid": pid, "status": status}):
                return False

    def _send(self, message: Mapping[str, Any]) -> bool:
        try:
            send_message(self.sock, message)
        except OSError:
            return False  # The launcher is gone.
        return True


def main(argv: Sequence[str]) -> int:
    """``forkserver FD [--no-preload]``: serves on socket FD (``--no-preload``: without importing TensorFlow)."""
    sock = socket.socket(fileno=int(argv[1]))
    if "--no-preload" not in argv[2:]:
        preload(os.environ)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return _Server(sock).serve()


if __name__ == "__main__":
    # No interpreter teardown: with TensorFlow loaded it takes its time, and the server has nothing to clean up.
    os._exit(main(sys.argv))
