"""Whether the processes a test started are gone (SIGKILL and reaping are asynchronous)."""

from __future__ import annotations

import time
from collections.abc import Sequence


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # A zombie is dead, only not yet reaped.
    except (FileNotFoundError, ProcessLookupError):  # Gone before the open, or reaped between open and read.
        return False


def assert_all_gone(pids: Sequence[int | None], within: float = 5.0) -> None:
    """Every pid has died (SIGKILL delivery and reaping by init are asynchronous: allow ``within`` s)."""
    deadline = time.monotonic() + within
    running = [pid for pid in pids if pid is not None]
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if alive(pid)]
        time.sleep(0.05)
    assert not running, f"processes still running: {running}"
