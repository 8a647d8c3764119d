"""The stratified sampler's mechanism: vectorized class choices, small class groups held in memory, fast build.

What these protect was measured in BENCHMARKS.md (issue 11 part 5); here only the behaviour: the mix matches
the weights, a seed makes it repeatable, and the faster paths read the same records as before.
"""

from __future__ import annotations

import collections
import itertools
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from tests.support.records import FEATURES
from tests.support.records import example as _example
from tfdist import DataError
from tfdist.data import TFRecordPipeline, stratified_sample, write_tfrecords
from tfdist.data.pipeline import stratified as stratify
from tfdist.data.pipeline.options import SourceOptions
from tfdist.data.records._framing import first_record
from tfdist.data.records.files import FileInfo, Listing, list_files
from tfdist.data.sampling import class_choices
from tfdist.data.sharding import plan_shards


def _halving(n: int = 1600) -> list[tf.train.Example]:
    """4 classes whose frequencies halve: 8/15, 4/15, 2/15, 1/15 of ``n`` (ids 0..n-1)."""
    labels = [0 if i % 15 < 8 else 1 if i % 15 < 12 else 2 if i % 15 < 14 else 3 for i in range(n)]
    return [_example(i, label) for i, label in enumerate(labels)]


@pytest.mark.parametrize(
    "probabilities",
    [
        pytest.param([0.7, 0.2, 0.1], id="skewed"),
        pytest.param([0.5, 0.0, 0.5], id="zero_inside"),
        pytest.param([0.25, 0.75, 0.0], id="zero_last"),
        pytest.param([3.0, 1.0, 0.0], id="unnormalized"),
    ],
)
def test_choices_follow_the_probabilities(probabilities: list) -> None:
    picks = np.array(list(class_choices(probabilities, seed=5).take(30000).as_numpy_iterator()))
    expected = np.asarray(probabilities) / sum(probabilities)
    np.testing.assert_allclose(np.bincount(picks, minlength=3)[:3] / len(picks), expected, atol=0.012)
    assert picks.min() >= 0 and picks.max() <= 2
    assert set(np.flatnonzero(expected == 0)) & set(picks.tolist()) == set()  # Weight 0: never.


def test_a_seed_repeats_the_choices() -> None:
    first = list(class_choices([0.5, 0.5], seed=3).take(3000).as_numpy_iterator())
    again = list(class_choices([0.5, 0.5], seed=3).take(3000).as_numpy_iterator())
    other = list(class_choices([0.5, 0.5], seed=4).take(3000).as_numpy_iterator())
    assert first == again
    assert first != other


def test_exhausted_classes_are_dropped_or_stop_the_mix() -> None:
    # 'drop' keeps going with the other classes (every element once); 'stop' ends at the first empty class.
    datasets = [tf.data.Dataset.range(5), tf.data.Dataset.range(100, 300)]
    drop = list(stratified_sample(datasets, [0.5, 0.5], seed=0, on_exhausted="drop").as_numpy_iterator())
    assert sorted(drop) == list(range(5)) + list(range(100, 300))
    stop = list(stratified_sample(datasets, [0.5, 0.5], seed=0, on_exhausted="stop").as_numpy_iterator())
    assert len(stop) < 40


@pytest.mark.parametrize(
    "exhausted,block",
    [
        pytest.param("repeat", 1, id="repeat"),
        pytest.param("repeat", 4, id="repeat_blocks"),
        pytest.param("drop", 4, id="drop"),
    ],
)
def test_choices_drawn_up_front_follow_the_mix_and_lose_nothing_past_them(exhausted: str, block: int) -> None:
    # draws: the choices are drawn up front (numpy, seeded). Past them, round robin: nothing is lost.
    keys = {0: tf.data.Dataset.range(0, 6000), 1: tf.data.Dataset.range(10_000, 12_000)}
    mix = {0: 0.75, 1: 0.25}
    taken = list(
        stratified_sample(keys, mix, seed=2, on_exhausted=exhausted, block=block, draws=4000)
        .take(4000)
        .as_numpy_iterator()
    )
    assert len(taken) == 4000
    assert sum(v < 10_000 for v in taken) / 4000 == pytest.approx(0.75, abs=0.025)
    again = list(
        stratified_sample(keys, mix, seed=2, on_exhausted=exhausted, block=block, draws=4000)
        .take(4000)
        .as_numpy_iterator()
    )
    assert taken == again  # The seed repeats the numpy draws.
    if exhausted == "drop":  # Too few choices planned for both classes: the round robin drains the rest.
        drained = list(
            stratified_sample(keys, mix, seed=2, on_exhausted="drop", block=block, draws=100).as_numpy_iterator()
        )
        assert sorted(drained) == list(range(6000)) + list(range(10_000, 12_000))


