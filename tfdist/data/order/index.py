"""The epoch order of a listing or a record index: record counts, and byte offsets where a file can be read
from one.

Local uncompressed files of a listing are walked once per process (headers only) for the byte offset of
every ``block``-th record of the listing; compressed and remote files are read from their start and skip
to a block (their counts come from the writer's manifest, else from one full read). A record index
(:mod:`tfdist.data.records.index`) holds both already: its order maps them, and no file is listed or walked.

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tfdist.data import write_tfrecords
    >>> from tfdist.data.records.files import list_files
    >>> prefix = os.path.join(tempfile.mkdtemp(), "part")
    >>> _ = write_tfrecords([tf.train.Example() for _ in range(10)], prefix, num_shards=2)
    >>> order = epoch_order(list_files([prefix + "-*"]), block=2, streams=2, window=0, seed=0,
    ...                     shuffle=False, compression=None)
    >>> order.counts.tolist(), order.offsets[:4].tolist()  # An empty Example is a 16-byte record.
    ([5, 5], [0, 32, 64, 16])
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from tfdist.data.order.epoch import EpochOrder
from tfdist.data.records import _framing
from tfdist.data.records.files import Listing, compression_of
from tfdist.data.records.index import RecordIndex, open_index, write_index
from tfdist.errors import DataError, invalid

__all__: list[str] = []

_CACHE: dict[tuple[str, int, float, int, int], tuple[int, Any]] = {}
_ORDERS: dict[tuple[Any, ...], EpochOrder] = {}  # The last orders made: a build again gets the same object.
_KEEP_ORDERS = 8
_LOCK = threading.Lock()


def _file_index(path: str, size: int, known: int | None, compression: str, block: int, phase: int) -> tuple[int, Any]:
    """(records, byte offsets of its records ``phase``, ``phase + block``, ... or None) of one file."""
    seekable = "://" not in path and not compression
    stamp = os.stat(path).st_mtime if "://" not in path else 0.0
    key = (path, size, stamp, block if seekable else 0, phase if seekable else 0)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    if seekable:
        entry: tuple[int, Any] = _framing.block_offsets(path, block, phase)
    else:
        entry = (known if known is not None else _framing.check_file(path, compression or None).records, None)
    with _LOCK:
        _CACHE[key] = entry
    return entry


def _made(key: tuple[Any, ...], make: Any) -> EpochOrder:
    """The order of ``key``: the one made before for it, else ``make()`` (kept among the last few)."""
    with _LOCK:
        if key in _ORDERS:
            return _ORDERS[key]
    order = make()
    with _LOCK:
        order = _ORDERS.setdefault(key, order)
        while len(_ORDERS) > _KEEP_ORDERS:
            _ORDERS.pop(next(iter(_ORDERS)))
    return order


def indexed_order(
    index: RecordIndex, *, block: int, streams: int, window: int, seed: int, shuffle: bool, aligned: bool = False
) -> EpochOrder:
    """The :class:`EpochOrder` of a record index: its counts and its offsets, mapped, not copied."""
    return _made(
        ("index", id(index), block, streams, window, seed, shuffle, aligned),
        lambda: EpochOrder(
            counts=index.counts,
            block=block,
            streams=streams,
            window=window,
            seed=seed,
            shuffle=shuffle,
            offsets=None if index.compression or not len(index.offsets) else index.offsets,
            grid=index.grid,
            aligned=aligned,
        ),
    )


def epoch_order(
    listing: Listing,
    *,
    block: int,
    streams: int,
    window: int,
    seed: int,
    shuffle: bool,
    compression: str | None,
    grid: int = 0,
    aligned: bool = False,
) -> EpochOrder:
    """The :class:`EpochOrder` of every file of ``listing`` (records counted, every ``grid``-th located; 0:
    every ``block``-th; ``aligned``: streams cut at block borders)."""
    import numpy as np

    grid = grid or block
    entries, start = [], 0
    for info in listing.files:  # Each file's entry is cached (by path, size and mtime): a build again is cheap.
        kind = compression_of(info.path, compression) or ""
        entries.append(_file_index(info.path, info.size, info.records, kind, grid, (-start) % grid))
        start += entries[-1][0]
    if not start:
        raise DataError(
            f"The files of the pipeline hold no records ({len(entries)} file(s)). Check the files pattern.",
            field="files",
            value=[f.path for f in listing.files][:3],
        )

    def make() -> EpochOrder:
        offsets, at = [], 0
        for count, known in entries:
            offsets.append(known if known is not None else np.full(len(range((-at) % grid, count, grid)), -1))
            at += count
        seekable = any(known is not None for _, known in entries)
        return EpochOrder(
            counts=np.asarray([count for count, _ in entries], np.int64),
            block=block,
            streams=streams,
            window=window,
            seed=seed,
            shuffle=shuffle,
            offsets=np.concatenate(offsets).astype(np.int64) if seekable else None,
            grid=grid,
            aligned=aligned,
        )

    key = ("listing", tuple(map(id, entries)), block, streams, window, seed, shuffle, grid, aligned)
    return _made(key, make)


def build_index(
    patterns: Sequence[str], path: str, *, grid: int = 256, compression: str | None = "auto"
) -> RecordIndex:
    """Lists ``patterns``, counts every file's records and locates every ``grid``-th record, and writes
    the index to ``path``: the one walk of the record headers the workers then skip.

    Example:
        >>> import os, tempfile
        >>> import tensorflow as tf
        >>> from tfdist.data import write_tfrecords
        >>> folder = tempfile.mkdtemp()
        >>> _ = write_tfrecords([tf.train.Example() for _ in range(10)], os.path.join(folder, "part"), num_shards=2)
        >>> index = build_index([os.path.join(folder, "part-*")], os.path.join(folder, "part.tfindex"), grid=2)
        >>> index.counts.tolist(), index.offsets.tolist(), os.path.basename(index.paths[1])
        ([5, 5], [0, 32, 64, 16, 48], 'part-00001-of-00002.tfrecord')

    Local uncompressed files are walked (headers only); other files' counts come from the writer's
    manifest, else from one full read, and they are read from their start.
    """
    import numpy as np

    from tfdist.data.records.files import list_files

    if not isinstance(grid, int) or isinstance(grid, bool) or grid < 1:
        raise invalid(DataError, "grid", grid, "a positive number of records")
    listing = list_files(list(patterns))
    kinds = {compression_of(f.path, compression) or "" for f in listing.files}
    if len(kinds) > 1:
        raise invalid(DataError, "compression", sorted(kinds), "one compression for all files of an index")
    kind = kinds.pop()
    counts, pieces, start = [], [], 0
    for info in listing.files:
        if "://" not in info.path and not kind:
            count, at = _framing.block_offsets(info.path, grid, (-start) % grid)
        else:
            count = info.records if info.records is not None else _framing.check_file(info.path, kind or None).records
            at = np.full(len(range((-start) % grid, count, grid)), -1, np.int64)
        counts.append(count)
        pieces.append(at)
        start += count
    offsets = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    directory = os.path.dirname(path)
    relative = all(os.path.dirname(f.path) == directory for f in listing.files)
    names = [os.path.basename(f.path) if relative else f.path for f in listing.files]
    write_index(
        path,
        names=np.asarray([n.encode() for n in names], dtype=f"S{max(len(n.encode()) for n in names)}"),
        counts=np.asarray(counts, np.int64),
        sizes=np.asarray([f.size for f in listing.files], np.int64),
        offsets=offsets,
        grid=grid,
        compression=kind,
        relative=relative,
    )
    return open_index(path)
