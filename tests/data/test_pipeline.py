"""Data layer: writer, exactly-once sharding, stratified sampling, corrupt files, images, service, reports."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any, cast
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from tests.support.records import FEATURES
from tests.support.records import example as _example
from tests.support.records import ids as _ids
from tfdist import DataError, StorageError, testing
from tfdist.data import TFRecordPipeline, read_manifest, stratified_sample, write_tfrecords
from tfdist.data.records._framing import check_file, crc32c
from tfdist.data.report import skew_report
from tfdist.data.service import LocalDataService


def _skewed(n: int = 1000) -> list[tf.train.Example]:
    """90/9/1 classes, ids 0..n-1."""
    labels = [0] * (n * 90 // 100) + [1] * (n * 9 // 100) + [2] * (n - n * 99 // 100)
    return [_example(i, label) for i, label in enumerate(labels)]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def test_names_balance_and_manifest(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "train")
    paths = write_tfrecords((e.SerializeToString() for e in _skewed(103)), prefix, num_shards=4)
    assert [os.path.basename(p) for p in paths] == [f"train-0000{i}-of-00004.tfrecord" for i in range(4)]
    manifest = read_manifest(prefix)
    assert manifest is not None
    counts = [manifest["files"][p]["records"] for p in paths]
    assert (sum(counts), max(counts) - min(counts)) == (103, 1)
    assert all(check_file(p).records == manifest["files"][p]["records"] for p in paths)


def test_partition_by_label_and_gzip(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "part")
    seen: list[int] = []
    paths = write_tfrecords(
        _skewed(),
        prefix,
        num_shards=2,
        compression="GZIP",
        partition_by="label",
        progress=seen.append,
        log_every=500,
    )
    assert [os.path.basename(p) for p in paths][:2] == [
        "part-label=0-00000-of-00002.tfrecord.gz",
        "part-label=0-00001-of-00002.tfrecord.gz",
    ]
    assert len(paths) == 6
    assert seen[-1] == 1000
    assert cast("dict[str, Any]", read_manifest(prefix))["classes"] == {"0": 900, "1": 90, "2": 10}
    for path in paths:  # Really gzip: the magic bytes, and a stream gzip can read to its end.
        with open(path, "rb") as f:
            assert f.read(2) == b"\x1f\x8b"
        with gzip.open(path) as f:
            assert len(f.read()) > 0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        pytest.param({"num_shards": 0}, "`num_shards`. Received: 0", id="no_shards"),
        pytest.param({"num_shards": 1, "compression": "zip"}, "None, 'GZIP' or 'ZLIB'", id="compression"),
        pytest.param(
            {"num_shards": 1, "partition_by": "klass"}, r"a feature of every example \(found", id="partition_missing"
        ),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    prefix = os.path.join(tmp_path, "x")
    with pytest.raises(DataError, match=message):
        write_tfrecords(_skewed(10), prefix, **kwargs)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The prefix of 6 shards shared by the sharding tests."""
    # Ids 0..599 written twice (in different shard sets) so 'hash' must keep equal ids together.
    examples = [_example(i % 600, i % 3) for i in range(1200)]
    prefix = os.path.join(tmp_path_factory.mktemp("shard"), "data")
    write_tfrecords(examples, prefix, num_shards=6)
    return prefix


@pytest.mark.parametrize("workers", (2, 3))
@pytest.mark.parametrize("policy", ("file", "data", "hash"))
def test_each_record_exactly_once(sharded: str, workers: int, policy: str) -> None:
    pipeline = TFRecordPipeline(
        files=f"{sharded}-*",
        features=FEATURES,
        batch_size=12,
        shard_policy=policy,
        shard_key="id",
        drop_remainder=False,
        shuffle_buffer=64,
        seed=3,
    )
    per_worker = [_ids(pipeline, workers, w) for w in range(workers)]
    union = collections.Counter(i for ids in per_worker for i in ids)
    assert union == collections.Counter({i: 2 for i in range(600)})
    if policy == "hash":
        owners = [{i for i in ids} for ids in per_worker]
        assert sum(len(o) for o in owners) == 600  # Each id on exactly one worker.