def test_choices_are_planned_only_with_a_seed_and_a_negative_seed_works() -> None:
    from tfdist.data import sampling

    keys = [tf.data.Dataset.range(0, 100), tf.data.Dataset.range(1000, 1100)]
    with mock.patch.object(sampling, "_planned_choices", wraps=sampling._planned_choices) as planned:
        seeded = list(stratified_sample(keys, [0.5, 0.5], seed=-1, draws=60).take(60).as_numpy_iterator())
        assert planned.call_count == 1
        tf.random.set_seed(7)  # Unseeded: TF's global seed applies, through class_choices.
        first = list(stratified_sample(keys, [0.5, 0.5], draws=60).take(60).as_numpy_iterator())
        tf.random.set_seed(7)
        again = list(stratified_sample(keys, [0.5, 0.5], draws=60).take(60).as_numpy_iterator())
        assert planned.call_count == 1
    assert len(seeded) == 60
    assert first == again


def test_past_the_planned_choices_a_class_of_weight_zero_stays_out() -> None:
    # Class 1 is empty: its planned choices are skipped, so the round robin serves the rest; it must not
    # bring in class 2 (weight 0) and must keep drawing class 0.
    keys = [tf.data.Dataset.range(0, 10), tf.data.Dataset.range(0), tf.data.Dataset.range(500, 510)]
    drawn = list(stratified_sample(keys, [0.5, 0.5, 0.0], seed=3, draws=100).take(100).as_numpy_iterator())
    assert len(drawn) == 100
    assert all(v < 10 for v in drawn)


def test_draws_must_be_a_count() -> None:
    with pytest.raises(DataError, match="`draws`"):
        stratified_sample([tf.data.Dataset.range(3)], "balanced", draws=-1)


@pytest.fixture
def prefix(tmp_path: Path) -> str:
    """The 1,600 records of _halving() in 4 shards, partitioned by label."""
    prefix = os.path.join(tmp_path, "part")
    write_tfrecords(_halving(), prefix, num_shards=4, partition_by="label")
    return prefix


def _labels(prefix: str, **kwargs: object) -> list[int]:
    pipeline = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=64, label_key="label", **kwargs)
    return [int(v) for batch in pipeline.dataset() for v in batch["label"].numpy()]


@pytest.mark.parametrize(
    "weights,expected,extra",
    [
        pytest.param("balanced", [0.25] * 4, {}, id="balanced"),
        pytest.param("sqrt", np.sqrt([8, 4, 2, 1]) / np.sqrt([8, 4, 2, 1]).sum(), {}, id="sqrt"),
        pytest.param(
            {0: 1, 1: 1, 2: 2, 3: 4}, [0.125, 0.125, 0.25, 0.5], {"shuffle_buffer": 256}, id="mapping_shuffled"
        ),
        pytest.param("balanced", [0.25] * 4, {"sample_block": 1}, id="block_1"),
    ],
)
def test_a_finite_epoch_keeps_the_mix_and_the_size(prefix: str, weights: object, expected: list, extra: dict) -> None:
    labels = _labels(prefix, class_weights=weights, num_epochs=3, seed=2, **extra)
    assert len(labels) == 3 * 1600  # Each epoch draws as many records as the share.
    np.testing.assert_allclose(np.bincount(labels, minlength=4) / len(labels), expected, atol=0.03)
    assert labels == _labels(prefix, class_weights=weights, num_epochs=3, seed=2, **extra)  # Seeded.


