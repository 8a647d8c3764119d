"""Reading the epoch order with tf.data: what the plan says, on any worker count, from any step, any file kind."""

from __future__ import annotations

import collections
import gc
import logging
import os
from collections.abc import Iterable

import pytest
import tensorflow as tf

from tests.support.records import ID_ONLY, example
from tfdist import _compat
from tfdist.data import DataPosition, TFRecordPipeline, write_tfrecords
from tfdist.data.order.index import epoch_order
from tfdist.data.order.position import InputCursor
from tfdist.data.order.reader import StreamLayout, default_streams, ordered_records
from tfdist.data.records.files import list_files
from tfdist.errors import DataError

RECORDS = 480


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    root = tmp_path_factory.mktemp("order")
    out = {}
    for compression in (None, "GZIP"):
        prefix = str(root / f"{compression}".lower() / "part")
        write_tfrecords((example(i) for i in range(RECORDS)), prefix, num_shards=12, compression=compression)
        out[compression] = prefix
    return out


def _ids(chunks: Iterable[tf.Tensor]) -> list[int]:
    """The ids of the order's records, chunk after chunk (each chunk is one stream's share of one step)."""
    return [int(i) for chunk in chunks for i in tf.io.parse_example(chunk, ID_ONLY)["id"]]


def _steps(per_worker: list[list[int]], share: int) -> list[set[int]]:
    steps: dict[int, set[int]] = collections.defaultdict(set)
    for ids in per_worker:
        for at in range(0, len(ids), share):
            steps[at // share] |= set(ids[at : at + share])
    return [steps[s] for s in sorted(steps)]


@pytest.mark.parametrize("compression", [None, "GZIP"])
@pytest.mark.parametrize("policy", ["file", "data"])
def test_each_step_trains_the_same_records_on_1_2_and_3_workers(prefixes, compression, policy) -> None:
    listing = list_files([prefixes[compression] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(listing, block=16, streams=12, window=64, seed=3, shuffle=True, compression=compression)
    assert (order.offsets is None) == (compression is not None)  # Byte offsets only where a file can seek.
    expected = None
    for workers in (1, 2, 3):
        per_worker = []
        for worker in range(workers):
            layout = StreamLayout(global_batch=24, streams=12, num_workers=workers, worker=worker, policy=policy)
            per_worker.append(
                _ids(
                    ordered_records(
                        order, layout, InputCursor(epochs_per_iteration=1), paths, compression=compression or ""
                    )
                )
            )
        every = [i for ids in per_worker for i in ids]
        assert sorted(every) == list(range(RECORDS))
        steps = _steps(per_worker, 24 // workers)
        assert len(steps) == RECORDS // 24
        expected = expected or steps
        assert steps == expected, workers
    # And what the plan says, record by record (one worker reads every stream b at a time).
    one = _ids(
        ordered_records(
            order,
            StreamLayout(global_batch=24, streams=12, num_workers=1, worker=0, policy="file"),
            InputCursor(epochs_per_iteration=1),
            paths,
            compression=compression or "",
        )
    )
    planned = [list(order.stream_records(epoch=0, stream=s)) for s in range(12)]
    by_file = {}
    for path_index, path in enumerate(paths):
        by_file[path_index] = [
            int(tf.io.parse_single_example(r, ID_ONLY)["id"])
            for r in tf.data.TFRecordDataset(path, compression_type=compression or "")
        ]
    interleaved = [
        by_file[f][i] for step in range(20) for s in range(12) for f, i in planned[s][step * 2 : step * 2 + 2]
    ]
    assert one == interleaved


def test_builds_of_one_shape_share_the_traced_reader_and_each_reads_its_own_order(prefixes) -> None:
    # A new build per epoch (as a loop that makes the pipeline again does) traces the reader once per
    # process: the second build's stream function is the first's, yet each dataset reads its own order
    # (its own seed, its own files), also when iterated side by side and once its Python dataset is gone.
    layout = StreamLayout(global_batch=24, streams=12, num_workers=2, worker=1, policy="file")
    built = {}
    for compression, seed in ((None, 3), (None, 4), ("GZIP", 4)):
        listing = list_files([prefixes[compression] + "-*"])
        paths = [f.path for f in listing.files]
        order = epoch_order(listing, block=16, streams=12, window=64, seed=seed, shuffle=True, compression=compression)
        records = ordered_records(
            order, layout, InputCursor(epochs_per_iteration=1), paths, compression=compression or ""
        )
        planned = {s: list(order.stream_records(epoch=0, stream=s)) for s in layout.own}
        expected = [pair for step in range(20) for s in layout.own for pair in planned[s][step * 2 : step * 2 + 2]]
        built[(compression, seed)] = (records, expected, paths)
    names = {key: value[0]._map_func.function.name for key, value in built.items()}
    assert names[(None, 3)] == names[(None, 4)] != names[("GZIP", 4)], names  # Compression is part of its shape.
    ids = {}
    for key, (_, _, paths) in built.items():
        by_file = [
            [
                int(tf.io.parse_single_example(r, ID_ONLY)["id"])
                for r in tf.data.TFRecordDataset(p, compression_type=key[0] or "")
            ]
            for p in paths
        ]
        ids[key] = by_file
    first, second = iter(built[(None, 3)][0]), iter(built[(None, 4)][0])
    side_by_side = [(_ids([next(first)]), _ids([next(second)])) for _ in range(20 * 6)]
    del first, second
    for key, got in ((None, 3), [a for a, _ in side_by_side]), ((None, 4), [b for _, b in side_by_side]):
        assert [i for chunk in got for i in chunk] == [ids[key][f][i] for f, i in built[key][1]], key
    # A dataset kept only as its variant (as DTensor's input keeps what it rebuilt), its Python dataset and
    # the others gone: it still reads its own order (a registry of weak references failed this: KeyError).
    records, expected = built[("GZIP", 4)][:2]
    rebuilt = tf.data.experimental.from_variant(tf.data.experimental.to_variant(records), records.element_spec)
    del built, records
    gc.collect()
    assert _ids(rebuilt) == [ids[("GZIP", 4)][f][i] for f, i in expected]


def test_sources_kept_for_the_process_share_their_order_and_paths(prefixes) -> None:
    # A build's window source outlives its dataset (the registry above; TF keeps a numpy_function's callable
    # the same way), so what it keeps of its own must stay small: builds over the same data share one order
    # and one tuple of paths, however many times the pipeline is built again.
    from tfdist.data.order import reader

    layout = StreamLayout(global_batch=24, streams=12, num_workers=2, worker=0, policy="file")
    before = set(reader._SOURCES)
    kept: list[tuple[int, object]] = []
    for _ in range(3):  # A fresh listing and order each time, as a pipeline built again every epoch makes.
        listing = list_files([prefixes[None] + "-*"])
        order = epoch_order(listing, block=16, streams=12, window=64, seed=7, shuffle=True, compression=None)
        paths = [f.path for f in listing.files]
        ordered_records(order, layout, InputCursor(epochs_per_iteration=1), paths, compression="")
        (new,) = set(reader._SOURCES) - before - {s for s, _ in kept}
        kept.append((new, order))
    sources = [reader._SOURCES[s] for s, _ in kept]
    assert sources[0]._order is kept[0][1] is kept[2][1]  # epoch_order gives every build the order made first.
    assert all(s._order is sources[0]._order and s._paths is sources[0]._paths for s in sources)
    # An endless iteration reads window by window through the build's own callables: nothing registered.
    ordered_records(order, layout, InputCursor(epochs_per_iteration=None), paths, compression="")
    assert set(reader._SOURCES) == before | {s for s, _ in kept}


def test_streams_come_as_chunks_of_one_step_across_windows_without_slices(prefixes, capfd) -> None:
    # b = 36 / 12 = 3 records per stream and step, windows of 50: chunks straddle windows (and the end).
    listing = list_files([prefixes[None] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(listing, block=16, streams=12, window=50, seed=5, shuffle=True, compression=None)
    layout = StreamLayout(global_batch=36, streams=12, num_workers=1, worker=0, policy="file")
    records = ordered_records(order, layout, InputCursor(epochs_per_iteration=1), paths, compression="")
    # Every function of the reader (the stream's, the piece reader's, the gather's) is instantiated on one
    # device: a new iterator skips TF's multi-device instantiation of each (BENCHMARKS.md).
    marked = _compat.marked_single_device(records)
    assert len(marked) >= 3 and set(marked.values()) == {True}, marked
    chunks = list(records)
    sizes = [int(c.shape[0]) for c in chunks]
    assert sizes == [3] * (13 * 12) + [1] * 12  # 40 records per stream: 13 steps of 3, then 1 each.
    by_file = {
        i: [int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for r in tf.data.TFRecordDataset(path)]
        for i, path in enumerate(paths)
    }
    planned = [[by_file[f][i] for f, i in order.stream_records(epoch=0, stream=s)] for s in range(12)]
    expected = [i for step in range(14) for s in range(12) for i in planned[s][step * 3 : step * 3 + 3]]
    assert _ids(chunks) == expected
    # The whole pipeline: batches of the chunks, and no tensor that is a slice of another reaches a batch
    # (TF would log "Tensor RefCount not reliable if buf_ points to a SubBuffer" per batch).
    capfd.readouterr()
    pipeline = TFRecordPipeline(
        files=prefixes[None] + "-*",
        features=ID_ONLY,
        batch_size=36,
        shuffle_buffer=50,
        seed=5,
        order_streams=12,
        order_block=16,
    )
    got = [b["id"].numpy().tolist() for b in pipeline.dataset()]
    assert [len(b) for b in got] == [36] * 13 + [12] and [i for b in got for i in b] == expected
    assert "SubBuffer" not in capfd.readouterr().err


@pytest.mark.parametrize("num_epochs", [1, None])
def test_a_resume_reads_what_the_uninterrupted_run_reads_from_there(prefixes, num_epochs) -> None:
    kwargs = dict(
        files=prefixes[None] + "-*", features=ID_ONLY, batch_size=24, shuffle_buffer=64, seed=3, num_epochs=num_epochs
    )
    whole = TFRecordPipeline(**kwargs)
    dataset = whole.dataset()
    taken = 45 if num_epochs is None else 20
    batches = [b["id"].numpy().tolist() for b in dataset.take(taken)]
    if num_epochs == 1:
        batches += [b["id"].numpy().tolist() for b in dataset]  # The next iteration is the next epoch.
        assert len(batches) == 40 and batches[:20] != batches[20:]
    for step in (0, 7, 19, 20, 33):
        resumed = TFRecordPipeline(**kwargs)
        position = (
            DataPosition(epoch=0, step=step)
            if num_epochs is None or step < 20
            else DataPosition(epoch=1, step=step - 20)
        )
        resumed.start_at(position)
        got = [b["id"].numpy().tolist() for b in resumed.dataset().take(taken - step if num_epochs is None else 40)]
        assert got[: len(batches) - step] == batches[step:][: len(got)], step


@pytest.mark.parametrize("chunk", [4096, 7])  # Unshuffled windows of CHUNK records: one, or several per file.
@pytest.mark.parametrize("compression, window", [(None, 0), ("GZIP", 0), (None, 25), ("GZIP", 25)])
def test_iterations_read_the_same_at_once_or_window_by_window(
    prefixes, compression, window, chunk, monkeypatch
) -> None:
    # A finite iteration computes its windows when it begins (one unshuffled epoch: one reader over its run
    # of files); an endless one (or a huge one) reads window by window. All give the planned order, across
    # epochs, on 1 and 2 workers, and after a resume.
    from tfdist.data.order import reader

    monkeypatch.setattr("tfdist.data.order.epoch.CHUNK", chunk)
    listing = list_files([prefixes[compression] + "-*"])
    paths = [f.path for f in listing.files]
    order = epoch_order(
        listing, block=16, streams=8, window=window, seed=4, shuffle=bool(window), compression=compression
    )  # 8 streams of 60 records: each starts and ends inside a file of 40.
    by_file = {
        i: [int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for r in tf.data.TFRecordDataset(p, compression or "")]
        for i, p in enumerate(paths)
    }

    def planned(epoch: int) -> list[int]:  # 60 records per stream: 20 steps of 3 from each stream in turn.
        streams = [[by_file[f][i] for f, i in order.stream_records(epoch=epoch, stream=s)] for s in range(8)]
        return [i for step in range(20) for s in range(8) for i in streams[s][step * 3 : step * 3 + 3]]

    def read(workers: int, epochs: int | None, start: DataPosition, steps: int) -> list[int]:
        out = []
        for worker in range(workers):
            cursor = InputCursor(epochs_per_iteration=epochs)
            cursor.start(start)
            layout = StreamLayout(global_batch=24, streams=8, num_workers=workers, worker=worker, policy="file")
            chunks = ordered_records(order, layout, cursor, paths, compression=compression or "")
            out.append(_ids(chunks.take(steps * 8 // workers)))
        return sorted(i for ids in out for i in ids) if workers > 1 else out[0]

    three = planned(0) + planned(1) + planned(2)
    assert (three[:480] != three[480:960]) == bool(window)
    for at_once in (True, False):
        monkeypatch.setattr(reader, "_AT_ONCE_PIECES", 1 << 16 if at_once else 0)
        assert reader._at_once(order, 2) is at_once and not reader._at_once(order, None)
        assert read(1, 2, DataPosition(), 40) == three[:960], at_once
        assert read(1, None, DataPosition(), 45) == three[: 45 * 24], at_once
        assert read(1, 1, DataPosition(epoch=1, step=7), 13) == planned(1)[7 * 24 :], at_once
        assert read(2, 1, DataPosition(step=5), 15) == sorted(planned(0)[5 * 24 :]), at_once
        assert read(1, 1, DataPosition(epoch=2, step=20), 1) == [], at_once  # Resumed at the epoch's end.
        assert read(2, 1, DataPosition(step=19), 1) == sorted(planned(0)[19 * 24 :]), at_once
    monkeypatch.setattr(reader, "_AT_ONCE_PIECES", 1 << 16)
    monkeypatch.setattr(reader, "_AT_ONCE_RECORDS", 119)  # Shuffled streams of 60 records, 2 epochs: 120.
    assert reader._at_once(order, 1) and reader._at_once(order, 2) is not bool(window)


def test_streams_read_on_threads_where_they_gain_from_it(prefixes, monkeypatch) -> None:
    # Unshuffled local files: the streams interleave on the consumer's thread (threads only handed records
    # between two busy cores); shuffled windows, an explicit num_parallel_reads (or remote files): a thread
    # per stream.
    from tfdist.data.pipeline import _resumable

    seen: list[bool] = []
    real = _resumable.ordered_records

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(bool(kwargs["threads"]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_resumable, "ordered_records", spy)
    for reads, shuffle in (("autotune", 0), (4, 0), ("autotune", 64)):
        pipeline = TFRecordPipeline(
            files=prefixes[None] + "-*",
            features=ID_ONLY,
            batch_size=24,
            num_parallel_reads=reads,
            shuffle_buffer=shuffle,
            seed=1,
        )
        assert sorted(i for b in pipeline.dataset() for i in b["id"].numpy().tolist()) == list(range(RECORDS))
    assert seen == [False, True, True]


def test_worker_records_are_single_records_of_the_workers_streams(prefixes) -> None:
    pipeline = TFRecordPipeline(files=prefixes[None] + "-*", features=ID_ONLY, batch_size=48, shuffle_buffer=64, seed=3)
    shares = []
    for worker in range(2):
        records, _ = pipeline.worker_records(worker, 2)
        assert records.element_spec.shape == []  # Records, not the order's chunks of b = 4.
        shares.append(_ids(records.batch(1000)))
    assert sorted(shares[0] + shares[1]) == list(range(RECORDS)) and len(shares[0]) == RECORDS // 2


def test_two_datasets_of_one_pipeline_count_their_own_epochs(prefixes) -> None:
    pipeline = TFRecordPipeline(files=prefixes[None] + "-*", features=ID_ONLY, batch_size=24, shuffle_buffer=64, seed=3)
    first, second = pipeline.dataset(), pipeline.dataset()
    assert [b["id"].numpy().tolist() for b in first] == [b["id"].numpy().tolist() for b in second]
    assert pipeline.steps_per_epoch() == 20


def test_default_streams_and_layout_rules() -> None:
    assert [default_streams(24, n, "file") for n in (1, 2, 3, 4, 6)] == [12, 12, 12, 12, 12]
    assert default_streams(256, 4, "file") == 8 and default_streams(7, 3, "data") == 7
    with pytest.raises(DataError, match="`batch_size`. Received: 8. Expected a global batch divisible by the 3"):
        default_streams(8, 3, "file")
    with pytest.raises(DataError, match="`order_streams`. Received: 12. Expected a multiple of the 5 workers"):
        StreamLayout(global_batch=60, streams=12, num_workers=5, worker=0, policy="file")
    with pytest.raises(DataError, match="`order_streams`. Received: 5. Expected a divisor of the global batch 24"):
        StreamLayout(global_batch=24, streams=5, num_workers=1, worker=0, policy="data")
    with pytest.raises(DataError, match="`shard_policy`. Received: 'hash'"):
        StreamLayout(global_batch=24, streams=12, num_workers=1, worker=0, policy="hash")


def test_auto_falls_back_to_the_buffer_order_and_says_why(prefixes, caplog) -> None:
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    with caplog.at_level(logging.INFO, logger="tfdist.data"):
        hashed = TFRecordPipeline(
            files=prefixes[None] + "-*", features=spec, batch_size=24, shard_policy="hash", shard_key="id"
        )
        assert sorted(i for b in hashed.dataset() for i in b["id"].numpy().tolist()) == list(range(RECORDS))
    assert hashed.fingerprint() is None and hashed.steps_per_epoch() is None
    assert "Input order 'buffer' (no exact resume): shard_policy 'hash'" in caplog.text
    strict = TFRecordPipeline(
        files=prefixes[None] + "-*",
        features=spec,
        batch_size=24,
        shard_policy="hash",
        shard_key="id",
        order="resumable",
    )
    with pytest.raises(DataError, match="`shard_policy`. Received: 'hash'. Expected a setting order='resumable'"):
        strict.dataset()
    with pytest.raises(DataError, match="`order`. Received: 'random'"):
        TFRecordPipeline(files="x", features=spec, batch_size=4, order="random")
    with pytest.raises(DataError, match="`step`. Received: -1"):
        DataPosition(step=-1)


def test_a_restarted_task_without_a_position_warns_once(prefixes, caplog, monkeypatch) -> None:
    monkeypatch.setenv("TFDIST_RESTART", "1")
    pipeline = TFRecordPipeline(files=prefixes[None] + "-*", features=ID_ONLY, batch_size=24, shuffle_buffer=8, seed=1)
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        for _ in range(2):
            assert sum(len(b["id"]) for b in pipeline.dataset()) == RECORDS
    assert caplog.text.count("A plain BackupAndRestore restores the model, not the input position") == 1
    caplog.clear()
    pipeline.start_at(DataPosition())
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        next(iter(pipeline.dataset()))
    assert "restores the model" not in caplog.text


def test_offsets_are_walked_once_per_process(prefixes, monkeypatch) -> None:
    from tfdist.data.order import index
    from tfdist.data.records import _framing

    calls = []
    monkeypatch.setattr(index, "_CACHE", {})
    real = _framing.block_offsets

    def counted(path: str, block: int, phase: int = 0) -> tuple[int, object]:
        calls.append(path)
        return real(path, block, phase)

    monkeypatch.setattr(_framing, "block_offsets", counted)
    listing = list_files([prefixes[None] + "-*"])
    for _ in range(2):
        epoch_order(listing, block=16, streams=12, window=0, seed=0, shuffle=False, compression=None)
    assert len(calls) == 12
    assert os.path.getsize(listing.files[0].path) > 0