def test_auto_chooses_and_explains(sharded: str) -> None:
    pipeline = TFRecordPipeline(files=f"{sharded}-*", features=FEATURES, batch_size=8)
    assert pipeline.plan(3).policy == "file"
    assert "byte-balanced" in pipeline.plan(3).reason
    assert pipeline.plan(4).policy == "data"  # 6 files over 4 workers: 2-2-1-1 is not balanced.
    assert pipeline.plan(7).policy == "data"
    assert "too few to shard by file" in pipeline.plan(7).reason
    assert pipeline.plan(1).policy == "off"


def test_file_policy_with_too_few_files(sharded: str) -> None:
    pipeline = TFRecordPipeline(files=f"{sharded}-*", features=FEATURES, batch_size=8, shard_policy="file")
    with pytest.raises(DataError, match=r"Only 6 file\(s\): use shard_policy='data' or 'auto'"):
        pipeline.plan(8)


def test_batch_must_split_over_replicas(sharded: str) -> None:
    pipeline = TFRecordPipeline(files=f"{sharded}-*", features=FEATURES, batch_size=8)
    with pytest.raises(DataError, match=r"`batch_size`. Received: 8. Expected a global batch divisible by the 3"):
        _ids(pipeline, 3, 0)


def test_tensorflow_auto_shard_is_off(sharded: str) -> None:
    dataset = TFRecordPipeline(files=f"{sharded}-*", features=FEATURES, batch_size=8).dataset()
    assert dataset.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_balanced_mix_from_90_9_1(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "part")
    write_tfrecords(_skewed(), prefix, num_shards=2, partition_by="label")
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=FEATURES,
        batch_size=100,
        label_key="label",
        class_weights="balanced",
        num_epochs=None,
        seed=1,
    )
    labels = [int(v) for batch in pipeline.dataset().take(300) for v in batch["label"].numpy()]
    shares = np.bincount(labels, minlength=3) / len(labels)
    np.testing.assert_allclose(shares, [1 / 3] * 3, atol=0.02)
    for worker in range(2):  # Each worker's share keeps the mix too.
        context = tf.distribute.InputContext(2, worker, 2)
        labels = [int(v) for b in pipeline.dataset(context).take(300) for v in b["label"].numpy()]
        np.testing.assert_allclose(np.bincount(labels, minlength=3) / len(labels), [1 / 3] * 3, atol=0.02)


def test_class_order_is_numeric_and_small_groups_fall_back_to_data(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "many")
    write_tfrecords([_example(i, i % 12) for i in range(240)], prefix, num_shards=1, partition_by="label")
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=FEATURES,
        batch_size=24,
        label_key="label",
        class_weights="balanced",
        shard_policy="file",
        seed=0,
    )
    assert list(pipeline.class_groups()) == [str(c) for c in range(12)]
    seen = []
    for worker in range(2):  # One file per class, two workers: each class is split by record.
        seen += _ids(pipeline, 2, worker)
    assert len(seen) == 240
    assert set(seen) == set(range(240))  # 240 distinct ids: none duplicated, none lost.


def test_unpartitioned_fallback_resamples(tmp_path: Path) -> None:
    # Rejection resampling reads sum(p/a) records per output: ~3 here (60/30/10), ~50 for 90/9/1 data.
    prefix = os.path.join(tmp_path, "plain")
    write_tfrecords([_example(i, 0 if i < 600 else 1 if i < 900 else 2) for i in range(1000)], prefix, num_shards=2)
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=FEATURES,
        batch_size=100,
        label_key="label",
        class_weights={0: 1, 1: 1, 2: 2},
        num_classes=3,
        num_epochs=None,
        seed=1,
    )
    labels = [int(v) for batch in pipeline.dataset().take(100) for v in batch["label"].numpy()]
    np.testing.assert_allclose(np.bincount(labels, minlength=3) / len(labels), [0.25, 0.25, 0.5], atol=0.03)
    with pytest.raises(DataError, match="Pass num_classes"):
        TFRecordPipeline(
            files=f"{prefix}-*", features=FEATURES, batch_size=10, label_key="label", class_weights="balanced"
        ).dataset()


@pytest.mark.parametrize(
    "scheme,expected",
    [
        pytest.param("natural", [0.9, 0.1], id="natural"),
        pytest.param("sqrt", [0.75, 0.25], id="sqrt"),
    ],
)
def test_weight_schemes(scheme: str, expected: list) -> None:
    datasets = {"a": tf.data.Dataset.from_tensors("a"), "b": tf.data.Dataset.from_tensors("b")}
    sample = stratified_sample(datasets, scheme, counts={"a": 900, "b": 100}, seed=0).take(20000)
    counts = collections.Counter(v.decode() for v in sample.as_numpy_iterator())
    np.testing.assert_allclose([counts["a"] / 20000, counts["b"] / 20000], expected, atol=0.02)


