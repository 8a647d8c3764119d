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
        raise invalid(
            DataError,
            field,
            value,
            f"a setting order='resumable' supports ({why})",
            "Drop that option, or pass order='buffer' (no exact resume).",
        )
    _log.info("Input order 'buffer' (no exact resume): %s %r: %s.", field, value, why)
    return None


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