def test_natural_mix_reads_each_record_once(prefix: str) -> None:
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=FEATURES,
        batch_size=64,
        label_key="label",
        class_weights="natural",
        seed=0,
    )
    ids = [int(v) for batch in pipeline.dataset() for v in batch["id"].numpy()]
    assert sorted(ids) == list(range(1600))


def test_small_redrawn_groups_are_held_in_memory() -> None:
    files = [
        (f"d-y={label}-00000-of-00001.tfrecord", size)
        for label, size in (("0", 8000), ("1", 4000), ("2", 2000), ("3", 1000))
    ]
    listing = Listing(files=tuple(FileInfo(path=p, size=s, records=s // 10, record_bytes=s) for p, s in files))
    groups = stratify.class_groups(listing, "y")
    counts = {"0": 800, "1": 400, "2": 200, "3": 100}

    def held(mix: object, share: int, count: int = 1, policy: str = "data") -> list[str]:
        passes = {
            label: stratify._pass_of(
                plan_shards(files, num_workers=count, policy=policy),
                0,
                counts[label],
                files,
                listing,
                SourceOptions(files="d-*"),
            )
            for label, files in groups.items()
        }
        return stratify._held_in_memory(passes, mix, share=share, listing=listing, source=SourceOptions(files="d-*"))

    balanced = {label: 0.25 for label in counts}  # 500 draws each of 2,000: 2+ passes of '2' and '3'.
    assert held(balanced, 2000) == ["3", "2"]
    assert held(balanced, 1000, count=2) == ["3", "2"]
    assert held(balanced, 1500) == ["3"]
    natural = {label: c / 1500 for label, c in counts.items()}
    assert held(natural, 1500) == []
    assert held("a tf.Variable", 2000) == ["3", "2"]  # An even share (500) is 2+ passes of these.
    budget = stratify.MEMORY_BUDGET
    try:
        stratify.MEMORY_BUDGET = 1500  # Only the smallest fits.
        assert held(balanced, 2000) == ["3"]
        # Sharding off: each of 2 workers reads (and would cache) the whole group, not half of it; and its
        # pass, so the shuffle buffer, is every record of the group.
        stratify.MEMORY_BUDGET = 900
        assert held(balanced, 1000, count=2) == ["3"]  # Half of '3' under 'data': 500 bytes.
        assert held(balanced, 1000, count=2, policy="off") == []  # All of it, 1,000 bytes, each.
        stratify.MEMORY_BUDGET = 1000
        assert held(balanced, 1000, count=2, policy="off") == ["3"]
    finally:
        stratify.MEMORY_BUDGET = budget
    off = stratify._pass_of(
        plan_shards(groups["3"], num_workers=2, policy="off"),
        1,
        100,
        groups["3"],
        listing,
        SourceOptions(files="d-*"),
    )
    assert (off.records, off.part) == (100, 1.0)
    data = stratify._pass_of(
        plan_shards(groups["3"], num_workers=3, policy="data"),
        1,
        100,
        groups["3"],
        listing,
        SourceOptions(files="d-*"),
    )
    assert data.records == 33  # Records 1, 4, ..., 97.


@pytest.mark.parametrize(
    "manifest",
    [
        pytest.param(True, id="manifest"),
        pytest.param(False, id="framing_walk"),
    ],
)
def test_a_compressed_group_is_held_by_its_size_in_memory(tmp_path: Path, manifest: bool) -> None:
    # GZIP of repetitive features is many times smaller on disk than the records it holds in memory.
    prefix = os.path.join(tmp_path, "z")
    pad = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\0" * 4000]))
    examples = []
    for i in range(48):
        example = _example(i, 0 if i < 40 else 1)
        example.features.feature["pad"].CopyFrom(pad)
        examples.append(example)
    write_tfrecords(examples, prefix, num_shards=1, compression="GZIP", partition_by="label")
    if not manifest:
        os.remove(f"{prefix}-manifest.json")
    listing = list_files([f"{prefix}-*"])
    groups = stratify.class_groups(listing, "label")
    source = SourceOptions(files=f"{prefix}-*")
    disk, memory = sum(s for _, s in groups["1"]), 8 * (4000 + 40)
    assert 4 * disk < memory  # Else the case tests nothing.

    def held() -> list[str]:
        passes = {
            label: stratify._pass_of(
                plan_shards(files, num_workers=1),
                0,
                stratify._records_in(files, listing, source),
                files,
                listing,
                source,
            )
            for label, files in groups.items()
        }
        return stratify._held_in_memory(passes, {"0": 0.5, "1": 0.5}, share=48, listing=listing, source=source)

    budget = stratify.MEMORY_BUDGET
    try:
        stratify.MEMORY_BUDGET = 4 * disk  # Fits on disk, not in memory.
        assert held() == []
        stratify.MEMORY_BUDGET = 2 * memory
        assert held() == ["1"]
    finally:
        stratify.MEMORY_BUDGET = budget


def test_each_pass_of_a_held_class_is_a_new_permutation_of_its_records(prefix: str) -> None:
    # Class 3 (ids i % 15 == 14, 106 records) is drawn 400 times an epoch: held, reshuffled every pass.
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=FEATURES,
        batch_size=64,
        label_key="label",
        class_weights="balanced",
        shuffle_buffer=64,
        num_epochs=1,
        seed=3,
    )
    records, _, _, stratified, _ = pipeline._records_for(None, None)
    assert stratified
    ids = [int(tf.io.parse_single_example(r, FEATURES)["id"]) for r in records]
    small = sorted(i for i in range(1600) if i % 15 == 14)
    drawn = [i for i in ids if i % 15 == 14]
    passes = [drawn[k : k + len(small)] for k in range(0, len(drawn) - len(small) + 1, len(small))]
    assert len(passes) >= 3
    for one in passes:
        assert sorted(one) == small  # Each pass: every record of the class once.
    for first, second in itertools.pairwise(passes):
        assert first != second  # Shuffled anew each pass.


def test_first_record_and_damaged_headers(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "r")
    path = write_tfrecords([_example(i, 0) for i in range(3)], prefix, num_shards=1)[0]
    record = first_record(path, check_data=True)
    assert tf.train.Example.FromString(record).features.feature["id"].int64_list.value == [0]
    with open(path, "rb") as f:
        data = bytearray(f.read())
    damaged = os.path.join(tmp_path, "bad.tfrecord")
    for offset in (2, 20):  # In the length (its CRC fails), then in the data (only check_data sees it).
        broken = bytearray(data)
        broken[offset] ^= 0xFF
        with open(damaged, "wb") as f:
            f.write(broken)
        assert first_record(damaged, check_data=True) is None
    assert first_record(damaged) is not None
    with open(damaged, "wb") as f:
        f.write(data[:5])
    assert first_record(damaged) is None


def test_a_wrong_spec_is_still_named_before_reading(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "s")
    write_tfrecords([_example(i, i % 2) for i in range(8)], prefix, num_shards=2)
    with pytest.raises(DataError, match=r"features\['id'\]"):
        TFRecordPipeline(
            files=f"{prefix}-*", batch_size=4, features={"id": tf.io.FixedLenFeature([], tf.string)}
        ).dataset()


@pytest.mark.parametrize(
    "deterministic",
    [
        pytest.param(True, id="deterministic"),
        pytest.param(False, id="any_order"),
    ],
)
def test_every_record_once_on_the_fast_reader(tmp_path: Path, deterministic: bool) -> None:
    prefix = os.path.join(tmp_path, "f")
    write_tfrecords([_example(i, i % 3) for i in range(301)], prefix, num_shards=5)
    for policy in ("file", "data"):
        seen: collections.Counter[int] = collections.Counter()
        for worker in range(2):
            context = tf.distribute.InputContext(2, worker, 2)
            pipeline = TFRecordPipeline(
                files=f"{prefix}-*",
                features=FEATURES,
                batch_size=8,
                shard_policy=policy,
                deterministic=deterministic,
                shuffle_buffer=16,
                seed=1,
            )
            seen.update(int(v) for b in pipeline.dataset(context) for v in b["id"].numpy())
        assert seen == collections.Counter(range(301)), policy


# Under 'autotune', each local class group is read file by file, without reader threads.


def _ids(files: str, **kwargs: object) -> list[int]:
    kwargs.setdefault("order", "buffer")  # These tests are about the readers of each worker's own files.
    pipeline = TFRecordPipeline(files=files, features=FEATURES, batch_size=16, label_key="label", **kwargs)
    return [int(v) for batch in pipeline.dataset() for v in batch["id"].numpy()]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"class_weights": "balanced", "seed": 1, "num_epochs": 3}, id="balanced"),
        pytest.param(
            {"class_weights": "sqrt", "sample_block": 1, "seed": 2, "shuffle_buffer": 64, "num_epochs": 3},
            id="sqrt_block_1_shuffled",
        ),
        pytest.param({"class_weights": "natural", "seed": 0}, id="natural"),
    ],
)
def test_the_same_records_and_mix_as_one_parallel_read_per_class(tmp_path: Path, kwargs: dict) -> None:
    # 4 classes x 5 files. TF's own reader with one file at a time gives the order of a sequential read;
    # 4 files at once (what 'autotune' used to give each class here) interleaves them.
    prefix = os.path.join(tmp_path, "t")
    write_tfrecords(_halving(1200), prefix, num_shards=5, partition_by="label")
    sequential = _ids(f"{prefix}-*", **kwargs)
    assert sequential == _ids(f"{prefix}-*", num_parallel_reads=1, **kwargs)
    assert sequential != _ids(f"{prefix}-*", num_parallel_reads=4, **kwargs)
    if kwargs["class_weights"] == "natural":
        assert sorted(sequential) == list(range(1200))  # Every record exactly once.
    else:
        assert len(sequential) == 3600
        labels = np.asarray(
            [[0 if i % 15 < 8 else 1 if i % 15 < 12 else 2 if i % 15 < 14 else 3] for i in sequential]
        ).reshape(-1)
        weights = np.ones(4) if kwargs["class_weights"] == "balanced" else np.sqrt([8, 4, 2, 1])
        np.testing.assert_allclose(np.bincount(labels, minlength=4) / len(labels), weights / weights.sum(), atol=0.03)