def test_variable_weights_change_the_mix_live() -> None:
    weights = tf.Variable([1.0, 0.0])
    datasets = [tf.data.Dataset.from_tensors(0), tf.data.Dataset.from_tensors(1)]
    iterator = iter(stratified_sample(datasets, weights, seed=0))
    assert {int(next(iterator)) for _ in range(50)} == {0}
    weights.assign([0.0, 1.0])
    after = [int(next(iterator)) for _ in range(100)]
    assert set(after[40:]) == {1}  # After the elements already prefetched (2-14 seen here).


def test_exhausted_policies() -> None:
    datasets = [tf.data.Dataset.range(3), tf.data.Dataset.range(100, 200)]
    stop = list(stratified_sample(datasets, "balanced", seed=0, on_exhausted="stop").as_numpy_iterator())
    drop = list(stratified_sample(datasets, "balanced", seed=0, on_exhausted="drop").as_numpy_iterator())
    assert len(stop) < 103
    assert len(drop) == 103
    with pytest.raises(DataError, match="did you mean 'repeat'"):
        stratified_sample(datasets, "balanced", on_exhausted="repeats")


@pytest.mark.parametrize(
    "weights,message",
    [
        pytest.param("balance", "did you mean 'balanced'", id="unknown_scheme"),
        pytest.param({"a": 1.0}, r"missing \['b'\]", id="missing_class"),
        pytest.param({"a": -1.0, "b": 1.0}, "finite weights >= 0", id="negative"),
    ],
)
def test_bad_weights(weights: object, message: str) -> None:
    datasets = {"a": tf.data.Dataset.from_tensors(0), "b": tf.data.Dataset.from_tensors(1)}
    with pytest.raises(DataError, match=message):
        stratified_sample(datasets, weights)


def _files(directory: Path) -> tuple[str, str]:
    prefix = os.path.join(directory, "d")
    good, bad = write_tfrecords(_skewed(200), prefix, num_shards=2)
    return good, bad


