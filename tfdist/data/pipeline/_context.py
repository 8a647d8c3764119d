"""Which input pipeline this process is: from an InputContext, a cluster spec, TF_CONFIG, or alone."""

from __future__ import annotations

import dataclasses
from typing import Any

from tfdist.cluster.spec import ClusterSpec, current_cluster
from tfdist.errors import DataError, invalid


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineSlot:
    """This pipeline's index among ``count`` pipelines, and its batch size.

    ``per_replica`` is True when the caller is ``distribute_datasets_from_function``
    (batch per replica); False when the dataset goes to ``model.fit`` directly
    and the strategy splits a global batch.
    """

    index: int
    count: int
    batch_size: int
    per_replica: bool


def slot(input_context: Any | None, global_batch: int, *, cluster: ClusterSpec | None = None) -> PipelineSlot:
    """The slot for ``input_context``; else from ``cluster``, then TF_CONFIG (chief and workers count); else alone.

    Explicit arguments win: an ``input_context`` over a ``cluster``, a
    ``cluster`` over the environment.
    """
    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
        if global_batch % replicas:
            suggestion = max(replicas, global_batch // replicas * replicas)
            raise invalid(
                DataError,
                "batch_size",
                global_batch,
                f"a global batch divisible by the {replicas} replicas in sync",
                f"Use a multiple of {replicas}, e.g. {suggestion}.",
            )
        return PipelineSlot(
            index=input_context.input_pipeline_id,
            count=input_context.num_input_pipelines,
            batch_size=input_context.get_per_replica_batch_size(global_batch),
            per_replica=True,
        )
    if cluster is not None and not isinstance(cluster, ClusterSpec):
        raise invalid(
            DataError,
            "cluster",
            type(cluster).__name__,
            "a tfdist.ClusterSpec",
            "Build one with ClusterSpec.from_tf_config(...) or tfdist.current_cluster().",
        )
    spec = cluster if cluster is not None else current_cluster()
    # Only collective clusters split input by the cluster: parameter-server workers get their share through
    # the InputContext of a dataset function, and the coordinator's own datasets (evaluation) read all.
    collective = spec is not None and spec.num_workers > 1 and not spec.num_ps
    if collective and spec is not None and spec.task_type in ("chief", "worker"):
        order = [(task.type, task.index) for task in spec.training_tasks()]  # TensorFlow's multi-worker order
        return PipelineSlot(
            index=order.index((spec.task_type, spec.task_id)),
            count=len(order),
            batch_size=global_batch,
            per_replica=False,
        )
    return PipelineSlot(index=0, count=1, batch_size=global_batch, per_replica=False)
