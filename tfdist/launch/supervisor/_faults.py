"""The fault injections of a run (``kills``, ``loses``, ``returns``): which are due, by time or by output.

Example:
    >>> from tfdist.launch import KillAt, LoseAt
    >>> faults = FaultInjector([KillAt(task="worker:1", seconds=5), LoseAt(task="worker:2", after="^epoch 1 end$")])
    >>> faults.due(1.0)
    []
    >>> faults.on_line("worker:0", "epoch 1 end")
    >>> [(str(event), when) for event, when in faults.due(6.0)]
    [('worker:1@5', 'at 6.0s'), ('worker:2@after=^epoch 1 end$', 'after worker:0 printed /^epoch 1 end$/ (6.0s)')]
    >>> faults.due(7.0)
    []
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from tfdist.launch.events import KillAt


class FaultInjector:
    """Each event fires once: a timed one when the run is that old, a triggered one after the first line
    (of any task) that its regular expression matches.

    Args:
      events: The run's :class:`~tfdist.launch.events.KillAt` values (``LoseAt`` and ``ReturnAt`` included).
    """

    def __init__(self, events: Sequence[KillAt]) -> None:
        self._timed = sorted((e for e in events if e.seconds is not None), key=lambda e: e.seconds or 0.0)
        self._by_line = [e for e in events if e.after is not None]
        self._fired: queue.SimpleQueue[tuple[KillAt, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()

    def on_line(self, task: str, line: str) -> None:
        """Checks one output line of ``task`` (from any task's reader thread) against the triggers left."""
        if not self._by_line:
            return
        with self._lock:
            for event in [e for e in self._by_line if e.matches(task, line)]:
                self._by_line.remove(event)
                self._fired.put((event, task))

    def due(self, elapsed: float) -> list[tuple[KillAt, str]]:
        """The events due ``elapsed`` seconds into the run, each with when it fired (in words), timed first."""
        fired = []
        while self._timed and elapsed >= (self._timed[0].seconds or 0.0):
            fired.append((self._timed.pop(0), f"at {elapsed:.1f}s"))
        while not self._fired.empty():
            event, source = self._fired.get()
            fired.append((event, f"after {source} printed /{event.after}/ ({elapsed:.1f}s)"))
        return fired