def test_truncated_file_raises_naming_it(tmp_path: Path) -> None:
    good, bad = _files(tmp_path)
    data = _read(bad)
    _write(bad, data[: len(data) // 2])
    pipeline = TFRecordPipeline(files=[good, bad], features=FEATURES, batch_size=10)
    with pytest.raises(DataError, match=rf"Corrupt TFRecord file {bad}: truncated record at byte \d+"):
        pipeline.dataset()


def test_garbage_file_raises_naming_it(tmp_path: Path) -> None:
    good, bad = _files(tmp_path)
    _write(bad, os.urandom(3000))
    with pytest.raises(DataError, match=rf"{bad}: corrupt record header at byte 0"):
        TFRecordPipeline(files=[good, bad], features=FEATURES, batch_size=10).dataset()


def test_skip_keeps_the_good_records_and_counts_the_loss(tmp_path: Path) -> None:
    good, bad = _files(tmp_path)
    data = _read(bad)
    _write(bad, data[: len(data) // 2] + b"\x00" * 7)
    pipeline = TFRecordPipeline(
        files=[good, bad], features=FEATURES, batch_size=10, on_corrupt="skip", drop_remainder=False
    )
    kept = sum(len(b["id"]) for b in pipeline.dataset())
    report = pipeline.last_report
    assert report["corrupt_files"] == [bad]
    assert kept == 100 + report["records_kept_from_corrupt"]
    assert (report["records_lost"], report["records_lost_exact"]) == (
        100 - report["records_kept_from_corrupt"],
        True,
    )  # Exact: the writer's manifest.


def test_compressed_files_are_checked_with_verify_all(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "z")
    good, bad = write_tfrecords(_skewed(200), prefix, num_shards=2, compression="GZIP")
    raw = gzip.decompress(_read(bad))
    _write(bad, gzip.compress(raw[:-5]))
    with pytest.raises(DataError, match=rf"{bad}: truncated record"):
        TFRecordPipeline(files=[good, bad], features=FEATURES, batch_size=10, verify="all").dataset()


def test_crc32c_known_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_a_file_that_cannot_be_read_is_a_storage_error(tmp_path: Path) -> None:
    # One rule for every framing walk (verification and stratified counting alike): no raw OSError.
    missing = os.path.join(tmp_path, "gone.tfrecord")
    for compression in (None, "GZIP"):
        with pytest.raises(StorageError, match="Cannot read .*gone.tfrecord") as caught:
            check_file(missing, compression)
        assert not isinstance(caught.value, ValueError)
        assert caught.value.value == missing


def test_the_first_bad_header_is_named_exactly(tmp_path: Path) -> None:
    # The walk checks all length CRCs at once: the report must still name the first bad one.
    good, _ = _files(tmp_path)
    data = bytearray(_read(good))
    offsets, offset = [], 0
    while offset < len(data):
        offsets.append(offset)
        offset += 16 + int.from_bytes(data[offset : offset + 8], "little")
    for index in (0, 3, len(offsets) - 1):
        damaged = bytearray(data)
        damaged[offsets[index] + 8] ^= 0x40  # The stored CRC of this record's length.
        damaged[offsets[-1] + 8] ^= 0x01 if index != len(offsets) - 1 else 0  # A later bad one too.
        _write(good, bytes(damaged))
        check = check_file(good)
        assert (check.records, check.valid_bytes) == (index, offsets[index])
        assert check.problem == (
            f"corrupt record header at byte {offsets[index]} (is this a TFRecord "
            "file, and is its compression set right?)"
        )
    _write(good, b"")
    assert (check_file(good).records, check_file(good).ok) == (0, True)


def test_one_crc_pass_over_many_files_names_each_files_own_problem(tmp_path: Path) -> None:
    # check_files checks the length CRCs of all files at once; each report must stay with its file. The
    # big file (over 1 MB) is memory-mapped, the small ones are read whole.
    from tfdist.data.records._framing import check_files

    root = str(tmp_path)
    # Round robin over 3 shards: records 0, 3, 6, ... (the big ones) go to the first file.
    paths = write_tfrecords(
        [_example(i, i % 2, payload=b"x" * (40_000 if i % 3 == 0 else 10)) for i in range(90)],
        os.path.join(root, "m"),
        num_shards=3,
    )
    assert os.path.getsize(paths[0]) > 1 << 20
    assert os.path.getsize(paths[1]) < 1 << 20
    expected = [check_file(p) for p in paths]
    assert all(c.ok for c in expected)
    for damaged in range(3):
        data = bytearray(_read(paths[damaged]))
        data[8] ^= 0x10  # The first record's length CRC.
        _write(paths[damaged], bytes(data))
        checks = check_files(paths, [None] * 3)
        assert [c.path for c in checks] == paths
        for index, check in enumerate(checks):
            if index == damaged:
                assert (check.records, check.valid_bytes, check.ok) == (0, 0, False)
                assert check.problem is not None
                assert "corrupt record header at byte 0" in check.problem
            else:
                assert check == expected[index]
        _write(paths[damaged], bytes(data[:8]) + bytes([data[8] ^ 0x10]) + bytes(data[9:]))
    _write(paths[1], _read(paths[1])[:-3])  # Truncated: the walk stops, no CRC is wrong.
    checks = check_files(paths, [None] * 3)
    assert [c.ok for c in checks] == [True, False, True]
    assert checks[1].records == expected[1].records - 1
    assert checks[1].problem is not None
    assert "truncated record at byte" in checks[1].problem


def test_headers_read_one_pread_each_match_the_mapped_walk(tmp_path: Path) -> None:
    # Files whose first record is 16 KB or more are walked by pread (one page fault per header saved); the
    # walk must find the same offsets, header bytes, record count and problem as through a memory map.
    import mmap

    from tfdist.data.records import _framing

    path = write_tfrecords(
        [_example(i, i % 2, payload=b"y" * 20_000) for i in range(60)],
        os.path.join(tmp_path, "p"),
        num_shards=1,
    )[0]
    sound = _read(path)
    assert len(sound) > 1 << 20
    variants = {
        "sound": sound,
        "truncated_record": sound[:-7],
        "truncated_header": sound + b"\0" * 5,
        "bad_crc": sound[:8] + bytes([sound[8] ^ 1]) + sound[9:],
    }
    for name, data in variants.items():
        _write(path, data)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            by_map = _framing._walk(mapped, path)
            by_reads = _framing._walk_reads(f.fileno(), len(data), path)
        assert (by_reads.records, by_reads.end, by_reads.problem) == (by_map.records, by_map.end, by_map.problem), name
        assert by_reads.offsets.tolist() == by_map.offsets.tolist(), name
        assert by_reads.rows.tolist() == by_map.rows.tolist(), name
        assert check_file(path) == _framing._checked([by_map])[0], name  # check_file takes the pread walk.
    assert (
        check_file(path).problem
        == "corrupt record header at byte 0 (is this a TFRecord file, and is its compression set right?)"
    )


def test_a_cache_replays_the_records_not_one_shuffled_order(tmp_path: Path) -> None:
    # The cache holds one pass of records before shuffle and repeat: each pass over the dataset (each Keras
    # epoch) is shuffled anew and complete; stratified reading refuses a cache (it would replay one draw).
    prefix = os.path.join(tmp_path, "c")
    write_tfrecords([_example(i, i % 2) for i in range(64)], prefix, num_shards=2)
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*", features=FEATURES, batch_size=8, shuffle_buffer=64, seed=3, cache=True
    )
    dataset = pipeline.dataset()
    passes = [[int(v) for b in dataset for v in b["id"].numpy()] for _ in range(3)]
    assert all(sorted(p) == list(range(64)) for p in passes), passes
    assert len({tuple(p) for p in passes}) > 1, "every pass replayed the first shuffled order"
    endless = dataclasses.replace(cast(Any, pipeline), num_epochs=None).dataset()
    assert sum(int(b["id"].shape[0]) for b in endless.take(24)) == 192  # 3 passes, still bounded
    grouped = os.path.join(tmp_path, "g")
    write_tfrecords([_example(i, i % 2) for i in range(16)], grouped, num_shards=1, partition_by="label")
    with pytest.raises(DataError, match="`cache`. Received: True. Expected False with stratified reading"):
        TFRecordPipeline(
            files=f"{grouped}-*",
            features=FEATURES,
            batch_size=4,
            label_key="label",
            class_weights="balanced",
            cache=True,
        ).dataset()


def test_images_decoded_resized_and_supervised(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "img")
    jpeg = tf.io.encode_jpeg(np.full((20, 30, 3), 200, np.uint8)).numpy()
    png = tf.io.encode_png(np.full((8, 8, 3), 100, np.uint8)).numpy()
    write_tfrecords([_example(i, i % 2, image=jpeg if i % 2 else png) for i in range(10)], prefix, num_shards=2)
    features = dict(FEATURES, image=tf.io.FixedLenFeature([], tf.string))
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=features,
        batch_size=4,
        image_key="image",
        image_size=(16, 16),
        label_key="label",
        as_supervised=True,
        augment=True,
        seed=1,
    )
    x, y = next(iter(pipeline.dataset()))
    assert (x["image"].shape, x["image"].dtype, y.shape) == ((4, 16, 16, 3), tf.float32, (4,))
    assert "label" not in x
    assert 0.0 <= float(tf.reduce_min(x["image"])) <= float(tf.reduce_max(x["image"])) <= 1.0


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param([], id="scalar"),
        pytest.param([1], id="one_value"),
    ],
)
def test_batched_decoding_gives_the_pixels_of_a_per_image_chain(tmp_path: Path, shape: list) -> None:
    # Per batch: decode and resize each image, then one / 255 for the batch; the pixels must be the
    # chain's (decode, resize, / 255 per image). A [1]-shaped bytes feature is reshaped per image.
    prefix = os.path.join(tmp_path, "px")
    rng = np.random.default_rng(0)
    jpegs = [tf.io.encode_jpeg(rng.integers(0, 255, (24 + i, 20, 3), np.uint8)).numpy() for i in range(6)]
    write_tfrecords([_example(i, 0, image=jpegs[i]) for i in range(6)], prefix, num_shards=1)
    features = dict(FEATURES, image=tf.io.FixedLenFeature(shape, tf.string))
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*", features=features, batch_size=6, image_key="image", image_size=(12, 10)
    )
    batch = next(iter(pipeline.dataset()))
    expected = [tf.image.resize(tf.io.decode_jpeg(jpegs[i], channels=3), (12, 10)) / 255.0 for i in batch["id"].numpy()]
    np.testing.assert_array_equal(batch["image"].numpy(), np.stack(expected))


