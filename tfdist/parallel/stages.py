"""Pipeline stages: where each stage runs, and which consecutive layers form each stage.

A pipeline job is a chief that runs the script and S worker tasks that run tfdist's TensorFlow server
(``tfdist-launch --chief --workers S --run-on chief``). :func:`connect_stages` connects the chief to them
and returns one device per stage; :func:`split_layers` cuts a chain of layers into S consecutive groups of
balanced cost (parameter bytes, or measured times).

Example:
    >>> split_layers([10, 10, 10, 70], stages=2)
    [[0, 1, 2], [3]]
    >>> split_layers([5, 5, 5, 5], stages=2)
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tfdist.cluster.spec import ClusterSpec, current_cluster
from tfdist.errors import RuntimeFailure, StrategyError, invalid, require_int

__all__ = ["connect_stages", "split_layers"]

_log = logging.getLogger("tfdist.parallel")


def split_layers(costs: Sequence[float], *, stages: int) -> list[list[int]]:
    """Cuts layers ``0..n-1`` (in order) into ``stages`` non-empty consecutive groups minimizing the largest sum.

    Args:
      costs: Each layer's cost (parameter bytes, or measured seconds), >= 0.
      stages: Number of groups, 1 to ``len(costs)``.
    """
    require_int(StrategyError, "stages", stages, minimum=1)
    values = [float(c) for c in costs]
    if any(v < 0 or v != v for v in values):
        raise invalid(StrategyError, "costs", list(costs), "numbers >= 0, one per layer")
    if stages > len(values):
        raise invalid(
            StrategyError,
            "stages",
            stages,
            f"at most the number of layers with weights ({len(values)})",
            "Use fewer stages (workers), or a model with more layers.",
        )
    n = len(values)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    inf = float("inf")
    # best[k][i]: the smallest largest-group sum cutting layers 0..i-1 into k groups; cut[k][i]: the last start.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    groups, end = [], n
    for k in range(stages, 0, -1):
        start = cut[k][end]
        groups.append(list(range(start, end)))
        end = start
    return groups[::-1]


def connect_stages(cluster: ClusterSpec | None = None, *, device_type: str = "CPU") -> list[str]:
    """Connects this chief to the cluster's workers; returns each worker's device, one per pipeline stage.

    Args:
      cluster: The cluster (default ``TF_CONFIG``); this process must be its chief, the workers run
        TensorFlow servers (``tfdist-launch --chief --workers S --run-on chief``).
      device_type: Each worker's device a stage runs on: 'CPU' or 'GPU' (its first).

    Raises:
      StrategyError: No cluster, or this process is not the chief, or the cluster has parameter servers.
      RuntimeFailure: TensorFlow could not connect.
    """
    if device_type not in ("CPU", "GPU"):
        raise invalid(StrategyError, "device_type", device_type, "'CPU' or 'GPU'")
    spec = cluster if cluster is not None else current_cluster()
    if spec is None or spec.task_type != "chief" or not spec.num_workers or spec.num_ps:
        where = "none" if spec is None else (spec.task.name if spec.task else "no task")
        raise invalid(
            StrategyError,
            "cluster",
            where,
            "the chief of a cluster of a chief and workers (the stages), without parameter servers",
            "Launch with `tfdist-launch --chief --workers S --run-on chief -- python train.py`.",
        )
    import tensorflow as tf

    workers = sorted(spec.jobs.get("worker", {}))
    jobs = {job: [tasks[i] for i in sorted(tasks)] for job, tasks in spec.jobs.items() if job in ("chief", "worker")}
    try:
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec(jobs), job_name="chief", task_index=spec.task_id, protocol=spec.rpc_layer or "grpc"
        )
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeFailure(
            f"Could not connect the chief to the pipeline's workers: {first}. Check that every worker's "
            "TensorFlow server is up (their logs).",
            field="cluster",
            value=spec.describe(),
        ) from None
    devices = [f"/job:worker/replica:0/task:{index}/device:{device_type}:0" for index in workers]
    _log.info("pipeline stages on %s", devices)
    return devices
