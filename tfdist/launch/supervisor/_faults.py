"""The fault injections of a run (``kills``, ``loses``, ``returns``, the faults that last and their ends): which
are due, by time or by output.

Example:
    >>> from tfdist.launch import KillAt, LoseAt
    >>> faults = FaultInjector([KillAt(task="worker:1", seconds=5), LoseAt(task="worker:2", after="^epoch 1 end$")])
    >>> faults.due(1.0)
    []
    >>> faults.on_line("worker:0", "epoch 1 end")
    >>> [(str(f.event), f.when) for f in faults.due(6.0)]
    [('worker:1@5', 'at 6.0s'), ('worker:2@after=^epoch 1 end$', 'after worker:0 printed /^epoch 1 end$/ (6.0s)')]
    >>> faults.due(7.0)
    []
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence

from tfdist.launch.events import FaultEvent


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fired:
    """An injection that is due.

    Attributes:
      event: The injection.
      when: When it fired, in words.
      at: Seconds into the run when the supervisor took it.
      seen: What ``FaultInjector``'s ``snapshot`` returned the moment it fired (the supervisor's: the epoch
        boundaries recorded by then). For a progress trigger that is as the matching line was read, not a
        supervisor pass later, so a return does not miss a boundary the training recorded in between.
    """

    event: FaultEvent
    when: str
    at: float = 0.0
    seen: frozenset[str] = frozenset()


class FaultInjector:
    """Each event fires once: a timed one when the run is that old, a triggered one after the first line
    (of any task) that its regular expression matches.

    Args:
      events: The run's events (:mod:`tfdist.launch.events`): ``kills``, ``loses``, ``returns`` and the faults
        of :class:`~tfdist.launch.faults.Faults`; more come with :meth:`add` (the end of a fault that lasts).
      snapshot: Called the moment an event fires (from a reader thread, for a progress trigger); its value
        comes back as :attr:`Fired.seen`.
    """

    def __init__(self, events: Sequence[FaultEvent], *, snapshot: Callable[[], frozenset[str]] = frozenset) -> None:
        self._timed: list[FaultEvent] = []
        self._by_line: list[FaultEvent] = []
        self._fired: queue.SimpleQueue[tuple[FaultEvent, str, frozenset[str]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._snapshot = snapshot
        for event in events:
            self.add(event)

    def add(self, event: FaultEvent) -> None:
        """One more event: a timed one fires when the run is ``event.seconds`` old, a triggered one after the
        next line that matches it."""
        with self._lock:
            if event.seconds is not None:
                self._timed.append(event)
                self._timed.sort(key=lambda e: e.seconds or 0.0)  # stable: events due together keep their order
            else:
                self._by_line.append(event)

    def on_line(self, task: str, line: str) -> None:
        """Checks one output line of ``task`` (from any task's reader thread) against the triggers left."""
        if not self._by_line:
            return
        with self._lock:
            matched = [e for e in self._by_line if e.matches(task, line)]
            if not matched:
                return
            seen = self._snapshot()
            for event in matched:
                self._by_line.remove(event)
                self._fired.put((event, task, seen))

    def due(self, elapsed: float) -> list[Fired]:
        """The events due ``elapsed`` seconds into the run, timed first, then those fired by lines in order."""
        fired = []
        while self._timed and elapsed >= (self._timed[0].seconds or 0.0):
            fired.append(Fired(event=self._timed.pop(0), when=f"at {elapsed:.1f}s", at=elapsed, seen=self._snapshot()))
        while not self._fired.empty():
            event, source, seen = self._fired.get()
            when = f"after {source} printed /{event.after}/ ({elapsed:.1f}s)"
            fired.append(Fired(event=event, when=when, at=elapsed, seen=seen))
        return fired
