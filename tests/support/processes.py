"""Whether the processes a test started are gone (SIGKILL and reaping are asynchronous), and whether one of
them is what answers on a port (another test session may listen on the same port number)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from tfdist.cluster.probe import can_connect


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


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (its parents followed up through ``/proc``)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # Gone meanwhile.
            return False
    return False


def listeners(port: int) -> set[int]:
    """The processes that hold a TCP socket listening on ``port`` in this process's network namespace."""
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    holders = set()
    for entry in filter(str.isdigit, os.listdir("/proc") if inodes else []):
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                holders.add(int(entry))
        except OSError:  # Gone, or not ours to read.
            continue
    return holders


def reaches_own_process(address: str, timeout: float = 0.5) -> bool:
    """Whether connecting to ``address`` ('host:port') from here reaches a process this one started.

    A bare connect can reach another program that listens on the same port number (another test session's
    task, with pytest-xdist): isolation is broken only if the listener is one of ours.
    """
    return can_connect(address, timeout=timeout) and any(
        descends_from(pid, os.getpid()) for pid in listeners(int(address.rsplit(":", 1)[1]))
    )
