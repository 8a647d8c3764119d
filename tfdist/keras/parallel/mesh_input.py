"""``fit``'s input on a DTensor mesh: each record once per epoch, each batch replica reading its own share.

The data is cut into one share per batch replica (the size of the mesh's batch axis), as a
MultiWorkerMirroredStrategy cuts it per replica. Every process builds the shares of the replicas its devices
hold, once each: processes that split a replica's model read the same share, processes along the batch axis
read disjoint ones. (``DTensorDataset`` alone gives every local replica a copy of one dataset, which reads
every record once per copy, and repeats batches when a replica spans processes.)

Step ``k``'s global batch is batch ``k`` of share 0, then of share 1, ...: a run on any mesh with the same
batch axis trains on the same batches, and :func:`replica_batches` replays them in one process.
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist import _compat
from tfdist.cluster.mesh_shape import BATCH_AXIS
from tfdist.errors import StrategyError, invalid, require_int
from tfdist.parallel.mesh import mesh_processes

__all__ = ["mesh_dataset", "replica_batches"]

_log = logging.getLogger("tfdist.keras")


def _replicas(mesh: Any, batch_axis: str) -> int:
    return mesh.dim_size(batch_axis) if batch_axis in mesh.dim_names else 1


def _dataset_fn(source: Any) -> Any:
    dataset_fn = getattr(source, "dataset_fn", None) or (source if callable(source) else None)
    if dataset_fn is None:
        raise invalid(
            StrategyError,
            "source",
            type(source).__name__,
            "a TFRecordPipeline or a dataset function on a DTensor mesh",
            "DTensor needs each batch replica's share of the data: pass the pipeline itself, or "
            "`lambda ctx: make_dataset(ctx)`. Numpy arrays and plain datasets cannot be split over a mesh.",
        )
    return dataset_fn


def _share(dataset_fn: Any, replica: int, replicas: int) -> Any:
    import tensorflow as tf

    context = tf.distribute.InputContext(
        num_input_pipelines=replicas, input_pipeline_id=replica, num_replicas_in_sync=replicas
    )
    return dataset_fn(context)


def mesh_dataset(source: Any, mesh: Any, *, batch_axis: str = BATCH_AXIS) -> Any:
    """A ``DTensorDataset`` over ``source`` for ``model.fit`` on ``mesh``.

    Args:
      source: A ``TFRecordPipeline`` (its ``batch_size`` is the global batch), or a function
        ``fn(input_context) -> tf.data.Dataset`` returning the per-replica batches of the context's share.
      mesh: The mesh from :func:`tfdist.parallel.build_mesh`.
      batch_axis: The mesh axis the batch is split along; a mesh without it feeds every device the
        whole batch.

    Raises:
      StrategyError: A source that cannot be split into shares, or batches without a static shape.
    """
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    dataset_fn = _dataset_fn(source)
    replicas = _replicas(mesh, batch_axis)
    first = _share(dataset_fn, 0, replicas)
    specs = tf.nest.flatten(first.element_spec)
    if not specs or any(s.shape.rank is None or s.shape.rank == 0 or not s.shape.is_fully_defined() for s in specs):
        raise invalid(
            StrategyError,
            "source",
            str(first.element_spec),
            "batches of a static shape (DTensor slices them by shape)",
            "Read endlessly (num_epochs=None, with steps_per_epoch in fit: every batch is full) or pass "
            "drop_remainder=True, with a batch_size divisible by the batch axis.",
        )
    per_replica = int(specs[0].shape[0])
    axis = batch_axis if batch_axis in mesh.dim_names else None

    def layout(spec: Any) -> Any:
        rank = spec.shape.rank
        return dtensor.Layout.batch_sharded(mesh, axis, rank=rank) if axis else dtensor.Layout.replicated(mesh, rank)

    unused = [first]  # The dataset read for its shapes serves one device: every other device builds its own.

    def build(replica: int) -> Any:
        return unused.pop() if replica == 0 and unused else _share(dataset_fn, replica, replicas)

    if getattr(source, "num_epochs", None) is not None and mesh_processes() > 1:
        _log.warning(
            "Mesh input from a pipeline of num_epochs=%s: reaching its end cancels DTensor's multi-client context "
            "(every later op fails with 'Function was cancelled'). Use num_epochs=None and pass steps_per_epoch "
            "to fit, or stop before the end.",
            source.num_epochs,
        )
    local = sorted({loc[axis] for loc in mesh.local_device_locations()}) if axis else [0]
    _log.info(
        "Mesh input: %d batch replica(s) of %d records (global batch %d); this process reads share(s) %s.",
        replicas,
        per_replica,
        per_replica * replicas,
        local,
    )
    return _compat.replica_dtensor_dataset(
        build,
        mesh=mesh,
        layouts=tf.nest.map_structure(layout, first.element_spec),
        global_batch_size=per_replica * replicas,
        batch_dim=axis,
    )


def replica_batches(source: Any, replicas: int) -> Any:
    """The global batches a mesh with ``replicas`` batch replicas trains on, as one plain ``tf.data.Dataset``.

    For checks and references in one process: batch ``k`` joins batch ``k`` of every share, in share order.
    """
    import tensorflow as tf

    require_int(StrategyError, "replicas", replicas, minimum=1)
    dataset_fn = _dataset_fn(source)
    shares = [_share(dataset_fn, r, replicas) for r in range(replicas)]
    if replicas == 1:
        return shares[0]
    return tf.data.Dataset.zip(tuple(shares)).map(
        lambda *parts: tf.nest.map_structure(lambda *t: tf.concat(t, axis=0), *parts)
    )
