"""The host of one task where an engine placed it (a Ray actor, a Spark barrier task): it runs the task's program.

The host never imports TensorFlow. It picks the task's port on its own node, runs the program as a subprocess
(in its own session, so signals reach grandchildren too), keeps its output lines for the driver to fetch, and
reports the exit code. A child is also tied to the host's life: it gets SIGKILL if the host process dies
(Linux parent-death signal).

The class is plain Python, so that it can be tested without Ray or Spark: the Ray engine
(:mod:`tfdist.launch.engines.ray.engine`) wraps it with ``ray.remote``, a Spark barrier task
(:mod:`tfdist.launch.engines.spark._task`) serves its calls to the driver.

Example:
    >>> import sys
    >>> host = TaskHost("worker:0")
    >>> pid = host.start([sys.executable, "-c", "import sys; sys.stdout.write('hi' + chr(10))"], {"PATH": ""})
    >>> lines, finished = [], False
    >>> while not finished:
    ...     batch, code, finished = host.read(10.0)
    ...     lines += batch
    >>> lines, code
    (['hi'], 0)
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO

from tfdist.cluster.address import free_ports, join_address
from tfdist.launch.output import pump_lines
from tfdist.runtime import exit_codes

_PR_SET_PDEATHSIG = 1
_MAX_BATCH = 2000


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class TaskHost:
    """One task's program on this node: start, stream, signal, stop.

    Thread-safe: the driver long-polls :meth:`read` while it may call
    :meth:`signal` or :meth:`stop` at the same time (the Ray actor runs with
    several threads).
    """

    def __init__(self, task: str) -> None:
        self.task = task
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self._drained = threading.Event()
        self._code_reported = False

    def address(self, host: str | None = None) -> tuple[str, str]:
        """('host:port', node id) for this task: this node's address (Ray's view unless ``host``), a free port."""
        node_ip, node_id = _node()
        host = host or node_ip
        return join_address(host, free_ports(1, host)[0]), node_id

    def start(self, argv: Sequence[str], env: dict[str, str], cwd: str | None = None) -> int:
        """Starts (or restarts) the program in ``cwd`` (default: this process's); returns its pid.

        Node-local GPU visibility is kept.
        """
        self.stop(0.0)
        env = dict(env)
        if "CUDA_VISIBLE_DEVICES" in os.environ:  # Ray set it for this actor's GPUs; the driver's value is wrong here.
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        self._drained.clear()
        with self._cond:
            self._lines.clear()
            self._code_reported = False
        started: list[subprocess.Popen[bytes]] = []
        spawned = threading.Event()
        failure: list[BaseException] = []

        def _spawn_and_pump() -> None:
            # The parent-death signal fires when the *thread* that forked exits, so the thread that starts the
            # program is the one that reads its output to the end: it outlives the program.
            try:
                started.append(
                    subprocess.Popen(
                        list(argv),
                        env=env,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,  # Its own pipe: a line is never cut by the other stream.
                        start_new_session=True,
                        preexec_fn=_die_with_parent,
                    )
                )
            except BaseException as err:
                failure.append(err)
                self._drained.set()
                return
            finally:
                spawned.set()
            self._pump([started[0].stdout, started[0].stderr])
            started[0].wait()

        threading.Thread(target=_spawn_and_pump, name=f"tfdist-{self.task}", daemon=True).start()
        spawned.wait()
        if failure:
            raise failure[0]
        self._proc = started[0]
        return self._proc.pid

    def _pump(self, streams: list[IO[bytes] | None]) -> None:
        def _add(line: str) -> None:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

        try:
            pump_lines(streams, _add)  # Split as the local engine does, a lone '\r' included.
        finally:
            self._drained.set()
            with self._cond:
                self._cond.notify_all()

    def _code(self) -> int | None:
        if self._proc is None or self._proc.poll() is None:
            return None
        return exit_codes.from_returncode(self._proc.returncode)

    def read(self, timeout: float, pid: int | None = None) -> tuple[list[str], int | None, bool]:
        """New output lines, the exit code once the program ended, and whether nothing more will come.

        Waits up to ``timeout`` seconds for something new to report (a long poll). The exit code comes as
        soon as the program ends; lines still in flight (a grandchild may hold the pipe) follow until
        ``finished``. With ``pid``, a reader of an earlier attempt gets nothing of a restarted program.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            if pid is not None and (self._proc is None or self._proc.pid != pid):
                return [], None, True
            while not self._lines and not self._drained.is_set() and self._proc is not None:
                if self._proc.poll() is not None and not self._code_reported:
                    break  # Report the exit now, even if a grandchild still holds the output pipe.
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.2))
            batch = [self._lines.popleft() for _ in range(min(len(self._lines), _MAX_BATCH))]
            code = self._code()
            self._code_reported = code is not None
            finished = code is not None and self._drained.is_set() and not self._lines
        return batch, code, finished

    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the program's whole process group."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, grace: float) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; reaps the program and its process group."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._drained.wait(5)
        return exit_codes.from_returncode(proc.returncode)


def _node() -> tuple[str, str]:
    """This node's address and id as Ray sees them inside a Ray actor; elsewhere the host name's address, no id."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address()), str(ray.get_runtime_context().get_node_id())
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname()), ""
