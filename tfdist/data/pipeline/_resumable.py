"""Whether a pipeline reads in the resumable epoch order, and its records when it does."""

from __future__ import annotations

import logging
from typing import Any

from tfdist.data.order.index import epoch_order
from tfdist.data.order.position import InputCursor
from tfdist.data.order.reader import StreamLayout, default_streams, ordered_records
from tfdist.data.pipeline import reading
from tfdist.data.pipeline._context import PipelineSlot
from tfdist.data.records.files import Listing
from tfdist.data.storage import remote
from tfdist.errors import DataError, invalid

_log = logging.getLogger("tfdist.data")


def _obstacle(pipeline: Any, *, groups: bool, listing: Listing) -> tuple[str, Any, str] | None:
    """(option, value, why) of the first option that keeps the resumable order out; None when it applies."""
    import tensorflow as tf

    if pipeline.data_service is not None:
        return "data_service", pipeline.data_service, "the tf.data service hands out its own splits"
    if groups or pipeline.class_weights is not None:
        return "class_weights", pipeline.class_weights, "stratified sampling draws its own order"
    if pipeline.shard_policy not in ("auto", "file", "data"):
        return "shard_policy", pipeline.shard_policy, "'hash' and 'off' keep no global order to seek in"
    if pipeline.cache:
        return "cache", pipeline.cache, "a cache replays one pass in its stored order"
    if not tf.executing_eagerly():
        return (
            "input_context",
            "a traced dataset function",
            "parameter-server workers build the dataset remotely; tfdist.keras.fit_input(pipeline) reads one "
            "pass per epoch there",
        )
    if any(remote.reader_for(f.path) == "boto3" for f in listing.files[:1]):
        return "files", listing.files[0].path, "s3:// objects read through boto3 are staged, not opened at an offset"
    uncounted = [f.path for f in listing.files if "://" in f.path and f.records is None]
    if uncounted:
        return "files", uncounted[0], "remote files without the writer's manifest would be read whole to count them"
    if pipeline.on_corrupt == "skip" and not listing.local:
        return "on_corrupt", "skip", "damaged remote or compressed files are cut where a reader finds the damage"
    return None


def layout_for(pipeline: Any, *, groups: bool, listing: Listing, where: PipelineSlot) -> StreamLayout | None:
    """How this worker reads the resumable order; None for the 'buffer' order.

    'auto' reads resumably where it can and logs why not; 'resumable' raises a DataError instead.
    """
    if pipeline.order == "buffer":
        return None
    obstacle = _obstacle(pipeline, groups=groups, listing=listing)
    layout = None
    if obstacle is None:
        policy = "file" if pipeline.shard_policy == "auto" else pipeline.shard_policy
        known = listing.records([f.path for f in listing.files])
        try:
            streams = pipeline.order_streams or default_streams(pipeline.batch_size, where.count, policy, records=known)
            if known is not None and streams > known:
                raise invalid(DataError, "order_streams", streams, f"at most the {known} records of the data")
            layout = StreamLayout(
                global_batch=pipeline.batch_size,
                streams=streams,
                num_workers=where.count,
                worker=where.index,
                policy=policy,
            )
        except DataError as err:
            if pipeline.order == "resumable":
                raise
            obstacle = (err.field or "order_streams", err.value, err.message)
    if obstacle is None:
        return layout
    field, value, why = obstacle
    if pipeline.order == "resumable":
        raise _refused(obstacle, "no exact resume")
    _log.info("Input order 'buffer' (no exact resume): %s %r: %s.", field, value, why)
    return None


def _refused(obstacle: tuple[str, Any, str], cost: str) -> DataError:
    """The DataError of an option that keeps the resumable order out under order='resumable'."""
    field, value, why = obstacle
    return invalid(
        DataError,
        field,
        value,
        f"a setting order='resumable' supports ({why})",
        f"Drop that option, or pass order='buffer' ({cost}).",
    )


def records(pipeline: Any, listing: Listing, layout: StreamLayout, cursor: InputCursor) -> tuple[Any, str]:
    """This worker's serialized records in the resumable order, and the plan text to log."""
    order = epoch_order(
        listing,
        block=pipeline.order_block,
        streams=layout.streams,
        window=pipeline.shuffle_buffer,
        seed=pipeline.seed or 0,
        shuffle=bool(pipeline.shuffle_buffer),
        compression=pipeline.compression,
    )
    paths = [f.path for f in listing.files]
    compression = reading.one_compression(paths, pipeline.source)
    cursor.order, cursor.layout = order, layout
    dataset = ordered_records(order, layout, cursor, paths, compression=compression)
    text = (
        f"resumable order: {order.num_records} records in {layout.streams} streams ({layout.policy}: "
        f"{len(layout.own)} read here, {layout.per_stream} records each per step)"
    )
    return dataset, text


def claimed(pipeline: Any, listing: Listing, *, strategy: Any, finish: Any) -> tuple[Any, str] | None:
    """Under parameter servers: a dataset function whose workers claim global steps (None: 'buffer' order).

    Built eagerly on the coordinator: the listing, the block table and the counter (on a ps) are made
    here, and every worker's traced dataset reads the steps it claims (:mod:`tfdist.data.order.claims`).
    """
    import tensorflow as tf

    from tfdist.data.order.claims import claimed_steps, steps_per_pass

    if pipeline.order == "buffer":
        return None
    obstacle = _obstacle(pipeline, groups=pipeline.class_weights is not None, listing=listing)
    if obstacle is not None:
        if pipeline.order == "resumable":
            raise _refused(obstacle, "then every parameter-server worker reads the whole data each epoch")
        field, value, why = obstacle
        _log.warning(
            "Input order 'buffer' under parameter servers: %s %r: %s. Every worker reads the whole data, so "
            "an epoch of steps trains some records more than once and others not at all.",
            field,
            value,
            why,
        )
        return None
    known = listing.records([f.path for f in listing.files])
    streams = pipeline.order_streams or default_streams(pipeline.batch_size, 1, "data", records=known)
    # One reader for the whole cluster: checks that the streams divide the batch, and sizes a step's share.
    layout = StreamLayout(global_batch=pipeline.batch_size, streams=streams, num_workers=1, worker=0, policy="data")
    order = epoch_order(
        listing,
        block=min(pipeline.order_block, layout.per_stream),  # A step's piece of a stream spans at most 2 blocks.
        streams=streams,
        window=0,
        seed=pipeline.seed or 0,
        shuffle=bool(pipeline.shuffle_buffer),
        compression=pipeline.compression,
    )
    paths = [f.path for f in listing.files]
    compression = reading.one_compression(paths, pipeline.source)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_claimed_steps")
    cursor = pipeline.cursor
    cursor.order, cursor.layout = order, layout
    cursor.claims = counter
    passes = pipeline.num_epochs

    def dataset_fn(input_context: Any = None) -> Any:
        del input_context  # Every worker claims from the same counter.
        return claimed_steps(
            order,
            paths,
            compression=compression,
            global_batch=pipeline.batch_size,
            counter=counter,
            passes=passes,
            finish=finish,
        )

    text = (
        f"claimed steps: {order.num_records} records, {steps_per_pass(order, pipeline.batch_size)} steps per "
        f"data epoch of {streams} streams ({layout.per_stream} record(s) of each per step); each step "
        "is claimed by the worker that runs it"
    )
    return dataset_fn, text
