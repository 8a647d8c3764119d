"""The epoch order: a function of (seed, epoch, listing), each record once, enterable at any position."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from tfdist.data.order.epoch import EpochOrder
from tfdist.errors import DataError


@pytest.mark.parametrize(
    ("counts", "block", "streams", "window", "shuffle"),
    [
        ((5, 3), 2, 2, 0, False),
        ((100, 1, 37, 0, 64), 16, 6, 10, True),
        ((601,), 256, 7, 50, True),
        ((10,) * 12, 3, 12, 4, True),
        ((7, 7, 7), 100, 3, 1000, True),
    ],
)
def test_every_record_once_per_epoch_in_near_equal_streams(counts, block, streams, window, shuffle) -> None:
    order = EpochOrder(counts=counts, block=block, streams=streams, window=window, seed=5, shuffle=shuffle)
    lengths = order.stream_lengths
    assert sum(lengths) == sum(counts) and max(lengths) - min(lengths) <= 1
    everything = {(f, i) for f, n in enumerate(counts) for i in range(n)}
    epochs = []
    for epoch in range(3):
        records = [r for s in range(streams) for r in order.stream_records(epoch=epoch, stream=s)]
        assert collections.Counter(records) == collections.Counter(everything)
        epochs.append(records)
    assert (epochs[0] != epochs[1]) == (shuffle and len(everything) > 1)


@pytest.mark.parametrize("offsets", [False, True])
def test_a_stream_entered_at_any_position_goes_on_as_read_from_the_start(offsets: bool) -> None:
    counts = (40, 13, 27)
    known = np.arange(0, 80, 8) * 100 if offsets else None  # Fake byte offsets of every 8th record: 100 a record.
    order = EpochOrder(counts=counts, block=8, streams=4, window=6, seed=1, offsets=known)
    for stream in range(4):
        whole = list(order.stream_records(epoch=2, stream=stream))
        for start in range(len(whole) + 1):
            assert list(order.stream_records(epoch=2, stream=stream, start=start)) == whole[start:]
    window = next(order.windows(epoch=0, stream=1, start=9))
    assert window.skip == 3 and sum(p.take for p in window.pieces) == 6  # One window re-read, 3 dropped.
    if offsets:
        assert all(p.offset % 800 == 0 and p.skip < 8 for p in window.pieces)  # Opened at the block, not the file.


def test_the_order_does_not_depend_on_anything_but_seed_epoch_and_listing() -> None:
    one = EpochOrder(counts=(30, 30), block=4, streams=6, window=8, seed=9)
    two = EpochOrder(counts=(30, 30), block=4, streams=6, window=8, seed=9)
    assert list(one.stream_records(epoch=4, stream=2)) == list(two.stream_records(epoch=4, stream=2))
    other = EpochOrder(counts=(30, 30), block=4, streams=6, window=8, seed=10)
    assert list(one.stream_records(epoch=4, stream=2)) != list(other.stream_records(epoch=4, stream=2))
    assert one.fingerprint() == two.fingerprint() != other.fingerprint()


def test_bad_orders_name_the_field() -> None:
    with pytest.raises(DataError, match="`streams`. Received: 9. Expected at most the 8 records"):
        EpochOrder(counts=(8,), block=2, streams=9, window=0, seed=0)
    with pytest.raises(DataError, match="`block`"):
        EpochOrder(counts=(8,), block=0, streams=1, window=0, seed=0)
    with pytest.raises(DataError, match="`stream`. Received: 3"):
        next(EpochOrder(counts=(8,), block=2, streams=2, window=0, seed=0).windows(epoch=0, stream=3))


def test_block_permutation_mixes_files() -> None:
    # 12 files of 40 records, sorted by file: after the permutation a step's 24 records span many files.
    order = EpochOrder(counts=(40,) * 12, block=4, streams=12, window=16, seed=3)
    step0 = [next(iter(order.stream_records(epoch=0, stream=s))) for s in range(12)]
    assert len({f for f, _ in step0}) >= 6
    assert np.std([f for s in range(12) for f, _ in order.stream_records(epoch=0, stream=s)][:48]) > 2


@pytest.mark.parametrize("offsets", [False, True])
def test_unshuffled_blocks_of_one_file_are_one_piece(offsets: bool) -> None:
    counts = (40, 13, 27)
    known = np.arange(0, 80, 8) if offsets else None  # Fake byte offsets of every 8th record: 1 a record.
    order = EpochOrder(counts=counts, block=8, streams=2, window=0, seed=1, shuffle=False, offsets=known)
    pieces = [p for s in range(2) for w in order.windows(epoch=0, stream=s) for p in w.pieces]
    # Stream 0 holds records 0-39 (file 0); stream 1 holds 40-79 (files 1 and 2): one reader per file run.
    assert [(p.file, p.first, p.take) for p in pieces] == [(0, 0, 40), (1, 0, 13), (2, 0, 27)]
    assert [(p.offset, p.skip) for p in pieces] == [(0, 0)] * 3
    entered = next(order.windows(epoch=0, stream=0, start=19)).pieces
    # Entered mid-file: opened at the block holding record 19 (byte offset 16 here) or at the file's start.
    assert [(p.first, p.take, p.offset, p.skip) for p in entered] == [(19, 21, 16, 3) if offsets else (19, 21, 0, 19)]


@pytest.mark.parametrize(
    ("counts", "block", "streams"),
    [((17, 17), 2, 4), ((100, 1, 37, 0, 64), 16, 6), ((601,), 8, 7), ((10,) * 12, 3, 12)],
)
def test_aligned_streams_start_at_block_borders_and_hold_every_record_once(counts, block, streams) -> None:
    aligned = EpochOrder(counts=counts, block=block, streams=streams, window=0, seed=5, aligned=True)
    bases, lengths = aligned.stream_bases, aligned.stream_lengths
    assert bases[0] == 0 and bases[-1] == sum(counts) and all(b % block == 0 for b in bases[:-1])
    assert max(lengths) - min(lengths) <= block and sum(lengths) == sum(counts)
    everything = collections.Counter((f, i) for f, n in enumerate(counts) for i in range(n))
    for epoch in range(2):
        records = [r for s in range(streams) for r in aligned.stream_records(epoch=epoch, stream=s)]
        assert collections.Counter(records) == everything
    # The same blocks in the same places as without: only where the streams are cut moves.
    plain = EpochOrder(counts=counts, block=block, streams=streams, window=0, seed=5)
    assert [r for s in range(streams) for r in plain.stream_records(epoch=1, stream=s)] == records
    assert aligned.fingerprint() == {**plain.fingerprint(), "aligned": True}


def test_aligned_streams_with_fewer_blocks_than_streams_are_cut_by_records() -> None:
    order = EpochOrder(counts=(7,), block=4, streams=3, window=0, seed=1, aligned=True)  # 2 blocks, 3 streams.
    plain = EpochOrder(counts=(7,), block=4, streams=3, window=0, seed=1)
    assert not order.cut_at_blocks and order.stream_bases == plain.stream_bases
    assert order.fingerprint() == plain.fingerprint()  # The same order: its backups resume either way.


@pytest.mark.parametrize(
    ("records", "batch", "streams", "order_block"), [(100_000, 4800, 12, 256), (8448, 3072, 8, 256)]
)
def test_claimed_steps_cut_at_blocks_only_where_blocks_divide_a_share_and_keep_the_epochs_steps(
    records, batch, streams, order_block
) -> None:
    import types

    from tfdist.data.order.claims import steps_per_pass
    from tfdist.data.pipeline._resumable import claimed_layout

    for asked in (order_block, batch):  # 256 does not divide 400 or 384; a block of the batch is cut to a share.
        pipeline = types.SimpleNamespace(batch_size=batch, order_streams=streams, order_block=asked)
        layout, block, aligned = claimed_layout(pipeline, records)
        assert block == min(asked, layout.per_stream) and aligned == (layout.per_stream % block == 0)
        order = EpochOrder(counts=(records,), block=block, streams=streams, window=0, seed=2, aligned=aligned)
        assert steps_per_pass(order, batch) == -(-records // batch)  # Cut at blocks or not, the same steps.