def test_parse_fn_and_epochs(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "p")
    write_tfrecords(_skewed(50), prefix, num_shards=1)
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        batch_size=10,
        num_epochs=3,
        parse_fn=lambda r: tf.io.parse_single_example(r, FEATURES)["id"] * 2,
    )
    values = [int(v) for b in pipeline.dataset() for v in b.numpy()]
    assert collections.Counter(values) == collections.Counter({2 * i: 3 for i in range(50)})


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param({"files": []}, "a glob or a non-empty list", id="no_files"),
        pytest.param({"batch_size": 0}, r"`batch_size`. Received: 0", id="batch"),
        pytest.param({"parse_fn": len}, "exactly one of `features` and `parse_fn`", id="both_parsers"),
        pytest.param({"shard_policy": "files"}, "did you mean 'file'", id="policy"),
        pytest.param({"shard_policy": "hash"}, "`shard_key`.*'user_id'", id="hash_without_key"),
        pytest.param({"label_key": "y"}, r"a feature of `features` \(\['id', 'label'\]\)", id="label_not_a_feature"),
        pytest.param({"as_supervised": True}, "`label_key`", id="supervised_without_label"),
        pytest.param({"image_key": "id"}, "image_key and image_size together", id="image_without_size"),
        pytest.param({"data_service": "localhost:5000"}, "'grpc://host:port'", id="service_address"),
        pytest.param({"on_corrupt": "ignore"}, "`on_corrupt`", id="on_corrupt"),
    ],
)
def test_invalid_config(overrides: dict, message: str) -> None:
    fields = dict(files="x-*", features=FEATURES, batch_size=8)
    fields.update(overrides)
    with pytest.raises(DataError, match=message):
        TFRecordPipeline(**fields)


