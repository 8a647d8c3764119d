"""The rules of an elastic run (``min_workers``): who leaves with a lost worker, whether enough are left, who
joins when, and what a membership change restarts.

:class:`ElasticRules` decides and never acts: the supervisor passes the state a rule needs and applies the
:class:`Regroup` it gets back (stopping and starting tasks, updating its
:class:`~tfdist.launch.supervisor._group.Group`).

Example:
    >>> from tfdist import ClusterSpec
    >>> from tfdist.launch import LaunchConfig
    >>> from tfdist.launch.supervisor.membership import Membership
    >>> rules = ElasticRules(LaunchConfig(command=("python",), workers=3, min_workers=2))
    >>> now = Membership(generation=0, workers=("worker:0", "worker:1", "worker:2"))
    >>> left = rules.remaining(now, ["worker:1"])
    >>> left, rules.enough(left), rules.enough(left[:1])
    (('worker:0', 'worker:2'), True, False)
    >>> full = ClusterSpec(jobs={"worker": ["h:1", "h:2", "h:3"]})
    >>> change = rules.regroup(now, left, full, "worker:1 lost")
    >>> change.message
    'elastic: membership 1: world size 2 (workers worker:0, worker:2); worker:1 lost'
    >>> change.stop, change.start, change.new_spec
    (('worker:0', 'worker:1', 'worker:2'), ('worker:0', 'worker:2'), True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.launch.config import LaunchConfig
from tfdist.launch.supervisor.membership import Membership


@dataclasses.dataclass(frozen=True, kw_only=True)
class Regroup:
    """A new generation of the training group, for the supervisor to apply in this order.

    Attributes:
      membership: The new generation.
      message: The status line that announces it.
      stop: Tasks to stop first (SIGKILL, no grace).
      new_spec: Whether the cluster is drawn again from the new membership (collectives) once they stopped;
        a parameter-server cluster stays as it is (the coordinator knows every worker).
      start: Tasks to start, in order (TF servers first), each as one more restart.
      joined: The returned workers this change takes in.
    """

    membership: Membership
    message: str
    stop: tuple[str, ...]
    new_spec: bool
    start: tuple[str, ...]
    joined: tuple[str, ...] = ()


class ElasticRules:
    """The membership rules of one elastic run; see the module docstring.

    Args:
      config: The run; its ``mode``, ``min_workers``, ``max_workers`` and tasks are read once.
    """

    def __init__(self, config: LaunchConfig) -> None:
        self._parameter_server = config.mode == "parameter_server"
        self.minimum = config.min_workers or 0
        self._maximum = config.max_workers or config.workers
        self._tasks = tuple(config.task_names())
        self._runs_command = config.runs_command

    @property
    def rejoins_at_once(self) -> bool:
        """Whether a returned worker joins as soon as it is back (parameter servers: the coordinator
        reconnects) instead of at the next epoch boundary (collectives)."""
        return self._parameter_server

    def leaving(self, task: str, also: Sequence[str], membership: Membership) -> tuple[str, ...]:
        """The workers that leave when ``task`` is lost with ``also`` (workers of the same node)."""
        return (task,) + tuple(t for t in also if t != task and t in membership.workers)

    def remaining(self, membership: Membership, leaving: Sequence[str]) -> tuple[str, ...]:
        """The workers of ``membership`` left once ``leaving`` are gone."""
        return tuple(w for w in membership.workers if w not in leaving)

    def enough(self, workers: Sequence[str]) -> bool:
        """Whether the group may train on with ``workers`` (at least ``min_workers``)."""
        return len(workers) >= self.minimum

    def joining(self, membership: Membership, available: Sequence[str]) -> tuple[str, ...]:
        """The returned workers of ``available`` that join now: as many as ``max_workers`` has room for."""
        room = max(self._maximum - len(membership.workers), 0)
        return tuple(available[:room])

    def placed_again(self, full: ClusterSpec, task: str, address: str) -> ClusterSpec | None:
        """``full`` with ``task`` at ``address`` (its engine placed it again there); None when the run cannot
        follow the move: a parameter-server coordinator only knows the addresses it started with."""
        job, index = split_task_name(task)
        if self._parameter_server and full.jobs[job][index] != address:
            return None
        jobs = {name: dict(addresses) for name, addresses in full.jobs.items()}
        jobs[job][index] = address
        return ClusterSpec(jobs=jobs)

    def regroup(
        self, membership: Membership, workers: Sequence[str], full: ClusterSpec, why: str, joined: Sequence[str] = ()
    ) -> Regroup:
        """The change from ``membership`` to a new generation of ``workers``; ``why`` ends its message.

        Collectives restart the whole training group with a new TF_CONFIG: every old attempt (but the
        evaluator's) is stopped first, exited ones included, so none of their readers outlives it. A
        parameter-server run goes on: only the workers new to the group start.
        """
        new = Membership(generation=membership.generation + 1, workers=tuple(workers))
        message = (
            f"elastic: membership {new.generation}: world size {new.world_size(full)} "
            f"(workers {', '.join(new.workers)}); {why}"
        )
        if self._parameter_server:
            return Regroup(
                membership=new,
                message=message,
                stop=(),
                new_spec=False,
                joined=tuple(joined),
                start=tuple(w for w in new.workers if w not in membership.workers),
            )
        # SIGKILL, no grace: the backup of the last epoch is written, and TF's preemption handler would
        # catch a SIGTERM and let the old group train on (even to the end of fit, deleting the backup).
        stop = tuple(t for t in self._tasks if split_task_name(t)[0] != "evaluator")
        group = [t for t in self._tasks if new.trains(t)]
        return Regroup(
            membership=new,
            message=message,
            stop=stop,
            new_spec=True,
            joined=tuple(joined),
            start=tuple(sorted(group, key=self._runs_command)),
        )
