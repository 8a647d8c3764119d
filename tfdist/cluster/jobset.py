"""Pure-Python reading of a JobSet pod's place in its TensorFlow cluster.

tfdist's JobSet manifests (``tfdist-launch --emit jobset``) run one replicated
Job per TensorFlow job type (``chief``, ``worker``, ``ps``, ``evaluator``) with
``replicas: 1`` and ``completionMode: Indexed``, so pod ``i`` of type ``t`` has
the stable host name ``{jobset}-{t}-0-{i}.{subdomain}``. Each pod learns its
type and the JobSet's name from the JobSet labels (through the downward API,
as ``JOBSET_NAME``, ``REPLICATED_JOB_NAME``, ``JOB_INDEX``) and its index from
``JOB_COMPLETION_INDEX``, which Kubernetes sets for indexed Jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from tfdist.errors import ClusterSpecError, invalid

_ENV_VARS = ("JOBSET_NAME", "REPLICATED_JOB_NAME", "JOB_INDEX", "JOB_COMPLETION_INDEX")


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise invalid(
            ClusterSpecError,
            name,
            value,
            "a value set in a JobSet pod",
            "Run in a pod of a JobSet from 'tfdist-launch --emit jobset' (its env passes the JobSet labels "
            "in through the downward API; Kubernetes sets JOB_COMPLETION_INDEX for indexed Jobs).",
        )
    return value


def _index(env: Mapping[str, str], name: str) -> int:
    value = _need(env, name)
    if not (value.isascii() and value.isdigit()):
        raise invalid(ClusterSpecError, name, value, "a non-negative integer")
    return int(value)


def jobset_layout(
    env: Mapping[str, str], *, jobs: Mapping[str, int], port: int, subdomain: str | None = None
) -> tuple[dict[str, list[str]], str, int]:
    """Returns ``(cluster, task_type, task_id)`` for this JobSet pod.

    Example:
        >>> env = {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0",
        ...        "JOB_COMPLETION_INDEX": "1"}
        >>> jobset_layout(env, jobs={"worker": 2}, port=2222)
        ({'worker': ['rec-worker-0-0.rec:2222', 'rec-worker-0-1.rec:2222']}, 'worker', 1)
    """
    name = _need(env, "JOBSET_NAME")
    task_type = _need(env, "REPLICATED_JOB_NAME")
    if task_type not in jobs:
        raise invalid(
            ClusterSpecError,
            "REPLICATED_JOB_NAME",
            task_type,
            f"one of the jobs {sorted(jobs)}",
            "Name each replicated Job after its TensorFlow job type, as --emit jobset does.",
        )
    if _index(env, "JOB_INDEX") != 0:
        raise invalid(
            ClusterSpecError,
            "JOB_INDEX",
            env["JOB_INDEX"],
            "0: one indexed Job per TensorFlow job type",
            "Use replicas: 1 and parallelism = completions = task count, as --emit jobset does.",
        )
    task_id = _index(env, "JOB_COMPLETION_INDEX")
    if task_id >= jobs[task_type]:
        raise invalid(
            ClusterSpecError,
            "JOB_COMPLETION_INDEX",
            task_id,
            f"an index below {jobs[task_type]}, the {task_type} count",
        )
    domain = subdomain or name
    cluster = {job: [f"{name}-{job}-0-{i}.{domain}:{port}" for i in range(count)] for job, count in jobs.items()}
    return cluster, task_type, task_id
