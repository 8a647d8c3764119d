"""scripts/make_digits.py, the demo's data: the long-tailed split, the PNG records, the whole script."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

import numpy as np
import pytest

from tests.support import REPO
from tfdist import testing
from tfdist.errors import DataError


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_digits", REPO / "scripts" / "make_digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_digits = _script()


def test_train_counts_fall_geometrically_from_head_to_tail() -> None:
    counts = make_digits.train_counts(10, 140, 10)
    assert counts == [140, 104, 78, 58, 43, 32, 24, 18, 13, 10]
    assert make_digits.train_counts(1, 50, 5) == [50]


def test_split_is_disjoint_balanced_in_validation_and_long_tailed_in_training() -> None:
    labels = np.repeat(np.arange(4), 20)
    train, val = make_digits.split(labels, val_per_class=5, counts=[15, 8, 4, 2], seed=3)
    assert not set(train) & set(val)
    assert np.bincount(labels[val]).tolist() == [5, 5, 5, 5]
    assert np.bincount(labels[train]).tolist() == [15, 8, 4, 2]
    again, _ = make_digits.split(labels, val_per_class=5, counts=[15, 8, 4, 2], seed=3)
    other, _ = make_digits.split(labels, val_per_class=5, counts=[15, 8, 4, 2], seed=4)
    assert again.tolist() == train.tolist()
    assert other.tolist() != train.tolist()  # The seed picks the images.


def test_split_names_a_class_too_small_for_its_share() -> None:
    labels = np.repeat(np.arange(2), 10)
    with pytest.raises(DataError, match=r"`counts\[0\]`. Received: 8. Expected at most 7 training images"):
        make_digits.split(labels, val_per_class=3, counts=[8, 2], seed=0)


def test_examples_round_trip_through_the_demo_pipeline(tmp_path: Any) -> None:
    tf = pytest.importorskip("tensorflow")
    from tfdist.data import TFRecordPipeline, write_tfrecords

    images = np.stack([np.full((8, 8), level, dtype=float) for level in (0, 8, 16)])
    labels = np.array([0, 1, 1])
    prefix = str(tmp_path / "train")
    write_tfrecords(make_digits.examples(images, labels, np.arange(3)), prefix, num_shards=1, partition_by="label")
    assert sorted(os.listdir(tmp_path))[:2] == [
        "train-label=0-00000-of-00001.tfrecord",
        "train-label=1-00000-of-00001.tfrecord",
    ]
    pipeline = TFRecordPipeline(
        files=prefix + "-*",
        batch_size=3,
        features={"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)},
        image_key="image",
        image_size=(8, 8),
        label_key="label",
        as_supervised=True,
        shuffle_buffer=0,
        drop_remainder=False,
    )
    ((x, y),) = list(pipeline.dataset())
    got = sorted(zip(y.numpy().tolist(), x["image"].numpy().mean(axis=(1, 2, 3)).tolist()))
    assert [label for label, _ in got] == [0, 1, 1]
    # Grey levels 0-16 scaled to 0-255 and decoded to [0, 1] on three channels: 0, 8 and 16 of 16.
    assert [level for _, level in got] == pytest.approx([0.0, 128 / 255, 1.0], abs=1e-6)
    assert x["image"].shape == (3, 8, 8, 3)


def test_the_script_writes_load_digits_split(tmp_path: Any) -> None:
    pytest.importorskip("sklearn", reason='the demo extra installs scikit-learn: pip install ".[demo]"')
    out = str(tmp_path / "digits")
    done = testing.run_python(
        [sys.executable, str(REPO / "scripts" / "make_digits.py"), "--out", out, "--val-per-class", "20"], timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["train_class_counts"] == [140, 104, 78, 58, 43, 32, 24, 18, 13, 10]
    assert (summary["train_records"], summary["val_records"]) == (520, 200)
    train = json.loads((tmp_path / "digits" / "train-manifest.json").read_text())
    val = json.loads((tmp_path / "digits" / "val-manifest.json").read_text())
    assert train["classes"] == {str(k): n for k, n in enumerate(summary["train_class_counts"])}
    assert (train["records"], val["records"]) == (520, 200)