def test_class_groups_on_a_network_mount_keep_the_parallel_reader(tmp_path: Path) -> None:
    from tfdist.data.records import files as files_module

    prefix = os.path.join(tmp_path, "t")
    write_tfrecords(_halving(1200), prefix, num_shards=5, partition_by="label")
    kwargs = {"class_weights": "balanced", "seed": 1, "num_epochs": 2}
    parallel = _ids(f"{prefix}-*", num_parallel_reads=4, **kwargs)  # 16 // 4 classes, as 'autotune'.
    with mock.patch.object(files_module, "on_local_disk", return_value=False):  # As if on NFS or gcsfuse.
        assert _ids(f"{prefix}-*", **kwargs) == parallel
    assert _ids(f"{prefix}-*", **kwargs) != parallel


def test_plain_local_files_keep_the_order_of_tfs_parallel_reader_without_its_threads(tmp_path: Path) -> None:
    from tfdist.data.pipeline import reading
    from tfdist.data.records import files as files_module

    # 20 files of unequal length (the writer's first shards are longer), more than the 16 read at once.
    prefix = os.path.join(tmp_path, "t")
    write_tfrecords(_halving(1203), prefix, num_shards=20)
    with mock.patch.object(reading, "_how_to_read", wraps=reading._how_to_read) as how:
        local = _ids(f"{prefix}-*")
    assert how.call_count == 1
    assert reading._how_to_read(*how.call_args.args, **how.call_args.kwargs) == ("interleave", 16)
    assert local == _ids(f"{prefix}-*", num_parallel_reads=16)  # TF's parallel reader.
    assert local != _ids(f"{prefix}-*", num_parallel_reads=1)  # Not file after file.
    assert sorted(local) == list(range(1203))
    with mock.patch.object(files_module, "on_local_disk", return_value=False):  # As if on NFS or gcsfuse.
        assert _ids(f"{prefix}-*") == local


