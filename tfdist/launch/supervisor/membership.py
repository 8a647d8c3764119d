"""Elastic membership: which launcher workers form the training group now, and the TF_CONFIG they get.

The launcher keeps stable task names ('worker:2' stays 'worker:2' in logs, fault injection and
``TFDIST_TASK``); each generation of the group gets a dense TF_CONFIG in which the present workers are
renumbered in order and keep their addresses. Tasks see ``TFDIST_WORLD_SIZE`` (training tasks in the group)
and ``TFDIST_MEMBERSHIP`` (the generation, 0 at launch, +1 at every change).

Epoch boundaries come from the training side (:mod:`tfdist.cluster.elastic`); a returned worker joins the group at
the next one.

Example:
    >>> from tfdist.cluster import ClusterSpec
    >>> full = ClusterSpec(jobs={"worker": ["h:1", "h:2", "h:3"]})
    >>> group = Membership(generation=1, workers=("worker:0", "worker:2"))
    >>> group.spec(full, readdress=lambda address: address).jobs["worker"][1], group.tf_task("worker:2")
    ('h:3', 'worker:1')
    >>> group.world_size(full)
    2
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tfdist.cluster.elastic import MEMBERSHIP_VAR, WORLD_SIZE_VAR
from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.launch.engines import _ports


def _on_this_machine(address: str) -> str:
    return _ports.readdress(address, _ports.HOST)


def _index(task: str) -> int:
    return int(task.rsplit(":", 1)[1])


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

    def trains(self, task: str) -> bool:
        """Whether ``task`` trains in this generation: no evaluator does, nor a worker outside the group."""
        task_type = split_task_name(task)[0]
        return task_type != "evaluator" and (task_type != "worker" or task in self.workers)

    def tf_task(self, task: str) -> str:
        """The name ``task`` has in this generation's TF_CONFIG (workers renumbered, others unchanged)."""
        if task in self.workers:
            return f"worker:{self.workers.index(task)}"
        return task

    def spec(self, full: ClusterSpec, *, readdress: Callable[[str], str] = _on_this_machine) -> ClusterSpec:
        """This generation's cluster: ``full`` with only the present workers, renumbered.

        Every task is placed at ``readdress(address)``: its address while its port can be bound (it always
        should: the group was stopped), else a new free port on the same host. The supervisor passes its
        engine's :meth:`~tfdist.launch.engines.base.Engine.readdress` (the local engine asks inside its
        private network namespace); by default only the ports of this machine's hosts are checked, and
        another machine's addresses are kept as they are.
        """
        jobs: dict[str, list[str]] = {
            job: [full.jobs[job][i] for i in sorted(full.jobs[job])] for job in full.jobs if job != "worker"
        }
        jobs["worker"] = [full.jobs["worker"][_index(task)] for task in self.workers]
        return ClusterSpec(
            jobs={job: dict(enumerate(map(readdress, addresses))) for job, addresses in jobs.items() if addresses}
        )

    def world_size(self, full: ClusterSpec) -> int:
        """Training tasks in this generation: the present workers plus the chief."""
        return len(self.workers) + len(full.jobs.get("chief", ()))


def membership_variables(membership: Membership, full: ClusterSpec) -> dict[str, str]:
    """``TFDIST_WORLD_SIZE`` and ``TFDIST_MEMBERSHIP`` for every task of ``membership``."""
    return {WORLD_SIZE_VAR: str(membership.world_size(full)), MEMBERSHIP_VAR: str(membership.generation)}
