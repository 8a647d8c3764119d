"""Whether a cluster can train, and with which strategy: the one rule ``build_strategy`` and ``tfdist doctor`` share.

Pure Python: the check runs before TensorFlow builds anything, so a TF_CONFIG that can never train fails with
a :class:`ClusterSpecError` naming its field instead of TensorFlow's raw ``ValueError``.

Example:
    >>> from tfdist.cluster import ClusterSpec, check_trainable
    >>> check_trainable(None).kind is None  # No TF_CONFIG: this process trains alone.
    True
    >>> spec = ClusterSpec(jobs={"worker": ["a:1", "b:1"]}, task_type="worker", task_id=1)
    >>> check_trainable(spec).kind, check_trainable(spec).role
    ('multi_worker_mirrored', 'peer')
"""

from __future__ import annotations

import dataclasses

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import ClusterSpecError, invalid

__all__ = ["Trainability", "check_trainable", "cluster_kind"]

MULTI_PROCESS_KINDS = ("multi_worker_mirrored", "parameter_server")
# What the current process does, by role.
ROLES = {
    "alone": "trains alone; no other task takes part",
    "peer": "trains with its peers: every chief/worker task calls build_strategy",
    "coordinator": "the coordinator: runs the training program, which calls build_strategy",
    "server": "runs a TensorFlow server, not the training program (tfdist-launch starts it, or "
    "tfdist.launch.run_server()); only the chief calls build_strategy",
    "evaluator": "evaluates the chief's checkpoints outside the training cluster",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trainability:
    """What :func:`check_trainable` found: the strategy the cluster gets and what this process does.

    Attributes:
      kind: The strategy: for 'auto', the one the cluster needs ('multi_worker_mirrored' or
        'parameter_server'), 'default' for the evaluator, or None when this process trains alone ('auto' then
        picks by local GPUs); otherwise the kind asked for.
      reason: Why, in words.
      role: One of :data:`ROLES`.
    """

    kind: str | None
    reason: str
    role: str

    @property
    def role_text(self) -> str:
        """The role in words."""
        return ROLES[self.role]


def cluster_kind(spec: ClusterSpec | None) -> tuple[str | None, str]:
    """The strategy a cluster needs under 'auto', and why; None when no other task takes part.

    Example:
        >>> cluster_kind(ClusterSpec(jobs={"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}))
        ('parameter_server', 'the cluster has 1 ps task(s)')
    """
    if spec is None:
        return None, "no cluster (no TF_CONFIG)"
    if spec.task_type == "evaluator":
        return "default", "the evaluator does not join the training cluster"
    return _training_kind(spec)


def _training_kind(spec: ClusterSpec) -> tuple[str | None, str]:
    """The strategy the training tasks of ``spec`` build under 'auto', whichever task this process is."""
    if spec.num_ps:
        return "parameter_server", f"the cluster has {spec.num_ps} ps task(s)"
    if spec.num_workers > 1:
        return "multi_worker_mirrored", f"the cluster has {spec.num_workers} workers and no ps"
    return None, "a single-worker cluster"


def check_trainable(spec: ClusterSpec | None, kind: str = "auto") -> Trainability:
    """Checks that ``spec`` can train with strategy ``kind`` ('auto' resolved as :func:`cluster_kind` does).

    Only the multi-process kinds read the cluster; any other kind trains this process alone. A mismatch of
    kind and cluster (parameter servers without ps tasks) is the strategy builder's error, not checked here.

    Raises:
      ClusterSpecError: The cluster has ps tasks but no chief, or several tasks but no current ``task``.
    """
    chosen, reason = cluster_kind(spec) if kind == "auto" else (kind, f"kind {kind!r} asked for")
    if spec is not None and spec.task_type == "evaluator":
        return Trainability(kind=chosen, reason=reason, role="evaluator")
    if spec is None or chosen not in MULTI_PROCESS_KINDS:
        return Trainability(kind=chosen, reason=reason, role="alone")
    if chosen == "parameter_server" and spec.num_ps and not spec.has_chief:
        raise invalid(
            ClusterSpecError,
            "cluster.chief",
            None,
            "a 'chief' task (the coordinator) in a cluster with 'ps' tasks",
            "ParameterServerStrategy runs the training program on the chief, which drives the workers and ps: "
            'add "chief": ["host:port"] to TF_CONFIG\'s cluster on every task, or launch with '
            "`tfdist-launch --chief --workers N --ps M`. Without parameter servers, drop the 'ps' job "
            "(multi_worker_mirrored).",
        )
    if spec.task is None:
        names = ", ".join(task.name for task in spec.tasks())
        raise invalid(
            ClusterSpecError,
            "task",
            None,
            f"a 'task' in TF_CONFIG naming which of the cluster's {len(spec.tasks())} task(s) ({names}) this "
            f"process is: {chosen} needs it",
            'Add "task": {"type": "worker", "index": 0} with this process\'s own type and index (tfdist-launch '
            "and cluster managers write it for each task), or unset TF_CONFIG to train in one process.",
        )
    role = "peer" if chosen == "multi_worker_mirrored" else "coordinator" if spec.task_type == "chief" else "server"
    return Trainability(kind=chosen, reason=reason, role=role)


def listening_late(spec: ClusterSpec) -> tuple[str, ...]:
    """The tasks whose port opens only once they build their strategy, so a probe before training finds it closed.

    Under multi_worker_mirrored that is every chief and worker: TensorFlow starts their servers inside the
    strategy. Under parameter_server only the chief: the worker and ps tasks run a TensorFlow server (tfdist's
    server task) before the coordinator starts, so a closed port there is a real problem. The strategy is the
    one 'auto' gives the training tasks, whichever task ``spec`` names (the evaluator's included).

    Example:
        >>> listening_late(ClusterSpec(jobs={"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}))
        ('chief:0',)
    """
    kind, _ = _training_kind(spec)
    if kind == "multi_worker_mirrored":
        return tuple(task.name for task in spec.training_tasks())
    if kind == "parameter_server":
        return tuple(task.name for task in spec.tasks() if task.type == "chief")
    return ()
