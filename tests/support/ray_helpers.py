"""Driver-side helpers the Ray tests share (no Ray or TensorFlow import): starting and stopping
`ray start --block`, and actions started in the background from a run's callbacks."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable

# For the environment of `ray start --block`: on SIGTERM it stops its daemons at once. By default it first drains
# its node for up to 30 s (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S), and a node whose actor still runs a task
# never finishes draining: every stop of such a node would take the whole 30 s.
STOP_AT_ONCE = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def stop_ray_block(proc: subprocess.Popen) -> None:
    """Stops a `ray start --block` started with ``start_new_session=True`` (and ``STOP_AT_ONCE``): SIGTERM (it
    stops every daemon it started), then SIGKILL to its whole session after 30 s, and reaps it."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


class Background:
    """Named actions run once each on daemon threads (a run's callbacks must not block); ``events`` keeps
    their order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self._threads: list[threading.Thread] = []

    def once(self, what: str, action: Callable[[], object]) -> None:
        """Starts ``action`` in the background unless ``what`` was started before."""
        if what in self.events:
            return
        self.events.append(what)
        thread = threading.Thread(target=action, daemon=True)
        self._threads.append(thread)
        thread.start()

    def join(self, timeout: float) -> None:
        for thread in self._threads:
            thread.join(timeout)
