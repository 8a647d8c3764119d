"""Reachability of a cluster's tasks: which ports accept TCP connections in time, and why the others do not.

A failed connection says different things: *refused* means the host answered but nothing listens on the port
(the task is not started yet), *timeout* or *no route* that the host or the path to it is down or filtered,
*DNS* that the name does not resolve. :func:`probe_address` and :func:`probe_reachability` tell them apart;
:func:`probe_tasks` keeps the plain yes/no.

Example:
    >>> from tfdist.cluster import ClusterSpec, probe_tasks
    >>> spec = ClusterSpec.local(workers=1)
    >>> probe_tasks(spec, timeout=0.2)  # Nothing listens there yet.
    {'worker:0': False}
    >>> probe_address(spec.tasks()[0].address, timeout=0.2, until_open=False).status
    'refused'
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import socket
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

from tfdist.cluster.address import split_address
from tfdist.cluster.spec import ClusterSpec, Task

__all__ = ["Reachability", "can_connect", "probe_address", "probe_reachability", "probe_tasks", "wait_until_reachable"]

_log = logging.getLogger("tfdist.cluster.probe")

OPEN, REFUSED, TIMEOUT, NO_ROUTE, DNS, ERROR = "open", "refused", "timeout", "no_route", "dns", "error"
_NO_ROUTE_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reachability:
    """How one address answered a TCP connection.

    Attributes:
      address: The ``host:port`` probed.
      status: 'open' (accepted), 'refused' (the host answered, the port is closed), 'timeout' (no answer),
        'no_route' (the host or its network is unreachable), 'dns' (the host name does not resolve) or
        'error' (any other socket error).
      detail: The operating system's words for the last failure ('' when open).
    """

    address: str
    status: str
    detail: str = ""

    @property
    def open(self) -> bool:
        """True when the port accepted a connection."""
        return self.status == OPEN

    @property
    def host_up(self) -> bool:
        """True when the host answered: the port is open or actively refused."""
        return self.status in (OPEN, REFUSED)

    def describe(self, timeout: float) -> str:
        """The answer in words, e.g. ``cannot resolve host 'a.invalid': DNS (Name or service not known)``."""
        host, port = split_address(self.address)
        return {
            OPEN: "listening",
            REFUSED: f"host up, port {port} not open (connection refused)",
            TIMEOUT: f"no answer within {timeout:g}s (host down, wrong address, or a firewall dropping packets)",
            NO_ROUTE: f"no route to host {host!r} ({self.detail})",
            DNS: f"cannot resolve host {host!r}: DNS ({self.detail})",
        }.get(self.status, f"cannot connect ({self.detail})")


def _attempt(host: str, port: int, timeout: float) -> tuple[str, str]:
    """One connection attempt: (status, detail)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return OPEN, ""
    except socket.gaierror as err:  # Before OSError: getaddrinfo's failure is one too.
        return DNS, err.strerror or str(err)
    except ConnectionRefusedError as err:
        return REFUSED, err.strerror or str(err)
    except TimeoutError:
        return TIMEOUT, "timed out"
    except OSError as err:
        status = NO_ROUTE if err.errno in _NO_ROUTE_ERRNOS else ERROR
        return status, err.strerror or str(err)


def probe_address(address: str, timeout: float, *, interval: float = 0.1, until_open: bool = True) -> Reachability:
    """Connects to ``address`` until it accepts or ``timeout`` seconds pass, retrying every ``interval``.

    Args:
      address: A valid ``host:port``.
      timeout: Seconds to keep trying.
      interval: Pause between attempts.
      until_open: Keep trying after a refusal; False stops at the first refusal, enough to know the host is
        up when the port is expected to be closed still.

    Returns:
      The last answer: open as soon as one attempt succeeds, else how the last attempt failed.
    """
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        status, detail = _attempt(host, port, max(0.05, min(1.0, remaining)))
        if status == OPEN or (status == REFUSED and not until_open) or time.monotonic() + interval >= deadline:
            return Reachability(address=address, status=status, detail=detail)
        time.sleep(interval)


def can_connect(address: str, timeout: float, *, interval: float = 0.1) -> bool:
    """True when ``address`` accepts a TCP connection within ``timeout`` seconds (retrying every ``interval``)."""
    return probe_address(address, timeout, interval=interval).open


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


def _peers(spec: ClusterSpec, include_self: bool) -> list[Task]:
    """Every task but the current one (unless ``include_self``) and the evaluator, which serves nothing."""
    return [
        t
        for t in spec.tasks()
        if t.type != "evaluator" and (include_self or (t.type, t.index) != (spec.task_type, spec.task_id))
    ]


def probe_reachability(
    spec: ClusterSpec, *, timeout: float, include_self: bool = False, not_yet_listening: Collection[str] = ()
) -> dict[str, Reachability]:
    """Probes every task but the current one (and the evaluator) in parallel, saying how each answered.

    Args:
      spec: The cluster.
      timeout: Seconds to keep trying each task until it accepts.
      include_self: Probe the current task too.
      not_yet_listening: Names ('worker:1') of tasks that listen only once training starts: a probe stops at
        their first refusal, which already tells that the host is up.

    Returns:
      'type:index' -> how that task answered.
    """
    tasks = _peers(spec, include_self)
    if not tasks:
        return {}

    def probe(task: Task) -> Reachability:
        return probe_address(task.address, timeout, until_open=task.name not in not_yet_listening)

    with ThreadPoolExecutor(max_workers=min(32, len(tasks))) as pool:
        return dict(zip((t.name for t in tasks), pool.map(probe, tasks)))


def probe_tasks(spec: ClusterSpec, *, timeout: float, include_self: bool = False) -> dict[str, bool]:
    """Probes every task but the current one (and the evaluator, which serves nothing).

    Returns:
      'type:index' -> reachable within ``timeout``.
    """
    found = probe_reachability(spec, timeout=timeout, include_self=include_self)
    return {name: result.open for name, result in found.items()}