@pytest.mark.parametrize(
    "files,streams,reads,local,policy,expected",
    [
        pytest.param(20, 1, "autotune", True, "file", ("interleave", 16), id="local_one_stream"),
        pytest.param(3, 1, "autotune", True, "file", ("interleave", 3), id="local_few_files"),
        pytest.param(1, 1, "autotune", True, "file", ("sequential", 1), id="local_one_file"),
        pytest.param(0, 1, "autotune", True, "file", ("sequential", 1), id="no_files"),
        pytest.param(20, 8, "autotune", True, "file", ("sequential", 1), id="local_class_groups"),
        pytest.param(20, 8, "autotune", True, "data", ("interleave", 2), id="local_class_groups_data"),
        pytest.param(20, 1, "autotune", False, "file", ("parallel", 16), id="remote_one_stream"),
        pytest.param(20, 8, "autotune", False, "file", ("parallel", 2), id="remote_class_groups"),
        pytest.param(20, 1, 4, True, "file", ("parallel", 4), id="explicit_reads"),
        pytest.param(2, 8, 4, True, "file", ("parallel", 2), id="explicit_reads_few_files"),
    ],
)
def test_how_each_stream_reads(
    files: int, streams: int, reads: object, local: bool, policy: str, expected: tuple
) -> None:
    from tfdist.data.pipeline.options import TuningOptions
    from tfdist.data.pipeline.reading import _how_to_read

    tuning = TuningOptions(num_parallel_reads=reads)  # type: ignore[arg-type]
    assert _how_to_read([f"/d/{i}" for i in range(files)], streams, tuning, local, policy) == expected


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("file", id="file"),
        pytest.param("data", id="data"),
    ],
)
def test_two_workers_read_every_record_once_under_the_natural_mix(tmp_path: Path, policy: str) -> None:
    prefix = os.path.join(tmp_path, "t")
    write_tfrecords(_halving(1201), prefix, num_shards=6, partition_by="label")
    seen: collections.Counter = collections.Counter()
    for worker in range(2):
        pipeline = TFRecordPipeline(
            files=f"{prefix}-*",
            features=FEATURES,
            batch_size=16,
            label_key="label",
            class_weights="natural",
            shard_policy=policy,
            deterministic=True,
            seed=3,
        )
        context = tf.distribute.InputContext(2, worker, 2)
        seen.update(int(v) for batch in pipeline.dataset(context) for v in batch["id"].numpy())
    assert seen == collections.Counter(range(1201))


