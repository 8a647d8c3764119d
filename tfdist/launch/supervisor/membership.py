"""Elastic membership: which launcher workers form the training group now, and the TF_CONFIG they get.

The launcher keeps stable task names ('worker:2' stays 'worker:2' in logs, fault injection and
``TFDIST_TASK``); each generation of the group gets a dense TF_CONFIG in which the present workers are
renumbered in order and keep their addresses. Tasks see ``TFDIST_WORLD_SIZE`` (training tasks in the group)
and ``TFDIST_MEMBERSHIP`` (the generation, 0 at launch, +1 at every change).

Epoch boundaries come from the training side (:mod:`tfdist.cluster.elastic`); a returned worker joins the group at
the next one.

Example:
    >>> from tfdist.cluster.spec import ClusterSpec
    >>> full = ClusterSpec(jobs={"worker": ["h:1", "h:2", "h:3"]})
    >>> group = Membership(generation=1, workers=("worker:0", "worker:2"))
    >>> group.spec(full, free=lambda address: True).jobs["worker"][1], group.tf_task("worker:2")
    ('h:3', 'worker:1')
    >>> group.world_size(full)
    2
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Callable

from tfdist.cluster import address as _address
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, LaunchFailure
from tfdist.cluster.elastic import MEMBERSHIP_VAR, WORLD_SIZE_VAR

__all__ = ["Membership", "membership_variables"]

_log = logging.getLogger("tfdist.launch")


def _index(task: str) -> int:
    return int(task.rsplit(":", 1)[1])


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, or an address a socket can bind here)."""
    if _address.is_loopback(host):
        return True
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
    except (OSError, UnicodeError):  # another machine, or a name this machine cannot resolve
        return False
    return True


def _address_free(address: str) -> bool:
    """True when ``address`` can be kept: its port is free here, or its host is another machine (not checked)."""
    host, port = _address.split_address(address)
    return not _is_local(host) or _address.port_is_free(host, port)


def _new_address(address: str) -> str:
    """``address`` with a free port on its host; ``address`` itself when none can be picked (logged)."""
    host = _address.split_address(address)[0]
    try:
        return _address.join_address(host, _address.free_ports(1, host)[0])
    except (LaunchError, LaunchFailure) as err:  # never a bad-input error in the middle of a run
        _log.warning("Could not pick a new port on %s (%s); keeping %s.", host, err, address)
        return address


@dataclasses.dataclass(frozen=True, kw_only=True)
class Membership:
    """One generation of the training group.

    Args:
      generation: 0 at launch, +1 at every membership change.
      workers: The present workers' launcher names, in launch order.
    """

    generation: int
    workers: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(sorted(self.workers, key=lambda t: _index(t))))

    def tf_task(self, task: str) -> str:
        """The name ``task`` has in this generation's TF_CONFIG (workers renumbered, others unchanged)."""
        if task in self.workers:
            return f"worker:{self.workers.index(task)}"
        return task

    def spec(self, full: ClusterSpec, *, free: Callable[[str], bool] = _address_free) -> ClusterSpec:
        """This generation's cluster: ``full`` with only the present workers, renumbered.

        Every task keeps its address while ``free(address)`` says its port can be bound (it always should:
        the group was stopped); otherwise it gets a new free port on the same host. By default only the ports
        of this machine's hosts are checked; another machine's addresses are kept as they are.
        """
        jobs: dict[str, list[str]] = {job: [full.jobs[job][i] for i in sorted(full.jobs[job])]
                                      for job in full.jobs if job != "worker"}
        jobs["worker"] = [full.jobs["worker"][_index(task)] for task in self.workers]
        for job, addresses in jobs.items():
            for i, address in enumerate(addresses):
                if not free(address):
                    addresses[i] = _new_address(address)
        return ClusterSpec(jobs={job: addresses for job, addresses in jobs.items() if addresses})

    def world_size(self, full: ClusterSpec) -> int:
        """Training tasks in this generation: the present workers plus the chief."""
        return len(self.workers) + len(full.jobs.get("chief", ()))


def membership_variables(membership: Membership, full: ClusterSpec) -> dict[str, str]:
    """``TFDIST_WORLD_SIZE`` and ``TFDIST_MEMBERSHIP`` for every task of ``membership``."""
    return {WORLD_SIZE_VAR: str(membership.world_size(full)), MEMBERSHIP_VAR: str(membership.generation)}
