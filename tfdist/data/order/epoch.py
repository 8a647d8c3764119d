"""An epoch's record order as a function of (seed, epoch, listing) alone, addressable at any position.

The records are cut into **blocks** (runs of ``block`` records of one file). Each epoch:

1. the blocks are permuted (seeded by ``(seed, epoch)``; not under ``shuffle=False``);
2. the permuted sequence is cut into ``streams`` contiguous **streams** of near-equal length (``n // K`` or
   one more), whatever the number of workers;
3. each stream is permuted within **windows** of ``window`` records (seeded by ``(seed, epoch, stream,
   window)``).

Global step ``s`` trains on records ``[s*b, (s+1)*b)`` of every stream (``b = global_batch // streams``),
so the set of records of a step does not depend on how many workers read them: a worker reads whole
streams (``policy='file'``) or a slice of every step (``policy='data'``). A position is a number of
steps, and a stream seeks to it by opening the block it falls in (a byte offset where the file is
seekable) and re-reading at most one window.

The permutations are :func:`~tfdist.data.order.splitmix.permutation` of the keys (a SplitMix64 hash,
sorted): the same numbers on every platform and NumPy version, so a backup resumes on another machine.

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochOrder:
    """The order of every epoch over files of ``counts`` records (see the module docstring).

    Attributes:
      counts: Records per file, in listing order.
      block: Records per block (the unit of the per-epoch permutation).
      streams: How many streams each epoch is cut into (fixed for a job: a backup records it).
      window: Records per shuffle window of a stream (0: no record-level shuffle).
      seed: The seed of every permutation.
      shuffle: Permute blocks and windows; False keeps the listing order.
      offsets: Per file, the byte offset of each block's first record (None for a file read from its start).
    """

    counts: tuple[int, ...]
    block: int
    streams: int
    window: int
    seed: int
    shuffle: bool = True
    offsets: tuple[tuple[int, ...] | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.block < 1:
            raise invalid(DataError, "block", self.block, "at least 1 record per block")
        if self.streams < 1:
            raise invalid(DataError, "streams", self.streams, "at least 1 stream")
        if self.num_records < self.streams:
            raise invalid(
                DataError,
                "streams",
                self.streams,
                f"at most the {self.num_records} records of the data",
                "Use fewer streams (order_streams), or more data.",
            )

    # ------------------------------------------------------------------ blocks
    @functools.cached_property
    def num_records(self) -> int:
        """Records in one epoch."""
        return sum(self.counts)

    @functools.cached_property
    def _blocks(self) -> Any:
        """(file, first record, count, byte offset or -1) of every block, as int64 columns."""
        import numpy as np

        rows = []
        for file, count in enumerate(self.counts):
            starts = range(0, count, self.block)
            known = self.offsets[file] if self.offsets is not None else None
            for i, first in enumerate(starts):
                offset = known[i] if known is not None and i < len(known) else -1
                rows.append((file, first, min(self.block, count - first), offset))
        return np.asarray(rows, dtype=np.int64).reshape(-1, 4)

    @functools.lru_cache(maxsize=4)  # noqa: B019 (frozen, hashable: the cache lives as long as the order).
    def _epoch_blocks(self, epoch: int) -> tuple[Any, Any]:
        """This epoch's blocks in order, and the position of each block's first record in the epoch."""
        import numpy as np

        blocks = self._blocks
        if self.shuffle:
            blocks = blocks[splitmix.permutation(len(blocks), self.seed, epoch)]
        starts = np.concatenate([[0], np.cumsum(blocks[:, 2])])
        return blocks, starts

    # ----------------------------------------------------------------- streams
    @functools.cached_property
    def stream_lengths(self) -> tuple[int, ...]:
        """Records per stream (the same every epoch)."""
        n, k = self.num_records, self.streams
        return tuple((j + 1) * n // k - j * n // k for j in range(k))

    def _pieces(self, epoch: int, begin: int, end: int) -> tuple[Piece, ...]:
        """The pieces holding epoch positions ``[begin, end)`` (a run of blocks of one file is one piece)."""
        import numpy as np

        blocks, starts = self._epoch_blocks(epoch)
        pieces: list[Piece] = []
        i = int(np.searchsorted(starts, begin, side="right")) - 1
        at = begin
        while at < end:
            file, first, count, offset = (int(v) for v in blocks[i])
            inside = at - int(starts[i])
            take = min(count - inside, end - at)
            seek = offset >= 0  # Open at the block's first record, else at the file's start.
            pieces.append(
                Piece(
                    file=file,
                    first=first + inside,
                    take=take,
                    offset=offset if seek else 0,
                    skip=inside if seek else first + inside,
                )
            )
            at += take
            i += 1
        return joined(pieces)

    def windows(self, *, epoch: int, stream: int, start: int = 0) -> Iterator[Window]:
        """Stream ``stream`` of ``epoch`` from its record ``start``, window by window.

        With shuffling the window holding ``start`` is read whole, ordered, and its first records skipped.
        Without, the stream is read from ``start`` in chunks of :data:`CHUNK` records.
        """
        if not 0 <= stream < self.streams:
            raise invalid(DataError, "stream", stream, f"a stream index in [0, {self.streams})")
        length = self.stream_lengths[stream]
        base = stream * self.num_records // self.streams
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
            "files": len(self.counts),
            "counts_key": splitmix.key(*self.counts) if self.counts else 0,
            "block": self.block,
            "streams": self.streams,
            "window": self.window,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }


def stream_position(order: EpochOrder, stream: int, records: int, *, epochs_per_pass: int | None) -> tuple[int, int]:
    """(epoch within the iteration, record in that epoch) of ``stream`` after ``records`` of it were read.

    Streams run on from one epoch into the next (``epochs_per_pass`` epochs per iteration, None: endless).
    """
    length = order.stream_lengths[stream]
    epoch, at = divmod(records, length)
    if epochs_per_pass is not None and epoch >= epochs_per_pass:
        return epochs_per_pass, 0
    return epoch, at
