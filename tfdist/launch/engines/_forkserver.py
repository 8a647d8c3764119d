"""The launcher's side of the fork server: tasks forked from an interpreter that has imported TensorFlow.

Most of a small task's CPU time is ``import tensorflow``. With ``preload`` (see
:class:`~tfdist.launch.config.Supervision`) the local engine starts tfdist's own task programs (the function
runner and the TF server, ``python -m tfdist.launch.tasks.function|server``) through a fork server
(:mod:`tfdist.launch.tasks.forkserver`) that imported TensorFlow once: each task is a fork of it, in a session
of its own, with exactly its environment, working directory and output pipes. Tasks whose environments differ
in more than their own variables (``TF_CONFIG``, ``TFDIST_*``, ``DTENSOR_*``) get another server, up to
:data:`MAX_SERVERS`; anything else (a user's command, a task in a network namespace) starts as a new process,
and so does every task once its server could not start or died (logged as a warning).

A process that launches many local runs (a test session, a notebook) can keep its servers between runs
(:func:`sharing`): each run then forks from a server that is already up, instead of starting one and
importing TensorFlow again.

Example:
    >>> import sys
    >>> eligible([sys.executable, "-m", "tfdist.launch.tasks.server"]), eligible(["python", "train.py"])
    (True, False)
    >>> shared_env({"PATH": "/bin", "TF_CONFIG": "{}", "TFDIST_RESTART": "1", "DTENSOR_JOBS": "a"})
    {'PATH': '/bin'}
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tfdist.errors import LaunchFailure
from tfdist.launch.engines._process import GroupProcess
from tfdist.launch.output import LineSink, read_lines
from tfdist.launch.tasks import forkserver as protocol
from tfdist.launch.tasks.programs import TaskProgram

_log = logging.getLogger("tfdist.launch")
MAX_SERVERS = 3  # per engine (or shared): past these, an idle server ends, or tasks start as new processes
_PROGRAMS = frozenset({TaskProgram.FUNCTION.module, TaskProgram.SERVER.module})
_TASK_PREFIXES = ("TFDIST_", "DTENSOR_")
_PER_CALL = frozenset({"TF_CONFIG", "PYTEST_CURRENT_TEST"})  # a task's own, or pytest's: read by no import
_SPAWN_SECONDS = 120.0  # for the first reply, which waits for the server's import of TensorFlow
_ORPHAN_POLL = 0.1
_GONE = object()  # what the reply queue holds once the server is gone


def eligible(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is one of tfdist's task programs that a fork server runs: this Python, ``-m``, the
    function runner or the TF server."""
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in _PROGRAMS


def shared_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without one task's own variables: what a fork server is started with, and keyed by."""
    return {k: v for k, v in env.items() if k not in _PER_CALL and not k.startswith(_TASK_PREFIXES)}


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which whoever adopted it has not reaped yet, has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ServerGone(LaunchFailure):
    """The fork server did not answer: it failed to start, or died (the engine then starts tasks plainly)."""


