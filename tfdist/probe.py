"""Reachability of a cluster's tasks: which ports accept TCP connections in time.

Example:
    >>> from tfdist import ClusterSpec
    >>> from tfdist.probe import probe_tasks
    >>> spec = ClusterSpec.local(workers=1)
    >>> probe_tasks(spec, timeout=0.2)  # Nothing listens there yet.
    {'worker:0': False}
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

from tfdist._address import split_address
from tfdist.cluster import ClusterSpec

__all__ = ["probe_tasks", "can_connect"]


def can_connect(address: str, timeout: float) -> bool:
    """True when ``address`` accepts a TCP connection within ``timeout`` seconds (retrying)."""
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(1.0, remaining))):
                return True
        except OSError:
            if time.monotonic() + 0.1 >= deadline:
                return False
            time.sleep(0.1)


def probe_tasks(spec: ClusterSpec, *, timeout: float, include_self: bool = False) -> dict[str, bool]:
    """Probes every task but the current one (and the evaluator, which serves nothing).

    Returns:
      'type:index' -> reachable within ``timeout``.
    """
    tasks = [t for t in spec.tasks() if t.type != "evaluator"
             and (include_self or (t.type, t.index) != (spec.task_type, spec.task_id))]
    if not tasks:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(tasks))) as pool:
        reachable = list(pool.map(lambda t: can_connect(t.address, timeout), tasks))
    return {t.name: ok for t, ok in zip(tasks, reachable)}
