"""Which input pipeline this process is: from an InputContext, TF_CONFIG, or alone."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from tfdist.cluster import current_cluster
from tfdist.errors import DataError, invalid


@dataclasses.dataclass(frozen=True)
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


def slot(input_context: Optional[Any], global_batch: int) -> PipelineSlot:
    """The slot for ``input_context``, or from TF_CONFIG (chief and workers count), or one pipeline."""
    if input_context is not None:
        replicas = input_context.num_replicas_in_sync
        if global_batch % replicas:
            suggestion = max(replicas, global_batch // replicas * replicas)
            raise invalid(DataError, "batch_size", global_batch,
                          f"a global batch divisible by the {replicas} replicas in sync",
                          f"Use a multiple of {replicas}, e.g. {suggestion}.")
        return PipelineSlot(input_context.input_pipeline_id, input_context.num_input_pipelines,
                            input_context.get_per_replica_batch_size(global_batch), True)
    spec = current_cluster()
    if spec is not None:
        # Only collective clusters split input by TF_CONFIG: parameter-server workers get their share through
        # the InputContext of a dataset function, and the coordinator's own datasets (evaluation) read all.
        if spec.task_type in ("chief", "worker") and spec.num_workers > 1 and not spec.num_ps:
            # TensorFlow's multi-worker order: the chief first, then workers by index.
            order = [("chief", i) for i in spec.jobs.get("chief", {})] + [("worker", i) for i in
                                                                           spec.jobs.get("worker", {})]
            return PipelineSlot(order.index((spec.task_type, spec.task_id)), len(order), global_batch, False)
    return PipelineSlot(0, 1, global_batch, False)
