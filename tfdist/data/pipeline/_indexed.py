"""A pipeline over a record index (``files="data.tfindex"``): the resumable order from the index's arrays.

Neither the listing nor the files' headers are read: the order maps the index's counts and byte offsets
(:mod:`tfdist.data.records.index`), so building a worker's input costs what the worker reads, not what the
data holds. Options that need the listing (class groups, the buffer order, hash or off sharding, a cache,
the tf.data service) go through the listing the index expands to (:func:`~tfdist.data.records.files.list_files`).
"""

from __future__ import annotations

from typing import Any

from tfdist.data.order.index import indexed_order
from tfdist.data.order.reader import StreamLayout, default_streams, ordered_records
from tfdist.data.pipeline import reading
from tfdist.data.pipeline._context import PipelineSlot
from tfdist.data.pipeline.state import InputState
from tfdist.data.records.index import RecordIndex, names_index, open_index

__all__: list[str] = []


def index_of(pipeline: Any) -> RecordIndex | None:
    """The record index the pipeline reads in the plain resumable order; None: not one, or other options."""
    import tensorflow as tf

    path = names_index(pipeline.files)
    plain = (
        pipeline.order != "buffer"
        and pipeline.class_weights is None
        and pipeline.data_service is None
        and pipeline.shard_policy in ("auto", "file", "data")
        and not pipeline.cache
        and tf.executing_eagerly()
    )
    return open_index(path) if path is not None and plain else None


def _order(
    pipeline: Any, index: RecordIndex, layout: StreamLayout, *, block: int, window: int, aligned: bool = False
) -> Any:
    return indexed_order(
        index,
        block=block,
        streams=layout.streams,
        window=window,
        seed=pipeline.seed or 0,
        shuffle=bool(pipeline.shuffle_buffer),
        aligned=aligned,
    )


def records(pipeline: Any, index: RecordIndex, where: PipelineSlot, state: InputState) -> tuple[Any, str]:
    """This worker's serialized records in the resumable order, as chunks (told to ``state``), and the plan text."""
    policy = "file" if pipeline.shard_policy == "auto" else pipeline.shard_policy
    total = index.num_records
    streams = pipeline.order_streams or default_streams(pipeline.batch_size, where.count, policy, records=total)
    layout = StreamLayout(
        global_batch=pipeline.batch_size, streams=streams, num_workers=where.count, worker=where.index, policy=policy
    )
    order = _order(pipeline, index, layout, block=pipeline.order_block, window=pipeline.shuffle_buffer)
    state.reading(order, layout)
    paths = index.paths
    threads = bool(pipeline.shuffle_buffer) or reading.reads_in_threads(paths, pipeline.tuning, index.local)
    dataset = ordered_records(order, layout, state.cursor, paths, compression=index.compression, threads=threads)
    text = (
        f"resumable order from the record index {index.path}: {total} records in {len(paths)} files, "
        f"{streams} streams ({policy}: {len(layout.own)} read here, {layout.per_stream} records each per step)"
    )
    return dataset, text


def claimed(pipeline: Any, index: RecordIndex, *, strategy: Any, finish: Any, state: InputState) -> tuple[Any, str]:
    """Under parameter servers: the dataset function whose workers claim global steps, reading names and byte
    offsets from the index by range (nothing of the size of the data travels in the graph but counts)."""
    from tfdist.data.order.claims import steps_per_pass
    from tfdist.data.pipeline._resumable import claimed_layout, claiming_steps

    layout, block, aligned = claimed_layout(pipeline, index.num_records)
    order = _order(pipeline, index, layout, block=block, window=0, aligned=aligned)
    paths, compression = list(index.paths), index.compression
    dataset_fn = claiming_steps(
        pipeline, order, layout, paths, compression, strategy=strategy, finish=finish, state=state, index=index
    )

    text = (
        f"claimed steps from the record index {index.path}: {order.num_records} records, "
        f"{steps_per_pass(order, pipeline.batch_size)} steps per data epoch of {layout.streams} streams"
    )
    return dataset_fn, text
