"""One attempt of a task in its Ray actor, seen from the driver: exit code, signals, output long-polled."""

from __future__ import annotations

from typing import Any

from tfdist.launch.engines._polled import PolledTaskProcess
from tfdist.launch.output import LineSink

CALL_TIMEOUT = 60.0  # seconds for one call to an actor (start, read, stop)


class RayTaskProcess(PolledTaskProcess):
    """One attempt of a task inside its actor; ``host_lost`` when the actor died (RayActorError)."""

    where = "Ray actor"

    def __init__(self, ray: Any, task: str, actor: Any, on_line: LineSink, pid: int, local: bool) -> None:
        super().__init__(task, on_line, pid, local)
        self._ray, self._actor = ray, actor
        self._start_pump()

    def _read(self, timeout: float, pid: int) -> tuple[list[str], int | None, bool]:
        return self._ray.get(self._actor.read.remote(timeout, pid), timeout=CALL_TIMEOUT)

    def _signal(self, sig: int) -> None:
        self._actor.signal.remote(sig)  # Fire and forget: the supervisor must not block here.

    def _stop(self, timeout: float) -> None:
        self._ray.get(self._actor.stop.remote(0.0), timeout=timeout)

    def _is_host_loss(self, err: Exception) -> bool:
        return isinstance(err, self._ray.exceptions.RayActorError)
