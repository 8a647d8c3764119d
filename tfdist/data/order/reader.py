"""One worker's records in the epoch order of :mod:`tfdist.data.order.plan`, from the cursor's position.

Each stream is a Python generator of windows (a few per epoch, computed by :class:`EpochOrder`) feeding a
``tf.data`` graph that opens each piece at its byte offset, orders a window and drops what was trained
already. A worker interleaves its streams ``b`` records at a time (``b = global_batch // streams``), so each
global step takes ``b`` records of every stream whatever the number of workers.

Example:
    >>> StreamLayout(global_batch=24, streams=12, num_workers=2, worker=1, policy="file").own
    (1, 3, 5, 7, 9, 11)
    >>> StreamLayout(global_batch=24, streams=12, num_workers=5, worker=0, policy="file")
    Traceback (most recent call last):
    ...
    tfdist.errors.DataError: Invalid value for `order_streams`. Received: 12. Expected a multiple of the 5 \
workers under shard_policy='file'. ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tfdist.data.order.plan import EpochOrder, stream_position
from tfdist.data.order.position import InputCursor, StreamStarts
from tfdist.errors import DataError, invalid

__all__: list[str] = []

_BUFFER = 1 << 18
_POLICIES = ("file", "data")


def default_streams(global_batch: int, num_workers: int, policy: str) -> int:
    """Streams when ``order_streams`` is not given: the most, up to 12 (or the worker count), dividing the batch.

    Under 'file' a multiple of the worker count. 12 streams serve 1, 2, 3, 4, 6 and 12 workers with
    the same order; an elastic job between other sizes names its own (``order_streams``).

    Example:
        >>> default_streams(24, 2, "file"), default_streams(24, 3, "file"), default_streams(256, 4, "file")
        (12, 12, 8)
    """
    step = num_workers if policy == "file" else 1
    fits = [k for k in range(step, max(12, num_workers) + 1, step) if global_batch % k == 0]
    if not fits:
        raise invalid(
            DataError,
            "batch_size",
            global_batch,
            f"a global batch divisible by the {num_workers} workers for resumable input",
            f"Use a multiple of {num_workers}, e.g. {max(num_workers, global_batch // num_workers * num_workers)}.",
        )
    return max(fits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamLayout:
    """How ``streams`` streams are read by worker ``worker`` of ``num_workers`` each global step.

    'file': the worker reads streams ``worker, worker + N, ...`` (each record read once over the cluster);
    'data': every worker reads every stream and keeps its slice of each step (any worker count).
    """

    global_batch: int
    streams: int
    num_workers: int
    worker: int
    policy: str

    def __post_init__(self) -> None:
        if self.policy not in _POLICIES:
            raise invalid(
                DataError,
                "shard_policy",
                self.policy,
                "'file', 'data' or 'auto' with order='resumable'",
                "'hash' and 'off' keep no global order a resume can seek in: use shard_policy='file' or 'data'.",
            )
        if self.global_batch % self.streams:
            raise invalid(
                DataError,
                "order_streams",
                self.streams,
                f"a divisor of the global batch {self.global_batch}",
                "Each step takes the same number of records from every stream.",
            )
        if self.global_batch % self.num_workers:
            raise invalid(
                DataError,
                "batch_size",
                self.global_batch,
                f"a global batch divisible by the {self.num_workers} workers with order='resumable'",
            )
        if self.policy == "file" and self.streams % self.num_workers:
            raise invalid(
                DataError,
                "order_streams",
                self.streams,
                f"a multiple of the {self.num_workers} workers under shard_policy='file'",
                "Every world size of the job must divide it (e.g. 12 for 2, 3, 4 or 6 workers), or use "
                "shard_policy='data'.",
            )

    @property
    def per_stream(self) -> int:
        """Records each stream gives a global step."""
        return self.global_batch // self.streams

    @property
    def own(self) -> tuple[int, ...]:
        """The streams this worker reads."""
        if self.policy == "data":
            return tuple(range(self.streams))
        return tuple(range(self.worker, self.streams, self.num_workers))


def _windows(order: EpochOrder, layout: StreamLayout, starts: StreamStarts, paths: Sequence[str], stream: int) -> Any:
    """The generator of stream ``stream``'s windows for one iteration, from the cursor's position."""
    import numpy as np

    start = starts.iteration(stream=stream)
    per = starts.epochs_per_iteration
    epoch, at = stream_position(order, stream, start.step * layout.per_stream, epochs_per_pass=per)
    while per is None or epoch < per:
        for window in order.windows(epoch=start.epoch + epoch, stream=stream, start=at):
            pieces = window.pieces
            yield (
                np.asarray([paths[p.file] for p in pieces], dtype=object),
                np.asarray([p.offset for p in pieces], dtype=np.int64),
                np.asarray([p.skip for p in pieces], dtype=np.int64),
                np.asarray([p.take for p in pieces], dtype=np.int64),
                np.asarray(window.order if window.order is not None else [], dtype=np.int64),
                np.int64(window.skip),
            )
        epoch, at = epoch + 1, 0


def ordered_records(
    order: EpochOrder,
    layout: StreamLayout,
    cursor: InputCursor,
    paths: Sequence[str],
    *,
    compression: str,
) -> Any:
    """This worker's serialized records in the epoch order, from ``cursor``'s position (a ``tf.data.Dataset``).

    Records come ``b`` per stream per global step: ``global_batch // num_workers`` of this worker each step.
    """
    import tensorflow as tf

    from tfdist import _compat

    signature = (
        tf.TensorSpec([None], tf.string),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([], tf.int64),
    )
    shuffled = bool(order.shuffle and order.window)
    starts = cursor.reads()

    def read_piece(path: Any, offset: Any, skip: Any, take: Any) -> Any:
        return _compat.tfrecord_reader_at(path, offset, compression, _BUFFER).skip(skip).take(take)

    def read_window(paths: Any, offsets: Any, skips: Any, takes: Any, ordering: Any, skip: Any) -> Any:
        records = tf.data.Dataset.from_tensor_slices((paths, offsets, skips, takes)).flat_map(read_piece)
        if shuffled:  # One window is one batch: reorder it, then hand out its records.
            records = records.batch(order.window).map(lambda block: tf.gather(block, ordering))
            records = _compat.unbatch_dense(records)
        return records.skip(skip)

    def stream(index: Any) -> Any:
        windows = tf.data.Dataset.from_generator(
            lambda j: _windows(order, layout, starts, paths, int(j)), args=(index,), output_signature=signature
        )
        return windows.flat_map(read_window)

    streams = tf.data.Dataset.from_tensor_slices(tf.constant(layout.own, tf.int64))
    records = streams.interleave(
        stream,
        cycle_length=len(layout.own),
        block_length=layout.per_stream,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    if layout.policy == "data":  # Every stream read here: keep this worker's slice of each step.
        share = layout.global_batch // layout.num_workers
        begin = layout.worker * share
        records = _compat.unbatch_dense(
            records.batch(layout.global_batch).map(lambda step: step[begin : begin + share])
        )
    return records
