"""An epoch's record order as a function of (seed, epoch, listing) alone, addressable at any position.

The records of all files, in listing order, are cut into **blocks** of ``block`` records (a block may
span the end of one file and the start of the next; only the last block of the data is shorter). Each
epoch:

1. the blocks are permuted (keyed by ``(seed, epoch)``; not under ``shuffle=False``) by a bijection
   computed block by block (:func:`~tfdist.data.order.splitmix.bijection`): the ``k``-th block of the
   epoch is found in O(1), and nothing of the size of the data is built. The last, shorter block (when
   the records are not a multiple of ``block``) stays last;
2. the permuted sequence is cut into ``streams`` contiguous **streams** of near-equal length (``n // K`` or
   one more), whatever the number of workers; or, ``aligned``, at block borders (near-equal numbers of
   blocks), so a stream's share of a step is whole blocks when blocks divide it (parameter-server steps);
3. each stream is permuted within **windows** of ``window`` records (seeded by ``(seed, epoch, stream,
   window)``).

Global step ``s`` trains on records ``[s*b, (s+1)*b)`` of every stream (``b = global_batch // streams``),
so the set of records of a step does not depend on how many workers read them: a worker reads whole
streams (``policy='file'``) or a slice of every step (``policy='data'``). A position is a number of
steps, and a stream seeks to it by opening the block it falls in (a byte offset where the file is
seekable) and re-reading at most one window. What an order holds is the files' record counts and the
byte offsets of every ``grid``-th record (arrays; memory-mapped from a record index at scale), so a
worker's cost is that of the records it reads, not of the data.

The permutations are SplitMix64 hashes (:mod:`~tfdist.data.order.splitmix`): the same numbers on every
platform and NumPy version, so a backup resumes on another machine. :data:`ORDER_VERSION` names this
definition in a backup's fingerprint: version 1 (files cut into blocks each, all blocks sorted by hash)
gives other orders for the same options.

Example:
    >>> order = EpochOrder(counts=(5, 3), block=2, streams=2, window=0, seed=1, shuffle=False)
    >>> order.stream_lengths
    (4, 4)
    >>> [list(order.stream_records(epoch=0, stream=s)) for s in range(2)]
    [[(0, 0), (0, 1), (0, 2), (0, 3)], [(0, 4), (1, 0), (1, 1), (1, 2)]]
    >>> shuffled = EpochOrder(counts=(5, 3), block=2, streams=2, window=4, seed=1)
    >>> sorted(r for s in range(2) for r in shuffled.stream_records(epoch=3, stream=s)) == sorted(
    ...     (f, i) for f, n in enumerate((5, 3)) for i in range(n))
    True
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from tfdist.data.order import splitmix
from tfdist.errors import DataError, invalid

__all__ = ["EpochOrder"]

ORDER_VERSION = 2  # The definition of the order above: a backup of another version reads other records.

CHUNK = 4096  # Records per window of an unshuffled stream (one tf.data element each).


@dataclasses.dataclass(frozen=True, kw_only=True)
class Piece:
    """A run of ``take`` records of one file from its record ``first``.

    The reader opens the file at byte ``offset`` (0: its start; a block's first record where the file can be
    read from a byte offset) and skips ``skip`` records there before taking ``take``.
    """

    file: int
    first: int
    take: int
    offset: int
    skip: int


def joined(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    """``pieces`` with each run of one file read in order as one piece (one reader goes on).

    Unshuffled blocks come in file order, so a stream's blocks of a file, cut by block or window borders,
    join up; shuffled blocks rarely do.
    """
    out: list[Piece] = []
    for piece in pieces:
        last = out[-1] if out else None
        if last is not None and last.file == piece.file and last.first + last.take == piece.first:
            out[-1] = dataclasses.replace(last, take=last.take + piece.take)
        else:
            out.append(piece)
    return tuple(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Window:
    """The records of one window of a stream: its pieces, their order, and how many were trained already.

    ``order`` (None: as read) lists, for each output position, which of the pieces' records goes there;
    ``skip`` of those are dropped (a resume inside the window).
    """

    pieces: tuple[Piece, ...]
    order: Any
    skip: int


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class EpochOrder:
    """The order of every epoch over files of ``counts`` records (see the module docstring).

    Orders compare and hash by identity (:func:`~tfdist.data.order.index.epoch_order` returns the same
    object for the same listing and options).

    Attributes:
      counts: Records per file, in listing order (a sequence or an int64 array).
      block: Records per block (the unit of the per-epoch permutation).
      streams: How many streams each epoch is cut into (fixed for a job: a backup records it).
      window: Records per shuffle window of a stream (0: no record-level shuffle).
      seed: The seed of every permutation.
      shuffle: Permute blocks and windows; False keeps the listing order.
      offsets: The byte offset, in its file, of every ``grid``-th record of the listing (int64 array, -1
        where the file is read from its start); None: every file is read from its start.
      grid: Records between two entries of ``offsets`` (0: ``block``).
      aligned: Cut the streams at block borders (stream ``j`` at block ``j * B // streams``, ``B`` the blocks
        of the data, the shorter last one included) instead of at record ``j * n // streams``, when the data
        has a block for every stream (else as without: :attr:`cut_at_blocks`).
    """

    counts: Any = dataclasses.field(repr=False)
    block: int
    streams: int
    window: int
    seed: int
    shuffle: bool = True
    offsets: Any = dataclasses.field(default=None, repr=False)
    grid: int = 0
    aligned: bool = False

    def __post_init__(self) -> None:
        import numpy as np

        if self.block < 1:
            raise invalid(DataError, "block", self.block, "at least 1 record per block")
        if self.streams < 1:
            raise invalid(DataError, "streams", self.streams, "at least 1 stream")
        counts = np.asarray(self.counts, np.int64).reshape(-1)
        starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        object.__setattr__(self, "_starts", starts)
        if self.num_records < self.streams:
            raise invalid(
                DataError,
                "streams",
                self.streams,
                f"at most the {self.num_records} records of the data",
                "Use fewer streams (order_streams), or more data.",
            )

    # ------------------------------------------------------------------ blocks
    @property
    def starts(self) -> Any:
        """Each file's first record in the listing's record numbering, and the total last (int64, files + 1)."""
        return self._starts  # type: ignore[attr-defined]

    @property
    def num_files(self) -> int:
        """Files of the listing."""
        return len(self.starts) - 1

    @property
    def num_records(self) -> int:
        """Records in one epoch."""
        return int(self.starts[-1])

    @property
    def offset_grid(self) -> int:
        """Records between two entries of ``offsets``."""
        return self.grid or self.block

    @property
    def permuted_blocks(self) -> int:
        """Blocks the permutation moves: the whole ones (a shorter last block stays last)."""
        return self.num_records // self.block

    def blocks_at(self, epoch: int, first: int, last: int) -> Any:
        """The listing's blocks at places ``[first, last)`` of ``epoch``'s sequence (int64 array)."""
        import numpy as np

        places = np.arange(first, last, dtype=np.int64)
        whole = self.permuted_blocks
        if not self.shuffle or whole <= 1:
            return places
        moved = places < whole
        places[moved] = splitmix.bijection(places[moved], whole, self.seed, epoch)
        return places

    def _piece(self, file: int, record: int, take: int) -> Piece:
        """Records ``[record, record + take)`` of the listing, all in ``file``: opened at the nearest known
        byte offset at or before the first (a grid point of this file), else at the file's start."""
        start = int(self.starts[file])
        first = record - start
        offset, skip = 0, first
        if first and self.offsets is not None:
            grid = self.offset_grid
            point = record // grid
            if point * grid >= start:
                at = int(self.offsets[point])
                if at >= 0:
                    offset, skip = at, record - point * grid
        return Piece(file=file, first=first, take=take, offset=offset, skip=skip)

    def _pieces(self, epoch: int, begin: int, end: int) -> tuple[Piece, ...]:
        """The pieces holding epoch positions ``[begin, end)`` (a run of records of one file is one piece)."""
        import numpy as np

        size, starts = self.block, self.starts
        first = begin // size
        pieces: list[Piece] = []
        for place, block in enumerate(self.blocks_at(epoch, first, (end - 1) // size + 1).tolist(), first):
            lo, hi = max(begin, place * size), min(end, (place + 1) * size)
            record, stop = block * size + lo - place * size, block * size + hi - place * size
            while record < stop:
                file = int(np.searchsorted(starts, record, side="right")) - 1
                take = min(stop, int(starts[file + 1])) - record
                pieces.append(self._piece(file, record, take))
                record += take
        return joined(pieces)

    # ----------------------------------------------------------------- streams
    @property
    def cut_at_blocks(self) -> bool:
        """Whether the streams start at block borders: ``aligned``, and a block for every stream."""
        return self.aligned and -(-self.num_records // self.block) >= self.streams

    @functools.cached_property
    def stream_bases(self) -> tuple[int, ...]:
        """Each stream's first position in an epoch's sequence of permuted blocks, and the records last.

        Example:
            >>> EpochOrder(counts=(13,), block=3, streams=2, window=0, seed=0).stream_bases
            (0, 6, 13)
            >>> EpochOrder(counts=(13,), block=3, streams=2, window=0, seed=0, aligned=True).stream_bases
            (0, 6, 13)
            >>> EpochOrder(counts=(14,), block=4, streams=3, window=0, seed=0, aligned=True).stream_bases
            (0, 4, 8, 14)
        """
        n, k = self.num_records, self.streams
        if not self.cut_at_blocks:
            return tuple(j * n // k for j in range(k + 1))
        blocks = -(-n // self.block)
        return tuple(min(n, j * blocks // k * self.block) for j in range(k + 1))

    @functools.cached_property
    def stream_lengths(self) -> tuple[int, ...]:
        """Records per stream (the same every epoch)."""
        bases = self.stream_bases
        return tuple(bases[j + 1] - bases[j] for j in range(self.streams))

    def windows(self, *, epoch: int, stream: int, start: int = 0) -> Iterator[Window]:
        """Stream ``stream`` of ``epoch`` from its record ``start``, window by window.

        With shuffling the window holding ``start`` is read whole, ordered, and its first records skipped.
        Without, the stream is read from ``start`` in chunks of :data:`CHUNK` records.
        """
        if not 0 <= stream < self.streams:
            raise invalid(DataError, "stream", stream, f"a stream index in [0, {self.streams})")
        length, base = self.stream_lengths[stream], self.stream_bases[stream]
        if not (self.shuffle and self.window):
            for begin in range(start, length, CHUNK):
                end = min(begin + CHUNK, length)
                yield Window(pieces=self._pieces(epoch, base + begin, base + end), order=None, skip=0)
            return
        first = start // self.window
        for w in range(first, (length + self.window - 1) // self.window):
            begin, end = w * self.window, min((w + 1) * self.window, length)
            yield Window(
                pieces=self._pieces(epoch, base + begin, base + end),
                order=splitmix.permutation(end - begin, self.seed, epoch, stream, w),
                skip=start - begin if w == first else 0,
            )

    def stream_records(self, *, epoch: int, stream: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """(file, record index) of stream ``stream`` of ``epoch`` from ``start``: what the reader yields."""
        for window in self.windows(epoch=epoch, stream=stream, start=start):
            records = [(p.file, i) for p in window.pieces for i in range(p.first, p.first + p.take)]
            ordered = records if window.order is None else [records[i] for i in window.order]
            yield from ordered[window.skip :]

    def fingerprint(self) -> dict[str, Any]:
        """What a backup records to check that a resume reads the same order."""
        return {
            "records": self.num_records,
            "files": self.num_files,
            "counts_key": counts_key(self.starts),
            "block": self.block,
            "streams": self.streams,
            "window": self.window,
            "seed": self.seed,
            "shuffle": self.shuffle,
            **({"aligned": True} if self.cut_at_blocks else {}),  # Absent when not: older backups match.
        }


def counts_key(starts: Any) -> int:
    """A 64-bit key of the files' record counts, in order (vectorized: O(files) NumPy, no Python loop).

    Example:
        >>> import numpy as np
        >>> counts_key(np.cumsum([0, 5, 3])) != counts_key(np.cumsum([0, 3, 5]))
        True
    """
    import numpy as np

    counts = np.diff(np.asarray(starts, np.int64)).astype(np.uint64)
    place = np.arange(1, len(counts) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        terms = splitmix.hashes(splitmix.key(len(counts)), place * np.uint64(splitmix.GOLDEN) ^ counts)
        total = int(np.add.reduce(terms, dtype=np.uint64)) if len(counts) else 0
    return splitmix.key(total, len(counts))


def stream_position(order: EpochOrder, stream: int, records: int, *, epochs_per_pass: int | None) -> tuple[int, int]:
    """(epoch within the iteration, record in that epoch) of ``stream`` after ``records`` of it were read.

    Streams run on from one epoch into the next (``epochs_per_pass`` epochs per iteration, None: endless).
    """
    length = order.stream_lengths[stream]
    epoch, at = divmod(records, length)
    if epochs_per_pass is not None and epoch >= epochs_per_pass:
        return epochs_per_pass, 0
    return epoch, at
