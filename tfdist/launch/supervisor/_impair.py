"""Faults that last (``stragglers``, ``partitions``, ``slow_links``): started, ended and said by the supervisor.

When a :class:`~tfdist.launch.events.LastingFault` fires, the supervisor hands it to :class:`Impairments`,
which applies it and returns the event that ends it (:class:`Ends`: after ``for_seconds``, on the
``until`` line, or None to the end of the run) for the fault injector to fire in turn.

- A cut or slowed link is the engine's to change (:meth:`~tfdist.launch.engines.base.Engine.cut_link`,
  :meth:`~tfdist.launch.engines.base.Engine.shape_link`): the link of a simulated host, with every task on it.
- A straggler runs a fraction of the time: a :class:`Throttle` thread stops its process group (SIGSTOP) and
  continues it (SIGCONT) every :data:`PERIOD` seconds. That needs no privilege and no cgroup, and follows
  the task across restarts; a stopped task that is being stopped is continued within a period, so its
  SIGTERM lands, and everything is continued when the run ends.

A task that fails while links are cut may be the victim of the cut: :meth:`Impairments.blame` names the
workers an elastic run loses instead (the unreachable ones), and says so for other runs.

Example:
    >>> from tfdist.launch import PartitionAt
    >>> cut = PartitionAt(task="worker:1", after="^STEP 5$", for_seconds=20)
    >>> str(ending(cut, elapsed=3.5)), ending(PartitionAt(task="worker:1", seconds=2), elapsed=2.0)
    ('end of worker:1@after=^STEP 5$,for=20 at 23.5 s', None)
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence

from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.events import FaultEvent, LastingFault, PartitionAt, SlowLink, Straggler

PERIOD = 0.1  # seconds: a straggler runs its fraction of each
StatusSink = Callable[[str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ends(FaultEvent):
    """The end of a fault that lasts: fires ``for_seconds`` after it began (``seconds``, from launch) or on its
    ``until`` line (``after``)."""

    of: LastingFault

    def __str__(self) -> str:
        when = f"at {self.seconds:g} s" if self.seconds is not None else f"after /{self.after}/"
        return f"end of {self.of} {when}"


def ending(event: LastingFault, *, elapsed: float) -> Ends | None:
    """The event that ends ``event``, which began ``elapsed`` seconds into the run; None if it lasts to the end."""
    if event.for_seconds is not None:
        return Ends(task=event.task, seconds=elapsed + event.for_seconds, of=event)
    if event.until is not None:
        return Ends(task=event.task, after=event.until, of=event)
    return None


class Throttle:
    """Runs tasks a fraction of the time: every :data:`PERIOD` s it continues their process groups, then stops
    each once its fraction of the period has passed.

    Args:
      proc_of: The current attempt of a task (read every period: a restarted task stays a straggler).
    """

    def __init__(self, proc_of: Callable[[str], TaskProcess | None]) -> None:
        self._proc_of = proc_of
        self._shares: dict[str, float] = {}
        self._stopped: list[TaskProcess] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def set(self, task: str, fraction: float | None) -> None:
        """``task`` runs ``fraction`` of the time from the next period on; None: all the time again."""
        with self._lock:
            if fraction is None:
                self._shares.pop(task, None)
            else:
                self._shares[task] = fraction
        if fraction is not None and self._thread is None:
            self._thread = threading.Thread(target=self._cycle, name="tfdist-stragglers", daemon=True)
            self._thread.start()

    def _cycle(self) -> None:
        while not self._closed.is_set():
            start = time.monotonic()
            self._continue()
            with self._lock:
                shares = sorted(self._shares.items(), key=lambda share: share[1])
            for task, fraction in shares:
                if self._closed.wait(max(0.0, start + fraction * PERIOD - time.monotonic())):
                    break
                proc = self._proc_of(task)
                if proc is not None:
                    with self._lock:
                        self._stopped.append(proc)
                    proc.signal(signal.SIGSTOP)
            self._closed.wait(max(0.0, start + PERIOD - time.monotonic()))
        self._continue()

    def _continue(self) -> None:
        with self._lock:
            stopped, self._stopped = self._stopped, []
        for proc in stopped:
            proc.signal(signal.SIGCONT)

    def close(self) -> None:
        """Ends the cycle; every task runs again. Idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5 * PERIOD)
        self._continue()


