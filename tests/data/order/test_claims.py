"""Claimed steps (the parameter-server reader): each claim reads its step of the epoch order, in graph ops.

The real parameter-server runs (workers claiming from a counter on a ps, counted) are in
tests/keras/test_resume_ps.py; here one process claims in order and checks every step against the NumPy
order, for seekable and compressed files, shuffled and not, several data epochs.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from tests.support.records import ID_ONLY, example
from tfdist.data import DataPosition, TFRecordPipeline, write_tfrecords
from tfdist.data.order.claims import claim_next, claimed_steps, steps_per_pass
from tfdist.data.order.epoch import EpochOrder
from tfdist.data.order.index import epoch_order
from tfdist.data.records.files import list_files
from tfdist.errors import DataError

RECORDS = 100


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    root = tmp_path_factory.mktemp("claims")
    out = {}
    for compression in (None, "GZIP"):
        prefix = str(root / f"{compression}".lower() / "part")
        write_tfrecords((example(i) for i in range(RECORDS)), prefix, num_shards=3, compression=compression)
        out[compression] = prefix
    return out


def _expected_steps(order: EpochOrder, epoch: int, per: int) -> list[set[tuple[int, int]]]:
    """Step s of ``epoch``: records [s*per, (s+1)*per) of every stream of the NumPy order."""
    streams = [list(order.stream_records(epoch=epoch, stream=j)) for j in range(order.streams)]
    steps = -(-max(len(s) for s in streams) // per)
    return [{r for s in streams for r in s[at * per : (at + 1) * per]} for at in range(steps)]


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize(("shuffle", "aligned"), [(True, True), (True, False), (False, True)])
def test_each_claim_reads_its_step_of_the_order_over_several_epochs(prefixes, compression, shuffle, aligned) -> None:
    listing = list_files([prefixes[compression] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(
        listing, block=2, streams=4, window=0, seed=5, shuffle=shuffle, compression=compression, aligned=aligned
    )
    assert (order.offsets is None) == (compression is not None)
    ids = {}
    for f, path in enumerate(paths):  # (file, record) -> id, read in file order
        for i, record in enumerate(tf.data.TFRecordDataset(path, compression_type=compression or "")):
            ids[(f, i)] = int(tf.io.parse_single_example(record, ID_ONLY)["id"])
    counter = tf.Variable(0, dtype=tf.int64)
    steps = claimed_steps(order, paths, compression=compression or "", global_batch=8, counter=counter, passes=3)
    got = [{int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for r in batch} for batch in steps]
    spp = steps_per_pass(order, 8)
    assert spp == 13 and len(got) == 3 * spp and int(counter.numpy()) == 3 * spp + 1  # The last claim ends it.
    for epoch in range(3):
        expected = [{ids[r] for r in step} for step in _expected_steps(order, epoch, 2)]
        assert got[epoch * spp : (epoch + 1) * spp] == expected
        assert sorted(i for step in expected for i in step) == list(range(RECORDS))  # One pass per epoch.
    assert (got[:spp] != got[spp : 2 * spp]) == shuffle  # Each epoch its own order, when shuffled.


def _in_threads(work, threads: int) -> list:
    out: list = []
    lock = threading.Lock()

    def run() -> None:
        got = work()
        with lock:
            out.extend(got)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in started)
    return out


def test_concurrent_claims_never_return_the_same_step() -> None:
    # The CI failure this guards: with assign_add then read, two adds could land before either read, and
    # 8 threads of 3,000 claims returned about 50 values twice (and skipped as many).
    counter = tf.Variable(0, dtype=tf.int64)
    claim = tf.function(lambda: claim_next(counter))
    got = _in_threads(lambda: [int(claim()) for _ in range(3000)], threads=8)
    assert sorted(got) == list(range(24000)) and int(counter.numpy()) == 24000


def test_workers_claiming_side_by_side_read_each_step_once(prefixes) -> None:
    listing = list_files([prefixes[None] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(listing, block=2, streams=4, window=0, seed=5, shuffle=True, compression=None)
    counter = tf.Variable(0, dtype=tf.int64)

    def worker() -> list[int]:
        steps = claimed_steps(order, paths, compression="", global_batch=8, counter=counter, passes=4)
        return [int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for batch in steps for r in batch]

    got = _in_threads(worker, threads=3)
    assert Counter(Counter(got).values()) == {4: RECORDS}  # 4 data epochs over 3 readers: each record 4 times.


def test_a_claim_from_the_middle_reads_that_step_only(prefixes) -> None:
    listing = list_files([prefixes[None] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(listing, block=2, streams=4, window=0, seed=5, shuffle=True, compression=None)
    counter = tf.Variable(13 + 6, dtype=tf.int64)  # Epoch 1, step 6: where a resumed fit starts.
    first = next(iter(claimed_steps(order, paths, compression="", global_batch=8, counter=counter, passes=None)))
    expected = _expected_steps(order, 1, 2)[6]
    assert {int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for r in first} == {
        int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for (f, i), r in _records(paths).items() if (f, i) in expected
    }
    assert int(counter.numpy()) == 20  # One claim, no read ahead.


def _records(paths: list[str]) -> dict[tuple[int, int], bytes]:
    return {(f, i): r.numpy() for f, path in enumerate(paths) for i, r in enumerate(tf.data.TFRecordDataset(path))}


def test_a_pipeline_under_a_strategy_gives_a_parsed_claimed_dataset_and_its_cursor(prefixes, caplog) -> None:
    pipeline = TFRecordPipeline(files=prefixes[None] + "-*", batch_size=8, features=ID_ONLY, shuffle_buffer=16, seed=2)
    with caplog.at_level(logging.INFO, logger="tfdist.data"):
        dataset_fn = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert dataset_fn is not None and pipeline.claimed_steps() == 0
    assert (
        "claimed steps: 100 records, 13 steps per data epoch of 8 streams (1 record(s) of each per step)" in caplog.text
    )
    assert pipeline.steps_per_epoch() == 13
    batches = list(dataset_fn(None))  # num_epochs=1: one data epoch
    assert len(batches) == 13 and sorted(int(i) for b in batches for i in b["id"]) == list(range(RECORDS))
    assert pipeline.claimed_steps() == 14
    # A restore seeks the claims (the one route of ResumableInput): fit's epoch 1, step 3 of 10-step epochs.
    pipeline.seek(epoch=1, step=3, steps_per_epoch=10)
    assert pipeline.claimed_steps() == 13 and pipeline.cursor.position == DataPosition()


def test_options_without_a_global_order_are_refused_with_the_fix_under_auto_and_resumable(prefixes, caplog) -> None:
    files = prefixes[None] + "-*"
    for order in ("auto", "resumable"):  # Before, 'auto' fell back to every worker reading the whole data.
        hashed = TFRecordPipeline(
            files=files, batch_size=8, features=ID_ONLY, shard_policy="hash", shard_key="id", order=order
        )
        with pytest.raises(DataError, match="order='buffer'") as err:
            hashed.claimed_dataset_fn(tf.distribute.get_strategy())
        assert err.value.field == "shard_policy" and err.value.value == "hash"
        assert "every worker then reads the whole data" in str(err.value) and "Drop shard_policy" in str(err.value)
    plain = TFRecordPipeline(files=files, batch_size=8, features=ID_ONLY, order="buffer")
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        assert plain.claimed_dataset_fn(tf.distribute.get_strategy()) is None


def test_a_block_table_too_large_for_the_graph_names_order_block(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist.data.order import claims

    monkeypatch.setattr(claims, "MAX_BLOCKS", 5)
    order = EpochOrder(counts=(10,), block=1, streams=2, window=0, seed=0, offsets=np.arange(10))
    counter = tf.Variable(0, dtype=tf.int64)
    with pytest.raises(DataError, match="order_block") as err:
        claimed_steps(order, ["x"], compression="", global_batch=4, counter=counter, passes=1)
    assert err.value.field == "order_block" and err.value.value == 1 and int(counter.numpy()) == 0


def test_aligned_streams_read_a_step_in_one_piece_per_stream_but_across_files() -> None:
    from tfdist.data.order.claims import _step_pieces

    # 34 records in 2 files of 17, blocks of 2, 4 streams of 2 records a step: cut by records, the streams
    # start at 0, 8, 17 and 25, so two of them span two blocks every step; aligned, each share is one block.
    pieces = {}
    for aligned in (False, True):
        order = EpochOrder(counts=(17, 17), block=2, streams=4, window=0, seed=3, aligned=aligned)
        spp = steps_per_pass(order, 8)
        step = _step_pieces(order, 8, spp)
        pieces[aligned] = sum(int(tf.size(step(tf.constant(g, tf.int64))[2])) for g in range(spp))
    # Aligned, the streams hold 8, 8, 8 and 10 records: 4 steps of 4 shares and a last one of 1, and the one
    # block across the files' border is two pieces (measured 17-18 over seeds 3-5); cut by records, 26.
    assert pieces[True] <= 4 * 4 + 1 + 1
    assert pieces[False] >= 24
