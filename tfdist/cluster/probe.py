"""Reachability of a cluster's tasks: which ports accept TCP connections in time.

Example:
    >>> from tfdist.cluster import ClusterSpec, probe_tasks
    >>> spec = ClusterSpec.local(workers=1)
    >>> probe_tasks(spec, timeout=0.2)  # Nothing listens there yet.
    {'worker:0': False}
"""

from __future__ import annotations

import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from tfdist.cluster.address import split_address
from tfdist.cluster.spec import ClusterSpec

__all__ = ["can_connect", "probe_tasks", "wait_until_reachable"]

_log = logging.getLogger("tfdist.cluster.probe")


def can_connect(address: str, timeout: float, *, interval: float = 0.1) -> bool:
    """True when ``address`` accepts a TCP connection within ``timeout`` seconds (retrying every ``interval``)."""
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(1.0, remaining))):
                return True
        except OSError:
            if time.monotonic() + interval >= deadline:
                return False
            time.sleep(interval)


def wait_until_reachable(name: str, address: str, timeout: float, *, log_every: float = 10.0) -> bool:
    """Waits for ``address`` to accept connections, logging progress; False after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if can_connect(address, min(log_every, timeout - (time.monotonic() - start)), interval=0.02):
            waited = time.monotonic() - start
            if waited > 1.0:
                _log.info("%s at %s is up after %.1fs.", name, address, waited)
            return True
        _log.warning(
            "Still waiting for %s at %s (%.0fs so far). Is that task running, with the same TF_CONFIG "
            "cluster (compare fingerprints with `tfdist doctor`)?",
            name,
            address,
            time.monotonic() - start,
        )
    return False


def probe_tasks(spec: ClusterSpec, *, timeout: float, include_self: bool = False) -> dict[str, bool]:
    """Probes every task but the current one (and the evaluator, which serves nothing).

    Returns:
      'type:index' -> reachable within ``timeout``.
    """
    tasks = [
        t
        for t in spec.tasks()
        if t.type != "evaluator" and (include_self or (t.type, t.index) != (spec.task_type, spec.task_id))
    ]
    if not tasks:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(tasks))) as pool:
        reachable = list(pool.map(lambda t: can_connect(t.address, timeout), tasks))
    return {t.name: ok for t, ok in zip(tasks, reachable)}