class Impairments:
    """The faults that last of one run: applies them, ends them, and knows which links are cut.

    Args:
      config: The run (its simulated hosts say which tasks share a link).
      engine: Where the links are (:meth:`~tfdist.launch.engines.base.Engine.cut_link`).
      status: Where to say what was done and when.
      proc_of: The current attempt of a task, for the stragglers.
    """

    def __init__(
        self,
        config: LaunchConfig,
        engine: Engine,
        status: StatusSink,
        proc_of: Callable[[str], TaskProcess | None],
    ) -> None:
        self._config, self._engine, self._status = config, engine, status
        self._throttle = Throttle(proc_of)
        # (kind, where: a straggler's task, the first task of a link's host) -> (the fault, since when)
        self._active: dict[tuple[type, str], tuple[LastingFault, float]] = {}

    def _key(self, event: LastingFault) -> tuple[type, str]:
        """Where ``event`` acts: one fault of a kind at a time there (a later one replaces it)."""
        return type(event), event.task if isinstance(event, Straggler) else self.on_host_of(event.task)[0]

    def start(self, event: LastingFault, when: str, elapsed: float) -> Ends | None:
        """Applies ``event`` (fired ``when``, ``elapsed`` s into the run); returns what ends it, if anything.
        A fault of the same kind at the same place (a task, a host's link) is replaced by it."""
        self._active[self._key(event)] = (event, time.monotonic())
        if isinstance(event, Straggler):
            self._throttle.set(event.task, event.fraction)
            what = f"{event.task} runs {event.fraction:.0%} of the time (SIGSTOP/SIGCONT every {PERIOD:g} s)"
        elif isinstance(event, PartitionAt):
            address = self._engine.cut_link(event.task, True)
            what = f"{event.task}'s link cut ({self._host(event.task, address)})"
        else:
            assert isinstance(event, SlowLink)
            address = self._engine.shape_link(event.task, event.rate)
            what = f"{event.task}'s link slowed to {event.rate} ({self._host(event.task, address)})"
        self._status(f"fault injection: {what} {when}; {event.lasts()}")
        return ending(event, elapsed=elapsed)

    def end(self, end: Ends, when: str) -> bool:
        """Ends the fault of ``end``, unless a later fault of its kind replaced it; True when it ended."""
        event = end.of
        active = self._active.get(self._key(event))
        if active is None or active[0] is not event:
            return False
        del self._active[self._key(event)]
        lasted = f"after {time.monotonic() - active[1]:.1f} s ({when})"
        if isinstance(event, Straggler):
            self._throttle.set(event.task, None)
            self._status(f"fault injection: {event.task} runs all the time again {lasted}")
        elif isinstance(event, PartitionAt):
            address = self._engine.cut_link(event.task, False)
            self._status(f"fault injection: {event.task}'s link is back ({self._host(event.task, address)}) {lasted}")
        else:
            address = self._engine.shape_link(event.task, None)
            rate = self._config.network.rate_of(event.task, self._config.task_names()) or "unshaped"
            self._status(
                f"fault injection: {event.task}'s link is {rate} again ({self._host(event.task, address)}) {lasted}"
            )
        return True

    def _host(self, task: str, address: str) -> str:
        """The host of ``task`` at ``address``, and the tasks on it: 'host 10.9.0.2: worker:1, ps:0'."""
        return f"host {address}: {', '.join(self.on_host_of(task))}"

    def on_host_of(self, task: str) -> list[str]:
        """Every task on the simulated host of ``task`` (in launch order), ``task`` alone without hosts."""
        tasks, network = self._config.task_names(), self._config.network
        if not network.simulate_hosts:
            return [task]
        return [t for t in tasks if network.host_of(t, tasks) == network.host_of(task, tasks)]

    def cut_off(self) -> list[str]:
        """Every task whose host's link is cut now, in launch order."""
        cut = {
            t
            for event, _ in self._active.values()
            if isinstance(event, PartitionAt)
            for t in self.on_host_of(event.task)
        }
        return [task for task in self._config.task_names() if task in cut]

    def blame(self, failed: str, code: int, *, elastic_workers: Sequence[str]) -> tuple[str, ...]:
        """The workers an elastic run loses when ``failed`` exited with ``code`` (not 0) while links are cut: the
        cut ones of its group (``failed`` first, if cut). A peer of an unreachable task fails of the
        collective's error or of missed heartbeats: it is not at fault, the unreachable one is. Outside an
        elastic group, none; the failure is said to have come while links were cut.
        """
        cut = self.cut_off()
        lost = sorted((task for task in cut if task in elastic_workers), key=lambda task: task != failed)
        if cut and not lost:
            self._status(f"{failed} exited with {code} while the link of {', '.join(cut)} is cut")
        return tuple(lost)

    def close(self) -> None:
        """Every straggler runs again (links need nothing: they go with the hosts). Idempotent."""
        self._throttle.close()