def test_missing_files_and_unknown_scheme() -> None:
    with pytest.raises(DataError, match="a pattern that matches at least one file"):
        TFRecordPipeline(files="/nonexistent/x-*", features=FEATURES, batch_size=8).dataset()
    with pytest.raises(DataError, match="Check the scheme's spelling"):
        TFRecordPipeline(files="s4://bucket/x-*", features=FEATURES, batch_size=8).dataset()


def test_data_service_gives_each_record_once(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "svc")
    write_tfrecords(_skewed(300), prefix, num_shards=3)
    handed: list = []  # The options of the graph the service's workers run (set before `distribute`).
    real = tf.data.experimental.service.distribute

    def distribute(*args, **kwargs):
        apply = real(*args, **kwargs)
        return lambda dataset: handed.append(dataset.options()) or apply(dataset)  # type: ignore[func-returns-value]

    with (
        LocalDataService(num_workers=2) as service,
        mock.patch.object(tf.data.experimental.service, "distribute", distribute),
    ):
        pipeline = TFRecordPipeline(
            files=f"{prefix}-*",
            features=FEATURES,
            batch_size=10,
            data_service=service.address,
            drop_remainder=False,
        )
        ids = [int(v) for b in pipeline.dataset() for v in b["id"].numpy()]
    assert sorted(ids) == list(range(300))
    assert len(handed) == 1
    assert handed[0].autotune.enabled is False


def test_classes_sort_by_number() -> None:
    """Issue 26 item 9: classes 0 1 2 ... 10 11, not 0 1 10 11 2; other labels after, as text."""
    from tfdist.data import SkewReport

    counts = {"10": 3, "2": 5, "0": 7, "11": 1, "1": 2, "other": 4}
    report = SkewReport(
        policy="file", reason="", label_key="y", worker_records=(22,), worker_bytes=(1,), worker_classes=(counts,)
    )
    assert list(report.global_classes) == ["0", "1", "2", "10", "11", "other"]
    header = next(line for line in report.to_text().splitlines() if "10" in line and "other" in line)
    assert header.index(" 2 ") < header.index(" 10 "), header


