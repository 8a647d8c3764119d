"""One attempt of a task that runs elsewhere (a Ray actor, a Spark barrier task), seen from the driver.

A :class:`~tfdist.launch.engines._host.TaskHost` runs the program where the engine placed it; the
driver long-polls its ``read`` from a thread, so output lines and the exit code arrive as they happen.
Subclasses say how to call the host (:meth:`PolledTaskProcess._read`, ``_signal``, ``_stop``) and which
errors mean the host itself is gone.
"""

from __future__ import annotations

import abc
import logging
import threading

from tfdist.launch.output import LineSink

_log = logging.getLogger("tfdist.launch")
HOST_GONE = 1  # the exit code of an attempt whose host died or forgot it
POLL_SECONDS = 0.5  # how long one read waits at the host for output


class PolledTaskProcess(abc.ABC):
    """A :class:`~tfdist.launch.engines.base.TaskProcess` whose output a thread long-polls from its host.

    ``host_lost`` is True when the attempt ended because its host is gone (not because the program exited).
    """

    where = "host"  # how messages name the host: "Ray actor", "Spark task"

    def __init__(self, task: str, on_line: LineSink, remote_pid: int, local: bool) -> None:
        self.task, self._on_line = task, on_line
        self._remote_pid, self._pid = remote_pid, (remote_pid if local else None)
        self._code: int | None = None
        self.host_lost = False
        self._exited = threading.Event()
        self._finished = threading.Event()
        self._stop_pump = threading.Event()

    def _start_pump(self) -> None:
        threading.Thread(target=self._run_pump, name=f"tfdist-{self.task}", daemon=True).start()

    @abc.abstractmethod
    def _read(self, timeout: float, pid: int) -> tuple[list[str], int | None, bool]:
        """The host's :meth:`TaskHost.read` for this attempt."""

    @abc.abstractmethod
    def _signal(self, sig: int) -> None:
        """Delivers ``sig`` without blocking the caller."""

    @abc.abstractmethod
    def _stop(self, timeout: float) -> None:
        """The host's :meth:`TaskHost.stop` (no grace), waiting at most ``timeout`` s for it."""

    @abc.abstractmethod
    def _is_host_loss(self, err: Exception) -> bool:
        """Whether ``err``, raised by a call, means the host is gone."""

    def _done_reading(self) -> None:  # noqa: B027 - optional hook
        """Called once the pump stops."""

    @property
    def pid(self) -> int | None:
        return self._pid

    def _run_pump(self) -> None:
        try:
            while not self._stop_pump.is_set():
                lines, code, finished = self._read(POLL_SECONDS, self._remote_pid)
                for line in lines:
                    self._on_line(self.task, line)
                if code is not None and not self._exited.is_set():
                    self._code = code
                    self._exited.set()
                if finished:
                    if not self._exited.is_set():  # Only when the host no longer knows this attempt.
                        self._code = HOST_GONE
                        self._exited.set()
                    break
        except Exception as err:
            self.host_lost = self._is_host_loss(err)
            if not self._exited.is_set():
                self._on_line(self.task, f"tfdist: the {self.where} of {self.task} was lost: {err!r}")
                self._code = HOST_GONE
                self._exited.set()
        finally:
            self._done_reading()
            self._finished.set()

    def poll(self) -> int | None:
        return self._code if self._exited.is_set() else None

    def signal(self, sig: int) -> None:
        if not self._exited.is_set():
            self._signal(sig)

    def wait(self, timeout: float | None) -> int | None:
        self._exited.wait(timeout)
        return self.poll()

    def release(self, timeout: float) -> None:
        try:
            self._stop(timeout)
        except Exception as err:
            _log.debug("release %s: %s", self.task, err)
        self._finished.wait(timeout)
        self._stop_pump.set()
