"""Stops a launcher's tasks when the launcher dies, even by SIGKILL.

The launcher starts this file as a script (``python -I -S _reaper.py GRACE``) in a session of its own, so it
survives whatever killed the launcher and imports nothing but the standard library. The launcher writes
``+PGID`` on the reaper's stdin when it starts a task in process group PGID and ``-PGID`` once it has reaped
it. End of input with groups still listed means the launcher is gone: the reaper sends them SIGTERM, waits
up to GRACE seconds, then sends SIGKILL to what is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_groups(groups: set[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _main(argv: list[str]) -> int:
    grace = float(argv[1])
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+":
            groups.add(int(line[1:]))
        elif line[:1] == "-":
            groups.discard(int(line[1:]))
    groups = {pgid for pgid in groups if _alive(pgid)}
    if not groups:
        return 0
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while groups and time.monotonic() < deadline:
        time.sleep(0.05)
        groups = {pgid for pgid in groups if _alive(pgid)}
    _signal_groups(groups, signal.SIGKILL)
    return 0


class Reaper:
    """The launcher's side: one reaper process per run, told about every task's process group.

    Example:
        >>> reaper = Reaper(grace=1.0)
        >>> reaper.watch(123456789); reaper.forget(123456789); reaper.close()
    """

    def __init__(self, grace: float) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), repr(float(grace))],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):  # The reaper is gone; the launcher still reaps normally.
                pass

    def watch(self, pgid: int) -> None:
        """Kill group ``pgid`` if the launcher dies before :meth:`forget`."""
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        """Group ``pgid`` has been reaped by the launcher."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Ends the reaper (it stops any group still listed, then exits)."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
