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
        return "input_context", "a traced dataset function", "parameter-server workers build the dataset remotely"
    if any(remote.reader_for(f.path) == "boto3" for f in listing.files[:1]):
        return "files", listing.files[0].path, "s3:// objects read through boto3 are staged, not opened at an offset"
    uncounted = [f.path for f in listing.files if "://" in f.path and f.records is None]
    if uncounted:
        return "files", uncounted[0], "remote files without the writer's manifest would be read whole to count them"
    if pipeline.on_corrupt == "skip" and not listing.local:
        return "on_corrupt", "skip", "damaged remote or compressed files are cut where a reader finds the damage"
    return None


def _streams(pipeline: Any, where: PipelineSlot, policy: str, records: int) -> int | str:
    """The stream count, or why none fits (under order='auto' the pipeline then reads in the 'buffer' order)."""
    if pipeline.order_streams is not None:
        return int(pipeline.order_streams)
    try:
        streams = default_streams(pipeline.batch_size, where.count, policy)
    except DataError as err:
        return err.message
    while streams > records and streams > where.count:  # Tiny data: fewer streams, still a multiple of the workers.
        streams -= where.count if policy == "file" else 1
        while pipeline.batch_size % streams:
            streams -= where.count if policy == "file" else 1
    return streams if streams <= records else f"{records} record(s) are fewer than the {where.count} workers"


def applies(pipeline: Any, *, groups: bool, listing: Listing, where: PipelineSlot) -> bool:
    """Whether ``pipeline`` reads in the resumable order ('auto': where it can; 'resumable': or a DataError)."""
    if pipeline.order == "buffer":
        return False
    obstacle = _obstacle(pipeline, groups=groups, listing=listing)
    if obstacle is None and pipeline.order == "auto":
        policy = "file" if pipeline.shard_policy == "auto" else pipeline.shard_policy
        known = listing.records([f.path for f in listing.files])
        streams = _streams(pipeline, where, policy, known if known is not None else pipeline.batch_size)
        if isinstance(streams, str):
            obstacle = ("batch_size", pipeline.batch_size, streams)
        else:
            try:
                StreamLayout(
                    global_batch=pipeline.batch_size,
                    streams=streams,
                    num_workers=where.count,
                    worker=where.index,
                    policy=policy,
                )
            except DataError as err:
                obstacle = (err.field or "order_streams", err.value, err.message)
    if obstacle is None:
        return True
    if pipeline.order == "resumable":
        field, value, why = obstacle
        raise invalid(
            DataError,
            field,
            value,
            f"a setting order='resumable' supports ({why})",
            "Drop that option, or pass order='buffer' (no exact resume).",
        )
    _log.info("Input order 'buffer' (no exact resume): %s %r: %s.", obstacle[0], obstacle[1], obstacle[2])
    return False


def records(pipeline: Any, listing: Listing, where: PipelineSlot, cursor: InputCursor) -> tuple[Any, str]:
    """This worker's serialized records in the resumable order, and the plan text to log."""
    count = where.count
    policy = "file" if pipeline.shard_policy == "auto" else pipeline.shard_policy
    global_batch = pipeline.batch_size
    known = listing.records([f.path for f in listing.files])
    chosen = _streams(pipeline, where, policy, known if known is not None else global_batch)
    streams = chosen if isinstance(chosen, int) else default_streams(global_batch, count, policy)
    layout = StreamLayout(
        global_batch=global_batch, streams=streams, num_workers=count, worker=where.index, policy=policy
    )
    shuffle = bool(pipeline.shuffle_buffer)
    order = epoch_order(
        listing,
        block=pipeline.order_block,
        streams=streams,
        window=pipeline.shuffle_buffer,
        seed=pipeline.seed or 0,
        shuffle=shuffle,
        compression=pipeline.compression,
    )
    paths = [f.path for f in listing.files]
    compression = reading.one_compression(paths, pipeline.source)
    cursor.order, cursor.layout = order, layout
    dataset = ordered_records(order, layout, cursor, paths, compression=compression)
    text = (
        f"resumable order: {order.num_records} records in {streams} streams ({policy}: "
        f"{len(layout.own)} read here, {layout.per_stream} records each per step)"
    )
    return dataset, text
