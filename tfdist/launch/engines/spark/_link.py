"""The driver's end of the Spark engine's wire: the desk barrier tasks phone, and one attempt of a task.

Every barrier task connects to the :class:`Desk` (its *lifeline*), says hello, gets the address it had before
(a relaunched stage), and reports its TF address and control address; the desk answers "again" when another
task holds that address, so every task's differs. The driver then calls the task's
control listener: a :class:`Channel` per purpose (the output pump long-polls on its own), so a slow read
never holds up a signal. See :mod:`tfdist.launch.engines.spark._task` for the other end.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tfdist.cluster.address import split_address
from tfdist.errors import LaunchFailure
from tfdist.launch.engines._polled import PolledTaskProcess
from tfdist.launch.output import LineSink

_log = logging.getLogger("tfdist.launch.spark")
CALL_TIMEOUT = 60.0  # seconds for one call (start, stop) to a task
BACKLOG = 256  # pending connections a listener holds (the tasks phoning the desk; the driver calling a task)


class Channel:
    """One connection to a task's control listener; calls on it are serialized."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self._address, self._authkey = address, authkey
        self._link: Connection | None = None
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Opens the connection ahead of the first call (a no-op when open; errors surface at the call)."""
        with self._lock:
            if self._link is None:
                try:
                    self._link = Client(split_address(self._address), authkey=self._authkey)
                except (OSError, EOFError, AuthenticationError) as err:
                    _log.debug("connect %s: %s", self._address, err)

    def call(self, method: str, *args: Any, timeout: float = CALL_TIMEOUT) -> Any:
        """The task's answer to ``method(*args)``; OSError/EOFError when the task is gone."""
        with self._lock:
            if self._link is None:
                self._link = Client(split_address(self._address), authkey=self._authkey)
            link = self._link
            try:
                link.send((method, args))
                if not link.poll(timeout):
                    raise TimeoutError(f"no answer to {method} within {timeout:g}s")
                status, value = link.recv()
            except BaseException:
                self._link = None
                link.close()
                raise
        if status != "ok":
            raise LaunchFailure(f"The Spark task failed to {method}: {value}")
        return value

    def close(self) -> None:
        with self._lock:
            if self._link is not None:
                self._link.close()
                self._link = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Phoned:
    """What one barrier task told the desk."""

    index: int
    host: str
    python: str
    lifeline: Connection
    address: str = ""  # the TF task's host:port
    control: str = ""  # the control listener's host:port
    missing: str = ""  # the import error, when the executor's Python lacks tfdist


class Desk:
    """Listens on the driver for the barrier tasks; keeps every task's latest :class:`Phoned`."""

    def __init__(self, host: str) -> None:
        self.authkey = secrets.token_bytes(32)
        # Every barrier task phones at once. multiprocessing's default backlog of 1 (with the key handshake done in
        # the accepting thread) let the kernel drop some of them half-open: such a task waited forever.
        self._listener = Listener((host, 0), backlog=BACKLOG, authkey=self.authkey)
        self.address: tuple[str, int] = self._listener.address
        self._cond = threading.Condition()
        self.tasks: dict[int, Phoned] = {}
        self.previous: dict[int, str] = {}  # index -> the address a task had (offered again on a relaunch)
        self.missing: list[Phoned] = []
        self._closed = False
        threading.Thread(target=self._accept, name="tfdist-spark-desk", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                link = self._listener.accept()
            except (OSError, EOFError, AuthenticationError):
                if self._closed:
                    return
                continue  # a caller without the key
            threading.Thread(target=self._hello, args=(link,), daemon=True).start()

    def _hello(self, link: Connection) -> None:
        try:
            message = link.recv()
            if message[0] == "missing":
                _, index, host, python, error = message
                with self._cond:
                    self.missing.append(Phoned(index=index, host=host, python=python, lifeline=link, missing=error))
                    self._cond.notify_all()
                return
            _, index, host, python, _pid = message
            with self._cond:
                link.send(self.previous.get(index))
            while True:
                _, _, address, control = link.recv()
                with self._cond:
                    taken = {p.address for i, p in self.tasks.items() if i != index}
                    if address not in taken:
                        old = self.tasks.get(index)
                        self.tasks[index] = Phoned(
                            index=index, host=host, python=python, lifeline=link, address=address, control=control
                        )
                        self.previous[index] = address
                        self._cond.notify_all()
                        link.send("ok")
                        break
                link.send("again")
        except (EOFError, OSError, ValueError, TypeError) as err:
            _log.debug("a Spark task's hello failed: %s", err)
            link.close()
            return
        if old is not None:
            _log.info("Spark relaunched the task of index %d on %s (%s)", index, host, address)
            old.lifeline.close()

    def wait(self, count: int, timeout: float, failed: threading.Event) -> bool:
        """Whether ``count`` tasks phoned (or one reported a missing tfdist) before ``timeout`` or ``failed``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.tasks) < count and not self.missing and not failed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
        return len(self.tasks) >= count or bool(self.missing)

    def current(self, index: int) -> Phoned:
        with self._cond:
            return self.tasks[index]

    def quit(self, grace: float) -> None:
        """Tells every task to stop its program (SIGKILL after ``grace`` s) and end; closes the desk."""
        self._closed = True
        self._listener.close()
        with self._cond:
            phoned = list(self.tasks.values()) + self.missing
        for task in phoned:
            try:
                task.lifeline.send(("quit", grace))
            except OSError:
                pass
            task.lifeline.close()


class SparkTaskProcess(PolledTaskProcess):
    """One attempt of a task in its barrier task; ``host_lost`` when the barrier task is gone (its connection
    broke)."""

    where = "Spark task"

    def __init__(self, task: str, control: str, authkey: bytes, on_line: LineSink, pid: int, local: bool) -> None:
        super().__init__(task, on_line, pid, local)
        self._reads = Channel(control, authkey)
        self._calls = Channel(control, authkey)
        self._calls.connect()  # Now, so that a signal (a fault injection, a stop) travels without a handshake.
        self._start_pump()

    def _read(self, timeout: float, pid: int) -> tuple[list[str], int | None, bool]:
        return self._reads.call("read", timeout, pid)

    def _signal(self, sig: int) -> None:  # In a thread: the supervisor must not block here.
        threading.Thread(target=self._quiet_call, args=("signal", sig), daemon=True).start()

    def _quiet_call(self, method: str, *args: Any) -> None:
        try:
            self._calls.call(method, *args)
        except Exception as err:
            _log.debug("%s %s: %s", method, self.task, err)

    def _stop(self, timeout: float) -> None:
        try:
            self._calls.call("stop", 0.0, timeout=timeout)
        finally:
            self._calls.close()

    def _is_host_loss(self, err: Exception) -> bool:
        return isinstance(err, (OSError, EOFError, TimeoutError))

    def _done_reading(self) -> None:
        self._reads.close()
