"""Bad input and faults in the data layer: a clear tfdist error or a complete result, never silent loss."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import tensorflow as tf

from tests.support.records import FEATURES, example
from tfdist import DataError, StorageError, testing
from tfdist.data import TFRecordPipeline, read_manifest, stratified_sample, write_tfrecords
from tfdist.data.records._examples import label_name
from tfdist.data.records.files import list_files


def _example(i: int, label: Any = None) -> tf.train.Example:
    return example(i, i % 3 if label is None else label)


def _ids(pattern: str | Sequence[str], **kwargs: Any) -> list[int]:
    pipeline = TFRecordPipeline(files=pattern, features=FEATURES, batch_size=16, **kwargs)
    return [int(v) for b in pipeline.dataset() for v in b["id"].numpy()]


def _contents(root: str) -> dict[str, bytes]:
    out = {}
    for path in _tree(root):
        with open(os.path.join(root, path), "rb") as f:
            out[path] = f.read()
    return out


def _tree(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_a_failed_rewrite_leaves_the_previous_dataset(tmp_path: Path) -> None:
    root = str(tmp_path)
    prefix = os.path.join(root, "part")
    write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=2)
    before = _contents(root)

    def failing() -> Any:
        for i in range(10):
            yield _example(100 + i)
        raise OSError("source went away")

    with pytest.raises(OSError, match="source went away"):
        write_tfrecords(failing(), prefix, num_shards=2)
    assert _contents(root) == before
    assert sorted(_ids(f"{prefix}-*")) == list(range(40))
    assert cast("dict[str, Any]", read_manifest(prefix))["records"] == 40


def test_a_rewrite_with_fewer_shards_replaces_the_old_ones(tmp_path: Path) -> None:
    root = str(tmp_path)
    prefix = os.path.join(root, "part")
    write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=4)
    write_tfrecords((_example(i) for i in range(40)), os.path.join(root, "part-other"), num_shards=1)
    paths = write_tfrecords((_example(i) for i in range(40, 80)), prefix, num_shards=2)
    assert _tree(root) == (
        sorted(
            [
                "part-00000-of-00002.tfrecord",
                "part-00001-of-00002.tfrecord",
                "part-manifest.json",
                "part-other-00000-of-00001.tfrecord",
                "part-other-manifest.json",
            ]
        )
    )
    assert sorted(_ids(paths)) == list(range(40, 80))


def test_prefixes_that_look_like_class_groups_keep_their_own_shards(tmp_path: Path) -> None:
    # 'part-v=2' has the shape of a class group of 'part' (PREFIX-KEY=VALUE-...): a rewrite of either must
    # neither keep its own old shards nor delete the other dataset's.
    root = str(tmp_path)
    versioned, plain = os.path.join(root, "part-v=2"), os.path.join(root, "part")
    write_tfrecords((_example(i) for i in range(40)), versioned, num_shards=4)
    write_tfrecords((_example(i) for i in range(40, 60)), plain, num_shards=1)
    write_tfrecords((_example(i) for i in range(60, 80)), versioned, num_shards=2)
    write_tfrecords((_example(i) for i in range(80, 90)), plain, num_shards=1)
    assert _tree(root) == (
        sorted(
            [
                "part-v=2-00000-of-00002.tfrecord",
                "part-v=2-00001-of-00002.tfrecord",
                "part-v=2-manifest.json",
                "part-00000-of-00001.tfrecord",
                "part-manifest.json",
            ]
        )
    )
    assert sorted(_ids(f"{versioned}-0*")) == list(range(60, 80))
    assert sorted(_ids(f"{plain}-0*")) == list(range(80, 90))
    # Without a manifest, only this prefix's own shard names count as old (and this write's class groups).
    os.remove(f"{plain}-manifest.json")
    write_tfrecords((_example(i) for i in range(90, 99)), plain, num_shards=1, partition_by="label")
    assert [p for p in _tree(root) if p.startswith("part-v=2")] == [
        "part-v=2-00000-of-00002.tfrecord",
        "part-v=2-00001-of-00002.tfrecord",
        "part-v=2-manifest.json",
    ]
    assert "part-00000-of-00001.tfrecord" not in _tree(root)


def test_a_prefix_that_looks_like_a_class_group_finds_its_own_manifest(tmp_path: Path) -> None:
    # 'part-label=2-00000-of-00002.tfrecord' is a shard of the prefix 'part-label=2', or of class 2 of 'part'
    # partitioned by label. The listing looked only for 'part-manifest.json', so the counts were unknown.
    root = str(tmp_path)
    versioned = os.path.join(root, "part-label=2")
    write_tfrecords((_example(i) for i in range(10)), versioned, num_shards=2)
    listing = list_files([f"{versioned}-0*"])
    assert [(f.records, f.label) for f in listing.files] == [(5, None), (5, None)]
    # Both at once: 'part' by label writes the same names for class 2 and replaces those files, so two
    # manifests name them; the one that matches the files wins (the other says 5 records of no class).
    labels = {i: 2 if i < 16 else 1 for i in range(10, 20)}
    write_tfrecords(
        (_example(i, labels[i]) for i in labels), os.path.join(root, "part"), num_shards=2, partition_by="label"
    )
    assert os.path.exists(f"{versioned}-manifest.json")
    listing = list_files([f"{versioned}-0*"])
    assert [(f.records, f.label) for f in listing.files] == [(3, "2"), (3, "2")]
    assert sorted(_ids(f"{versioned}-0*", verify="all")) == list(range(10, 16))


def test_a_prefix_under_a_file_is_a_storage_error(tmp_path: Path) -> None:
    root = str(tmp_path)
    blocker = os.path.join(root, "file")
    with open(blocker, "w") as f:
        f.write("x")
    with pytest.raises(StorageError, match="Cannot create"):
        write_tfrecords([_example(0)], os.path.join(blocker, "sub", "part"), num_shards=1)


@pytest.mark.parametrize(
    "item",
    [
        pytest.param("abc", id="text"),
        pytest.param(123, id="int"),
        pytest.param(None, id="none"),
        pytest.param({"id": 1}, id="dict"),
    ],
)
def test_items_that_are_not_examples_are_rejected_and_nothing_is_written(tmp_path: Path, item: Any) -> None:
    root = str(tmp_path)
    with pytest.raises(DataError, match=r"`examples\[2\]`.*Expected a tf.train.Example or serialized bytes"):
        write_tfrecords([_example(0), _example(1), item], os.path.join(root, "x"), num_shards=2)
    assert _tree(root) == []


@pytest.mark.parametrize(
    "label",
    [
        pytest.param("/../../ESCAPED", id="traversal"),
        pytest.param("a/b", id="slash"),
        pytest.param("a\nb", id="newline"),
        pytest.param("x" * 300, id="long"),
        pytest.param("..", id="dots"),
        pytest.param("50%", id="percent"),
        pytest.param("a~b", id="tilde"),
        pytest.param("chat-ü", id="unicode"),
    ],
)
def test_labels_stay_inside_and_read_back(tmp_path: Path, label: str) -> None:
    root = str(tmp_path)
    target = os.path.join(root, "data")
    paths = write_tfrecords(
        [_example(i, label if i % 2 else "plain") for i in range(10)],
        os.path.join(target, "part"),
        num_shards=1,
        partition_by="label",
    )
    assert all(os.path.dirname(p) == target for p in paths)
    assert all(f.startswith("data/") for f in _tree(root))
    assert all("\n" not in p and len(os.path.basename(p)) < 200 for p in paths)
    manifest = read_manifest(os.path.join(target, "part"))
    assert manifest is not None
    assert manifest["classes"] == {"plain": 5, label: 5}
    features = {"id": FEATURES["id"], "label": tf.io.FixedLenFeature([], tf.string)}
    pipeline = TFRecordPipeline(
        files=os.path.join(target, "part-*"),
        features=features,
        batch_size=4,
        label_key="label",
        class_weights="natural",
    )
    assert sorted(pipeline.class_groups()) == sorted(["plain", label])
    assert sorted(int(v) for b in pipeline.dataset() for v in b["id"].numpy()) == list(range(10))


@pytest.mark.parametrize(
    "label,message",
    [
        pytest.param(b"\xff\xfe", "a UTF-8 label", id="not_utf8"),
        pytest.param("", "a non-empty label", id="empty"),
    ],
)
def test_labels_that_cannot_be_classes_are_rejected(tmp_path: Path, label: Any, message: str) -> None:
    root = str(tmp_path)
    with pytest.raises(DataError, match=message):
        write_tfrecords([_example(0), _example(1, label)], os.path.join(root, "p"), num_shards=1, partition_by="label")
    assert _tree(root) == []


def test_label_names_are_safe() -> None:
    assert label_name("/../x") == "%2F..%2Fx"
    assert len(label_name("é" * 300)) <= 100
    assert label_name("x" * 300) != label_name("x" * 299 + "y")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages logged at WARNING or above under ``tfdist.data`` (what assertLogs("tfdist.data") saw)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("tfdist.data") and r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """50 records written twice, plain and GZIP, shared by the pipeline-error tests."""
    root = str(tmp_path_factory.mktemp("hostile"))
    write_tfrecords((_example(i) for i in range(50)), os.path.join(root, "plain"), num_shards=2)
    write_tfrecords((_example(i) for i in range(50)), os.path.join(root, "gz"), num_shards=2, compression="GZIP")
    return root


@pytest.fixture
def plain(data_root: str) -> str:
    return os.path.join(data_root, "plain")


@pytest.fixture
def gz(data_root: str) -> str:
    return os.path.join(data_root, "gz")


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param(
            {"features": {"nope": tf.io.FixedLenFeature([], tf.int64)}}, r"features\['nope'\]", id="missing_key"
        ),
        pytest.param(
            {"features": {"id": tf.io.FixedLenFeature([], tf.float32)}}, r"features\['id'\]", id="wrong_dtype"
        ),
        pytest.param({"features": {"id": tf.io.FixedLenFeature([3], tf.int64)}}, r"features\['id'\]", id="wrong_shape"),
        pytest.param({"files": "GZ", "compression": "ZLIB"}, r"`compression`.*starts like GZIP", id="gzip_as_zlib"),
        pytest.param({"compression": "GZIP"}, r"`compression`.*starts like uncompressed TFRecords", id="plain_as_gzip"),
        pytest.param({"cache": "/nonexistent-tfdist/cache"}, r"`cache`.*an existing directory", id="cache_dir"),
        pytest.param(
            {"class_weights": "balanced", "label_key": "label", "num_classes": 2},
            r"`num_classes`. Received: 2.*labels run from 0 to 2",
            id="num_classes",
        ),
        pytest.param({"files": "ROOT"}, r"`files`.*not a directory", id="directory"),
    ],
)
def test_bad_input_is_a_data_error_naming_the_field(
    data_root: str, plain: str, gz: str, overrides: dict[str, Any], message: str
) -> None:
    kwargs: dict[str, Any] = dict(files=f"{plain}-*", features=FEATURES, batch_size=10)
    kwargs.update(overrides)
    kwargs["files"] = {"GZ": f"{gz}-*", "ROOT": data_root}.get(kwargs["files"], kwargs["files"])
    with pytest.raises(DataError, match=message) as caught:
        TFRecordPipeline(**kwargs).dataset()
    assert caught.value.field
    if "features" in overrides:
        assert plain in str(caught.value)  # Names the file too.


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param({"batch_size": 10**12}, "`batch_size`. Received: 1000000000000", id="batch"),
        pytest.param({"private_threadpool_size": 10**6}, "`private_threadpool_size`. Received: 1000000", id="threads"),
        pytest.param({"shuffle_buffer": 10**12}, "`shuffle_buffer`", id="shuffle"),
        pytest.param({"num_classes": 0}, "`num_classes`. Received: 0.", id="num_classes_zero"),
        pytest.param({"num_parallel_reads": 10**9}, "`num_parallel_reads`", id="reads"),
        pytest.param({"cache": 3}, "`cache`", id="cache_type"),
        pytest.param({"image_key": "id", "image_size": (10**9, 2)}, "`image_size`", id="image_size"),
        pytest.param({"features": ["id"]}, "`features`", id="features_type"),
        pytest.param(
            {"deterministic": "no"}, "`deterministic`. Received: 'no'. Expected True or False", id="deterministic"
        ),
        pytest.param({"drop_remainder": 1}, "`drop_remainder`. Received: 1", id="drop_remainder"),
        pytest.param({"as_supervised": None}, "`as_supervised`. Received: None", id="as_supervised"),
        pytest.param(
            {"autotune_model": "on"}, "`autotune_model`. Received: 'on'.*autotune_model=True or", id="autotune_model"
        ),
        pytest.param({"augment": "yes"}, "`augment`. Received: 'yes'", id="augment"),
        pytest.param(
            {"autotune_model": False, "ram_budget_bytes": 1 << 30},
            "`autotune_model`. Received: False. Expected True or None with ram_budget_bytes",
            id="budget_without_model",
        ),
    ],
)
def test_absurd_values_are_bounded(plain: str, overrides: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = dict(files=f"{plain}-*", features=FEATURES, batch_size=10)
    kwargs.update(overrides)
    with pytest.raises(DataError, match=message):
        TFRecordPipeline(**kwargs)


def test_autotuning_model_off_unless_asked(plain: str) -> None:
    """TF's autotuning model stalls iterator deletion (TuningOptions): off by default, on when asked or
    when a RAM budget needs it; the pipeline still reads everything either way."""
    base: dict[str, Any] = dict(files=f"{plain}-*", features=FEATURES, batch_size=10)
    cases: dict[str, tuple[dict[str, Any], bool, int | None]] = {
        "default": ({}, False, None),
        "asked": ({"autotune_model": True}, True, None),
        "budget": ({"ram_budget_bytes": 1 << 30}, True, 1 << 30),
        "asked_with_budget": ({"autotune_model": True, "ram_budget_bytes": 1 << 30}, True, 1 << 30),
        "refused": ({"autotune_model": False}, False, None),
    }
    for name, (extra, enabled, budget) in cases.items():
        dataset = TFRecordPipeline(**base, **extra).dataset()
        options = dataset.options()
        assert options.autotune.enabled is enabled, name
        if budget is not None:
            assert options.autotune.ram_budget == budget, name
        ids = [int(i) for batch in dataset for i in batch["id"]]
        assert sorted(ids) == list(range(50)), name


def test_compression_given_right_reads_everything(gz: str) -> None:
    assert sorted(_ids(f"{gz}-*", compression="GZIP")) == list(range(50))


def test_batch_larger_than_the_data_warns(plain: str, caplog: pytest.LogCaptureFixture) -> None:
    pipeline = TFRecordPipeline(files=f"{plain}-*", features=FEATURES, batch_size=64, drop_remainder=True)
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        dataset = pipeline.dataset()
        assert list(dataset) == []
    text = "\n".join(_warnings(caplog))
    assert "reads 50 record(s), fewer than one batch of 64" in text
    assert "50 record(s) not read" in text


def test_corrupt_manifest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = str(tmp_path)
    prefix = os.path.join(root, "m")
    write_tfrecords((_example(i) for i in range(30)), prefix, num_shards=2)
    with open(f"{prefix}-manifest.json", "w") as f:
        f.write('{"files": [1, 2')
    with pytest.raises(DataError, match=r"`manifest`.*on_corrupt='skip'"):
        _ids(f"{prefix}-*")
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        assert sorted(_ids(f"{prefix}-*", on_corrupt="skip")) == list(range(30))
    assert _warnings(caplog), "on_corrupt='skip' logged no warning about the manifest"


def test_stratified_sample_takes_a_list_of_weights() -> None:
    datasets = [tf.data.Dataset.from_tensors(0).repeat(), tf.data.Dataset.from_tensors(1).repeat()]
    values = list(stratified_sample(datasets, [0.0, 1.0], seed=0).take(20).as_numpy_iterator())
    assert set(values) == {1}
    with pytest.raises(DataError, match="a list of 2 weights"):
        stratified_sample(datasets, [0.5, 0.3, 0.2])
    with pytest.raises(DataError, match="`class_weights`"):
        stratified_sample(datasets, {0: "x", 1: 1.0})


def test_data_report_rejects_bad_input_in_one_line(tmp_path: Path) -> None:
    root = str(tmp_path)
    prefix = os.path.join(root, "r")
    write_tfrecords((_example(i) for i in range(30)), prefix, num_shards=2)
    cases = [
        (["--label-key", "nope"], r"`--label-key`. Received: 'nope'.*has: id \(int64\), label \(int64\)"),
        (
            ["--label-key", "label", "--shard-policy", "hash", "--shard-key", "nope"],
            r"`--shard-key`. Received: 'nope'",
        ),
        (["--label-key", "label", "--plot", "/missing-tfdist/dir/x.png"], "--plot"),
    ]
    script = (
        "import sys; from tfdist.cli.main import main; cases = %r; codes = []\n"
        "for args in cases:\n"
        "    codes.append(main(['data-report', *args]))\n"
        "    sys.stderr.write('<END>\\n')\n"
        "print(codes)"
    ) % (
        [[f"{prefix}-*", "--workers", "2", *args] for args, _ in cases]
        + [[root, "--label-key", "label", "--workers", "2"]]
    )
    done = testing.run_python([sys.executable, "-c", script], timeout=300)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, 2, 2, 2], done.stderr[-2000:]
    assert done.stdout.strip().splitlines() == ["[2, 2, 2, 2]"]  # No report printed before the error.
    outputs = done.stderr.split("<END>\n")
    for (_, message), err in zip(cases + [(None, "not a directory")], outputs):
        lines = [line for line in err.splitlines() if line.startswith("tfdist data-report")]
        assert len(lines) == 1, err
        assert re.search(message, lines[0])
        assert "Traceback" not in err