def test_report_numbers_and_cli(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "r")
    write_tfrecords(_skewed(), prefix, num_shards=4)
    report = skew_report(f"{prefix}-*", label_key="label", num_workers=2, shard_policy="file")
    assert report.worker_records == (500, 500)
    assert report.global_classes == {"0": 900, "1": 90, "2": 10}
    assert max(report.class_divergence) < 0.01
    assert "class_weights='sqrt'" in report.to_text()
    skewed = skew_report(f"{prefix}-*", label_key="label", num_workers=3, shard_policy="file")
    assert skewed.record_imbalance > 1.3
    assert "Workers read unequal shares" in " ".join(skewed.advice())
    png = os.path.join(tmp_path, "skew.png")
    done = testing.run_python(
        [
            sys.executable,
            "-m",
            "tfdist.cli.main",
            "data-report",
            f"{prefix}-*",
            "--label-key",
            "label",
            "--workers",
            "3",
            "--shard-policy",
            "hash",
            "--shard-key",
            "id",
            "--json",
            "--plot",
            png,
        ],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["policy"], sum(data["worker_records"])) == ("hash", 1000)
    assert os.path.getsize(png) > 1000
    bad = testing.run_python(
        [
            sys.executable,
            "-m",
            "tfdist.cli.main",
            "data-report",
            "/nonexistent-*",
            "--label-key",
            "label",
            "--workers",
            "2",
        ],
        timeout=120,
    )
    assert bad.returncode == 2
    assert "matches at least one file" in bad.stderr


def test_weight_moves_to_the_class_with_high_loss() -> None:
    from tfdist import keras
    from tfdist.keras.adaptive import AdaptiveClassWeights, reweight

    assert reweight([0.5, 0.5], [1.0, 1.0], rate=1.0, floor=0.0) == [0.5, 0.5]
    rng = np.random.default_rng(0)
    x0, x1 = rng.normal(size=(256, 4)).astype("float32"), rng.normal(size=(256, 4)).astype("float32")
    easy = tf.data.Dataset.from_tensor_slices((x0, np.zeros(256, "int64")))  # Class 0: constant label.
    hard = tf.data.Dataset.from_tensor_slices((x1, rng.integers(0, 2, 256)))  # Class 1: noise labels.
    weights = tf.Variable([0.5, 0.5])
    train = stratified_sample([easy, hard], weights, seed=0).batch(32).take(20)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.Adam(0.05), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    callback = AdaptiveClassWeights(weights, per_class_data={0: easy.batch(64), 1: hard.batch(64)}, rate=1.0)
    model.fit(train, epochs=3, verbose=0, callbacks=[callback])
    assert len(callback.history) == 3
    assert float(weights[1]) > 0.6  # The noisy class keeps a high loss and gains weight.
    assert float(tf.reduce_sum(weights)) == pytest.approx(1.0, abs=0.5e-5)


@pytest.mark.parametrize(
    "options",
    (
        pytest.param({}, id="resumable"),
        pytest.param({"order": "buffer", "shuffle_buffer": 32}, id="buffer"),
        pytest.param({"parse_fn": lambda r: tf.io.parse_single_example(r, FEATURES)}, id="parse_fn"),
        pytest.param({"class_weights": "balanced", "label_key": "label"}, id="stratified"),
    ),
)
@pytest.mark.parametrize("workers", (1, 2))
def test_an_endless_pipeline_has_a_static_batch_size_without_drop_remainder(
    tmp_path: Path, options: dict, workers: int
) -> None:
    """Issue 50: an endless stream has no partial batch, so it feeds a DTensor mesh without drop_remainder."""
    prefix = os.path.join(tmp_path, "p")
    write_tfrecords(_skewed(200), prefix, num_shards=2, partition_by="label")
    kwargs = dict(files=f"{prefix}-*", batch_size=12, seed=5, **options)
    kwargs.setdefault("features", FEATURES)
    if "parse_fn" in kwargs:
        del kwargs["features"]
    context = tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=0, num_replicas_in_sync=2)
    per_replica = 6
    endless = TFRecordPipeline(num_epochs=None, drop_remainder=False, **kwargs).dataset(context)
    for spec in tf.nest.flatten(endless.element_spec):
        assert spec.shape[0] == per_replica, (options, spec)
    for batch in endless.take(40):  # 240 records from 200 (or its worker's 100): past an epoch's end.
        assert all(int(t.shape[0]) == per_replica for t in tf.nest.flatten(batch))
    finite = TFRecordPipeline(num_epochs=1, drop_remainder=False, **kwargs).dataset(context)
    if "class_weights" not in options:  # Finite stratified draws are whole steps by design; the rest keep a tail.
        assert any(spec.shape[0] is None for spec in tf.nest.flatten(finite.element_spec)), (options, finite)
