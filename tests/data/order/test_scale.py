"""The order at scale: a keyed bijection of blocks (each record once per epoch, counted), positions entered
in O(1), orders mapped from a record index, and a backup of the old order refused with its reason.

Pure NumPy: no TensorFlow (the graph twin of the bijection is checked in test_splitmix.py).
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import numpy as np
import pytest

from tfdist.data.order import splitmix
from tfdist.data.order.epoch import ORDER_VERSION, EpochOrder
from tfdist.data.order.index import indexed_order
from tfdist.data.pipeline.state import InputState
from tfdist.data.records.index import open_index, write_index
from tfdist.errors import DataError


@pytest.mark.parametrize("n", [*range(1, 70), 255, 256, 257, 1000, 4097, 65_537])
def test_the_bijection_is_a_permutation_of_every_size(n: int) -> None:
    image = splitmix.bijection(np.arange(n), n, 9, 4)
    assert sorted(image.tolist()) == list(range(n))
    if n > 8:
        assert image.tolist() != list(range(n)) and image.tolist() != splitmix.bijection(np.arange(n), n, 9, 5).tolist()


def test_the_bijection_is_pinned_and_pointwise() -> None:
    # Pinned: a backup must resume in the same order after an upgrade of NumPy or on another machine.
    assert splitmix.bijection(np.arange(8), 8, 3, 0).tolist() == [4, 1, 5, 3, 7, 2, 6, 0]
    n = 39_062_500  # The blocks of 10^10 records: any one position costs the same as a small order's.
    every = splitmix.bijection(np.arange(5), n, 3, 1)
    assert [int(splitmix.bijection(np.asarray([i]), n, 3, 1)[0]) for i in range(5)] == every.tolist()


@pytest.mark.parametrize(
    ("counts", "block", "streams", "window"),
    [
        ((0, 3, 0, 0, 1000, 7), 8, 5, 16),  # Empty files, and blocks spanning several files.
        ((1,) * 300, 16, 4, 32),  # Blocks of 16 files each.
        ((2000,) * 10, 256, 64, 1024),  # The benchmark's shape, small: blocks across file ends.
        ((97, 3, 501), 7, 3, 0),  # No window: whole blocks, and a last block of 6.
    ],
)
def test_each_record_once_per_epoch_across_files_and_block_ends(counts, block, streams, window) -> None:
    order = EpochOrder(counts=counts, block=block, streams=streams, window=window, seed=11)
    everything = collections.Counter((f, i) for f, n in enumerate(counts) for i in range(n))
    seen = []
    for epoch in range(3):
        records = [r for s in range(streams) for r in order.stream_records(epoch=epoch, stream=s)]
        assert collections.Counter(records) == everything
        seen.append(records)
    assert seen[0] != seen[1] != seen[2]


def test_a_position_opens_at_the_nearest_located_record_of_its_file() -> None:
    # Offsets of every 4th record (grid 4), blocks of 8 records: fake byte offsets, 10 per record.
    counts = (13, 30, 5, 22)
    starts = np.concatenate([[0], np.cumsum(counts)])
    order = EpochOrder(counts=counts, block=8, streams=3, window=5, seed=2, offsets=np.arange(0, 70, 4) * 10, grid=4)
    for stream in range(3):
        whole = list(order.stream_records(epoch=1, stream=stream))
        for start in range(0, len(whole) + 1, 3):  # Resumed anywhere: the rest of the stream, as read whole.
            assert list(order.stream_records(epoch=1, stream=stream, start=start)) == whole[start:]
        for window in order.windows(epoch=1, stream=stream):
            for p in window.pieces:
                record = int(starts[p.file]) + p.first  # The piece's first record, in the listing's numbering.
                if p.offset == 0:
                    assert p.skip == p.first  # Read from the file's start.
                else:  # Opened at a located record of the same file, at most 3 before.
                    located = p.offset // 10
                    assert located % 4 == 0 and located >= starts[p.file] and record - located == p.skip < 4


def test_an_epoch_of_ten_billion_records_starts_without_touching_the_data(tmp_path: Path) -> None:
    # 5M files of 2,000 records in a record index (no record bytes): the order is mapped, and the first
    # records of a stream cost what they read.
    files = 5_000_000
    path = str(tmp_path / "big.tfindex")
    write_index(
        path,
        names=np.full(files, b"part", "S4"),
        counts=np.full(files, 2000, np.int64),
        sizes=np.full(files, 2000 * 116, np.int64),
        offsets=np.zeros(10**10 // 2**16 + 1, np.int64),  # Every 65,536th record located: a small file.
        grid=2**16,
        compression="",
        relative=True,
    )
    began = time.monotonic()
    index = open_index(path)
    order = indexed_order(index, block=256, streams=64, window=1024, seed=3, shuffle=True)
    first = list(zip(range(10), order.stream_records(epoch=1, stream=37)))
    assert order.num_records == 10**10 and len(first) == 10
    assert time.monotonic() - began < 5  # ~0.1 s here; the old order took minutes and 6 GB.
    assert index.paths[4_999_999].endswith("/part") and order.fingerprint()["files"] == files


def test_a_backup_of_another_order_version_is_refused_with_the_reason() -> None:
    state = InputState(epochs_per_iteration=1)
    state.reading(EpochOrder(counts=(10,), block=2, streams=2, window=0, seed=0), None)
    now = state.fingerprint()
    assert now is not None and now["order"] == ORDER_VERSION == 2
    assert state.check_fingerprint(now, backup="b") is False
    old = {k: v for k, v in now.items() if k != "order"}  # What tfdist wrote before: no version, version 1.
    with pytest.raises(DataError, match="version 1 of tfdist's resumable order, and this tfdist reads version 2"):
        state.check_fingerprint(old, backup="b")


def test_a_parameter_server_backup_of_streams_cut_by_records_is_refused_with_the_reason() -> None:
    state = InputState(epochs_per_iteration=1)
    state.reading(EpochOrder(counts=(10,), block=2, streams=2, window=0, seed=0, aligned=True), None)
    now = state.fingerprint()
    assert now is not None and now["aligned"] is True and state.check_fingerprint(now, backup="b") is False
    before = {k: v for k, v in now.items() if k != "aligned"}  # Claimed steps before their streams were aligned.
    with pytest.raises(DataError, match="streams were cut by records, and this run cuts them at block borders"):
        state.check_fingerprint(before, backup="b")
    plain = InputState(epochs_per_iteration=1)  # Every other order's fingerprint is as it was: its backups resume.
    plain.reading(EpochOrder(counts=(10,), block=2, streams=2, window=0, seed=0), None)
    assert "aligned" not in (plain.fingerprint() or {}) and plain.check_fingerprint(before, backup="b") is False
