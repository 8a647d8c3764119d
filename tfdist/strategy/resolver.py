"""TensorFlow cluster resolvers built from a :class:`ClusterSpec` or from Slurm.

Example:
    >>> from tfdist import ClusterSpec
    >>> from tfdist.strategy import cluster_resolver
    >>> resolver = cluster_resolver(ClusterSpec.local(workers=2).with_task("worker", 0))
    >>> resolver.task_type
    'worker'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tfdist.cluster.spec import ClusterSpec

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["cluster_resolver", "slurm_cluster_resolver"]


def cluster_resolver(spec: ClusterSpec) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A ``SimpleClusterResolver`` for ``spec`` and its current task.

    The evaluator is kept out of the training cluster, as TFJob and Vertex AI
    do; ``rpc_layer`` defaults to grpc (ParameterServerStrategy requires it).
    """
    import tensorflow as tf

    cluster = tf.train.ClusterSpec({job: dict(tasks) for job, tasks in spec.jobs.items() if job != "evaluator"})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster,
        task_type=spec.task_type,
        task_id=spec.task_id,
        environment=spec.environment or "",
        rpc_layer=spec.rpc_layer or "grpc",
    )


def slurm_cluster_resolver(
    *,
    jobs: Mapping[str, int] | None = None,
    port_base: int = 8888,
    gpus_per_node: int | None = None,
    gpus_per_task: int | None = None,
) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A resolver for the current Slurm step.

    On GPU nodes (``gpus_per_node`` > 0) this is TensorFlow's own
    ``SlurmClusterResolver`` with ``auto_set_gpu=False``, so the environment is
    left alone; pin devices with ``tf.config.set_visible_devices``. On CPU-only
    nodes TF's resolver cannot work (its task layout walks the GPU allocation:
    it raises for ``gpus_per_node=0``), so the spec from :meth:`ClusterSpec.from_slurm`, which lays
    tasks out the same way, is used instead.

    Args:
      jobs: Job name -> task count; default every Slurm task a worker.
      port_base: Port of the first task on each host.
      gpus_per_node: GPUs per node; None or 0 means CPU-only nodes.
      gpus_per_task: GPUs per task; default an even split.
    """
    if not gpus_per_node:
        return cluster_resolver(ClusterSpec.from_slurm(jobs=jobs, port_base=port_base))
    import tensorflow as tf

    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=dict(jobs) if jobs else None,
        port_base=port_base,
        gpus_per_node=gpus_per_node,
        gpus_per_task=gpus_per_task,
        auto_set_gpu=False,
    )
