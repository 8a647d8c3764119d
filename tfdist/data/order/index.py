"""The epoch order of a listing: record counts, and byte offsets where a file can be read from one.

Local uncompressed files are walked once per process (headers only) for the byte offset of each block;
compressed and remote files are read from their start and skip to a block (their counts come from the
writer's manifest, else from one full read).

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tfdist.data import write_tfrecords
    >>> from tfdist.data.records.files import list_files
    >>> prefix = os.path.join(tempfile.mkdtemp(), "part")
    >>> _ = write_tfrecords([tf.train.Example() for _ in range(10)], prefix, num_shards=2)
    >>> order = epoch_order(list_files([prefix + "-*"]), block=2, streams=2, window=0, seed=0,
    ...                     shuffle=False, compression=None)
    >>> order.counts, order.offsets[0][:2]  # An empty Example is a 16-byte record: blocks of 2 are 32 bytes.
    ((5, 5), (0, 32))
"""

from __future__ import annotations

import os
import threading

from tfdist.data.order.epoch import EpochOrder
from tfdist.data.records import _framing
from tfdist.data.records.files import Listing, compression_of
from tfdist.errors import DataError

__all__: list[str] = []

_CACHE: dict[tuple[str, int, float, int], tuple[int, tuple[int, ...] | None]] = {}
_LOCK = threading.Lock()


def _file_index(
    path: str, size: int, known: int | None, compression: str, block: int
) -> tuple[int, tuple[int, ...] | None]:
    seekable = "://" not in path and not compression
    stamp = os.stat(path).st_mtime if "://" not in path else 0.0
    key = (path, size, stamp, block if seekable else 0)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if seekable:
        count, offsets = _framing.block_offsets(path, block)
        entry: tuple[int, tuple[int, ...] | None] = (count, offsets)
    else:
        entry = (known if known is not None else _framing.check_file(path, compression or None).records, None)
    with _LOCK:
        _CACHE[key] = entry
    return entry


def epoch_order(
    listing: Listing,
    *,
    block: int,
    streams: int,
    window: int,
    seed: int,
    shuffle: bool,
    compression: str | None,
) -> EpochOrder:
    """The :class:`EpochOrder` of every file of ``listing`` (records counted, blocks located)."""
    counts, offsets = [], []
    for info in listing.files:
        kind = compression_of(info.path, compression) or ""
        count, at = _file_index(info.path, info.size, info.records, kind, block)
        counts.append(count)
        offsets.append(at)
    if not sum(counts):
        raise DataError(
            f"The files of the pipeline hold no records ({len(counts)} file(s)). Check the files pattern.",
            field="files",
            value=[f.path for f in listing.files][:3],
        )
    return EpochOrder(
        counts=tuple(counts),
        block=block,
        streams=streams,
        window=window,
        seed=seed,
        shuffle=shuffle,
        offsets=tuple(offsets),
    )