@pytest.mark.parametrize(
    "table, paths, local",
    [
        ("27 1 254:0 / / rw - ext4 /dev/vda rw\n", ["/data/a", "/tmp/b"], True),
        (
            "27 1 254:0 / / rw - ext4 /dev/vda rw\n40 27 0:50 / /mnt/nfs rw - nfs4 srv:/x rw\n",
            ["/data/a", "/mnt/nfs/b"],
            False,
        ),
        (
            "27 1 254:0 / / rw - xfs /dev/vda rw\n41 27 0:51 / /gcs rw,nosuid - fuse.gcsfuse bucket rw\n",
            ["/gcs/a"],
            False,
        ),
        (
            "27 1 254:0 / / rw - lustre mds@tcp:/fs rw\n42 27 0:52 / /scratch\\040space rw - tmpfs tmpfs rw\n",
            ["/scratch space/a"],
            True,
        ),
        ("27 1 254:0 / / rw - ext4 /dev/vda rw\n", ["s3://bucket/a"], False),
        ("", ["/data/a"], False),  # No mount table: read ahead in parallel, as before.
    ],
)
def test_on_local_disk_takes_the_longest_mount_point(table: str, paths: list[str], local: bool) -> None:
    from tfdist.data.records.files import on_local_disk

    assert on_local_disk(paths, table) is local
