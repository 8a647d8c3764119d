"""One attempt of a task in its Ray actor, seen from the driver: exit code, signals, output long-polled."""

from __future__ import annotations

import logging
import threading
from typing import Any

from tfdist.launch.engines.base import LineSink

_log = logging.getLogger("tfdist.launch.ray")

CALL_TIMEOUT = 60.0  # seconds for one call to an actor (start, read, stop)
_ACTOR_DIED = 1  # the exit code of an attempt whose actor died or forgot it
_POLL_SECONDS = 0.5  # how long one read waits in the actor for output


class RayTaskProcess:
    """One attempt of a task inside its actor; output is long-polled to the driver by a thread."""

    def __init__(self, ray: Any, task: str, actor: Any, on_line: LineSink, pid: int, local: bool) -> None:
        self._ray, self.task, self._actor, self._on_line = ray, task, actor, on_line
        self._remote_pid, self._pid = pid, (pid if local else None)
        self._code: int | None = None
        self.actor_died = False  # the attempt ended because its actor died (not because the program exited)
        self._exited = threading.Event()
        self._finished = threading.Event()
        self._stop_pump = threading.Event()
        self._pump = threading.Thread(target=self._run_pump, name=f"tfdist-ray-{task}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int | None:
        return self._pid

    def _run_pump(self) -> None:
        ray = self._ray
        try:
            while not self._stop_pump.is_set():
                lines, code, finished = ray.get(
                    self._actor.read.remote(_POLL_SECONDS, self._remote_pid), timeout=CALL_TIMEOUT
                )
                for line in lines:
                    self._on_line(self.task, line)
                if code is not None and not self._exited.is_set():
                    self._code = code
                    self._exited.set()
                if finished:
                    if not self._exited.is_set():  # Only when the actor no longer knows this attempt.
                        self._code = _ACTOR_DIED
                        self._exited.set()
                    break
        except Exception as err:
            self.actor_died = isinstance(err, ray.exceptions.RayActorError)
            if not self._exited.is_set():
                self._on_line(self.task, f"tfdist: the Ray actor of {self.task} was lost: {err}")
                self._code = _ACTOR_DIED
                self._exited.set()
        finally:
            self._finished.set()

    def poll(self) -> int | None:
        return self._code if self._exited.is_set() else None

    def signal(self, sig: int) -> None:
        if not self._exited.is_set():
            self._actor.signal.remote(sig)  # Fire and forget: the supervisor must not block here.

    def wait(self, timeout: float | None) -> int | None:
        self._exited.wait(timeout)
        return self.poll()

    def release(self, timeout: float) -> None:
        try:
            self._ray.get(self._actor.stop.remote(0.0), timeout=timeout)
        except Exception as err:
            _log.debug("release %s: %s", self.task, err)
        self._finished.wait(timeout)
        self._stop_pump.set()