class ForkServer:
    """One fork server process and the thread that reads its messages.

    Example:
        >>> import os, sys
        >>> server = ForkServer(dict(os.environ, TF_USE_LEGACY_KERAS="0"), preload=False)
        >>> server.alive, server.close(), server.alive
        (True, None, False)
    """

    def __init__(self, env: Mapping[str, str], *, preload: bool = True) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = TaskProgram.FORKSERVER.argv(str(theirs.fileno()))
        if not preload:
            argv.append("--no-preload")
        try:
            self._proc = subprocess.Popen(
                argv,
                env=dict(env),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as err:
            mine.close()
            raise ServerGone(f"could not start the fork server: {err}") from err
        finally:
            theirs.close()
        self._sock = mine
        self._lock = threading.Lock()  # one request at a time: replies come in request order
        self._replies: queue.Queue[Any] = queue.Queue()
        self._watchers: dict[int, Callable[[int | None], None]] = {}
        self._ended: dict[int, int] = {}  # statuses that came before their pid was watched
        self._state = threading.Lock()
        self._closing = False
        self.alive = True
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        threading.Thread(target=self._read_stderr, name="tfdist-forkserver-stderr", daemon=True).start()
        self._reader = threading.Thread(target=self._read, name="tfdist-forkserver", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The server's process id (the parent of every task it forks)."""
        return self._proc.pid

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in read_lines(self._proc.stderr):
            self._stderr.append(line)

    def _read(self) -> None:
        try:
            while True:
                message, _ = protocol.receive_message(self._sock)
                if message is None:
                    break
                if "status" in message:
                    self._report(int(message["pid"]), int(message["status"]))
                else:
                    self._replies.put(message)
        except OSError:
            pass
        self._gone()

    def _report(self, pid: int, status: int | None) -> None:
        with self._state:
            watcher = self._watchers.pop(pid, None)
            if watcher is None and status is not None:
                self._ended[pid] = status
        if watcher is not None:
            watcher(status)

    def _gone(self) -> None:
        with self._state:
            self.alive = False
            watchers, self._watchers = self._watchers, {}
            closing = self._closing
        self._replies.put(_GONE)
        if not closing:
            code = self._proc.wait()
            _log.warning(
                "The fork server (pid %d) died with exit code %s; tasks start as new processes from now on. "
                "Its last output: %s",
                self._proc.pid,
                code,
                list(self._stderr) or "none",
            )
        for watcher in watchers.values():
            watcher(None)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, fds: tuple[int, int]) -> int:
        """Forks a task running ``argv`` (``python -m MODULE ARGS``); its pid. ServerGone if there is no server."""
        request = {"argv": list(argv), "env": dict(env), "cwd": cwd}
        with self._lock:
            if not self.alive:
                raise ServerGone("the fork server is gone")
            try:
                protocol.send_message(self._sock, request, fds)
                reply = self._replies.get(timeout=_SPAWN_SECONDS)
            except (OSError, queue.Empty) as err:
                self._proc.kill()  # A late reply would answer the next request.
                raise ServerGone(f"the fork server did not answer: {err!r}") from err
        if reply is _GONE:
            self._replies.put(_GONE)
            raise ServerGone("the fork server is gone")
        if "error" in reply:
            raise ServerGone(f"the fork server could not fork: {reply['error']}")
        return int(reply["pid"])

    @property
    def idle(self) -> bool:
        """Whether no task it forked is still watched (ending it then disturbs no run)."""
        with self._state:
            return not self._watchers

    def watch(self, pid: int, watcher: Callable[[int | None], None]) -> None:
        """``watcher(wait_status)`` once task ``pid`` ends; ``watcher(None)`` if the server dies first."""
        with self._state:
            status = self._ended.pop(pid, None)
            if status is None and self.alive:
                self._watchers[pid] = watcher
                return
        watcher(status)

    def close(self, timeout: float = 10.0) -> None:
        """Ends the server (its tasks run on); idempotent."""
        with self._state:
            if self._closing:
                return
            self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join(timeout)
        self._sock.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stderr is not None:
            self._proc.stderr.close()


class ForkedProcess(GroupProcess):
    """A task forked by a :class:`ForkServer`: the same interface as a local process.

    Example:
        >>> import os, sys
        >>> server = ForkServer(os.environ, preload=False)
        >>> lines = []
        >>> hello = [sys.executable, "-m", "platform"]
        >>> proc = ForkedProcess("worker:0", server, hello, env=os.environ,
        ...                      on_line=lambda task, line: lines.append(line))
        >>> proc.wait(30), proc.release(5), len(lines)
        (0, None, 1)
        >>> server.close()
    """

    def __init__(
        self,
        task: str,
        server: ForkServer,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        on_line: LineSink,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(task, on_line, on_exit)
        self._code: int | None = None
        self._ended = threading.Event()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self._pid = server.spawn(argv, env, os.getcwd(), (out_w, err_w))
        except BaseException:
            os.close(out_r)
            os.close(err_r)
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        self._start_pump([os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")])
        server.watch(self._pid, self._exited)

    @property
    def pid(self) -> int:
        return self._pid

    def _exited(self, status: int | None) -> None:
        if status is None:  # The server died first: wait for the task's end, whose code is lost.
            threading.Thread(target=self._await_orphan, name=f"tfdist-{self.task}-orphan", daemon=True).start()
            return
        self._code = os.waitstatus_to_exitcode(status)
        self._ended.set()

    def _await_orphan(self) -> None:
        while _running(self._pid):
            time.sleep(_ORPHAN_POLL)
        self._on_line(self.task, f"tfdist: the fork server of {self.task} died before it; its exit code is lost.")
        self._code = 1
        self._ended.set()

    def _returncode(self) -> int | None:
        return self._code if self._ended.is_set() else None

    def _block(self, timeout: float | None) -> bool:
        return self._ended.wait(timeout)


class ForkServers:
    """An engine's fork servers, one per shared environment (see :func:`shared_env`), started on first use.

    Example:
        >>> import os, sys
        >>> servers = ForkServers()
        >>> servers.start("worker:0", ["python", "train.py"], os.environ, print) is None  # not eligible
        True
        >>> servers.close()
    """

    def __init__(self) -> None:
        self._servers: dict[tuple[tuple[str, str], ...], ForkServer | None] = {}
        self._lock = threading.Lock()

    def _server(self, env: Mapping[str, str]) -> ForkServer | None:
        shared = shared_env(env)
        key = tuple(sorted(shared.items()))
        with self._lock:
            if key in self._servers:
                self._servers[key] = self._servers.pop(key)  # The most recently used last.
            else:
                if len(self._servers) >= MAX_SERVERS and not self._end_an_idle_server():
                    return None
                try:
                    self._servers[key] = ForkServer(shared)
                except ServerGone as err:
                    _log.warning("%s; tasks start as new processes.", err)
                    self._servers[key] = None
            server = self._servers[key]
            return server if server is not None and server.alive else None

    def start(
        self,
        task: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        on_line: LineSink,
        on_exit: Callable[[int], None] | None = None,
    ) -> ForkedProcess | None:
        """``task`` forked by the server of ``env``; None when it cannot be (then start it as a new process)."""
        if not eligible(argv):
            return None
        server = self._server(env)
        if server is None:
            return None
        try:
            return ForkedProcess(task, server, argv, env=env, on_line=on_line, on_exit=on_exit)
        except ServerGone as err:
            _log.warning("Could not fork %s: %s; starting it as a new process.", task, err)
            return None

    def _end_an_idle_server(self) -> bool:
        """Ends the least recently used server that has no task running (or forgets a failed one); whether
        there was one. Under ``self._lock``."""
        for key, server in self._servers.items():
            if server is None or not server.alive or server.idle:
                del self._servers[key]
                if server is not None:
                    server.close()
                return True
        return False

    def close(self) -> None:
        """Ends every server (their tasks run on, watched by the engine's reaper); idempotent."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            if server is not None:
                server.close()


_shared: ForkServers | None = None
_shared_lock = threading.Lock()


def shared() -> ForkServers | None:
    """The fork servers every local engine of this process uses inside :func:`sharing`; None outside it."""
    return _shared


@contextlib.contextmanager
def sharing() -> Iterator[ForkServers]:
    """Inside the block, every local run with ``preload`` in this process forks its tasks from the same
    servers, kept between runs (at most :data:`MAX_SERVERS`, one per shared environment); they end with the
    block. Nested blocks share the outer block's servers.

    Example:
        >>> with sharing() as servers, sharing() as inner:
        ...     shared() is servers is inner
        True
    """
    global _shared
    with _shared_lock:
        outer = _shared
        servers = outer if outer is not None else ForkServers()
        _shared = servers
    try:
        yield servers
    finally:
        if outer is None:
            with _shared_lock:
                _shared = None
            servers.close()
