"""Claimed stratified draws (the parameter-server reader of class_weights), in one process, and what PS refuses.

One process claims in order: every claimed step must be the batch one process reading the same pipeline
(``order='resumable'``, one input pipeline) makes at that step, record for record and in order. The real
parameter-server runs (2 workers claiming from a ps, counted) are in tests/keras/test_strata_ps.py.
"""

from __future__ import annotations

import itertools
import logging
import os

import pytest
import tensorflow as tf

from tfdist.data import TFRecordPipeline, write_tfrecords
from tfdist.data.pipeline import _resumable
from tfdist.errors import DataError

LABELS = [0] * 120 + [1] * 50 + [2] * 21 + [3] * 9  # 200 records, skewed.
SPEC = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}


def _example(i: int, label: int) -> tf.train.Example:
    feature = {
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("claimed-draws")
    out = {}
    for name, compression, partition in (("plain", None, "label"), ("gzip", "GZIP", "label"), ("flat", None, None)):
        prefix = str(root / name / "part")
        examples = (_example(i, y) for i, y in enumerate(LABELS))
        write_tfrecords(examples, prefix, num_shards=2, compression=compression, partition_by=partition)
        out[name] = prefix
    return out


def _pipeline(prefix: str, **options: object) -> TFRecordPipeline:
    kwargs: dict = {"num_epochs": None, **options}
    return TFRecordPipeline(files=prefix + "-*", batch_size=8, features=SPEC, label_key="label", seed=5, **kwargs)


def _ids(batches: object, count: int) -> list[list[int]]:
    return [batch["id"].numpy().tolist() for batch in itertools.islice(batches, count)]  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("data", "weights", "options"),
    [
        ("plain", "sqrt", {"shuffle_buffer": 16}),
        ("plain", "balanced", {"shuffle_buffer": 0}),
        ("gzip", {0: 1, 1: 1, 2: 3, 3: 5}, {"shuffle_buffer": 40, "order_block": 3}),
        # Blocks of 4 that span file ends, read from byte offsets, in windows of 10.
        ("plain", "balanced", {"shuffle_buffer": 10, "order_block": 4}),
    ],
)
def test_each_claimed_step_is_that_step_of_one_pipeline_and_a_seek_resumes_the_draws(
    prefixes, data, weights, options
) -> None:
    # 60 steps of 8 draws: 480 draws, 2.4 passes of the data; the small classes many more.
    reference = _ids(
        _pipeline(prefixes[data], class_weights=weights, order="resumable", **options).dataset(
            tf.distribute.InputContext()
        ),
        60,
    )
    pipeline = _pipeline(prefixes[data], class_weights=weights, **options)
    dataset_fn = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert dataset_fn is not None and pipeline.steps_per_epoch() == 25  # 200 draws per data epoch
    assert _ids(dataset_fn(None), 60) == reference
    assert pipeline.claimed_steps() == 60  # One claim per step: nothing read ahead.
    # A restore at fit's epoch 3, step 2 of 13-step epochs: global step 41, where each class's draws stand.
    pipeline.seek(epoch=3, step=2, steps_per_epoch=13)
    assert _ids(dataset_fn(None), 10) == reference[41:51]
    assert (pipeline.fingerprint() or {})["pipelines"] == 1  # One stream of draws for the cluster.


def test_a_finite_input_ends_after_its_draws(prefixes) -> None:
    pipeline = _pipeline(prefixes["plain"], class_weights="sqrt", num_epochs=2)  # 400 draws: 50 steps
    reference = _ids(
        _pipeline(prefixes["plain"], class_weights="sqrt", num_epochs=2, order="resumable").dataset(
            tf.distribute.InputContext()
        ),
        100,
    )
    dataset_fn = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert dataset_fn is not None
    got = _ids(dataset_fn(None), 100)
    assert len(got) == 50 and got == reference


def test_natural_claims_the_plain_order_each_record_once_per_data_epoch(prefixes) -> None:
    pipeline = _pipeline(prefixes["plain"], class_weights="natural", num_epochs=1)
    dataset_fn = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert dataset_fn is not None
    got = _ids(dataset_fn(None), 100)
    assert sorted(i for batch in got for i in batch) == list(range(len(LABELS)))


@pytest.mark.parametrize(
    ("data", "options", "field", "fix"),
    [
        ("plain", {"shard_policy": "hash", "shard_key": "id"}, "shard_policy", "Drop shard_policy"),
        ("plain", {"shard_policy": "off"}, "shard_policy", "Drop shard_policy"),
        ("plain", {"cache": True}, "cache", "Drop cache"),
        ("plain", {"data_service": "grpc://localhost:5000"}, "data_service", "Drop data_service"),
        ("plain", {"class_weights": tf.Variable([1.0, 1.0, 1.0, 1.0])}, "class_weights", "Pass fixed class_weights"),
        ("flat", {"class_weights": "sqrt", "num_classes": 4}, "class_weights", "partition_by=label_key"),
    ],
)
def test_what_parameter_servers_cannot_claim_is_refused_at_build_with_its_fix(
    prefixes, data, options, field, fix
) -> None:
    pipeline = _pipeline(prefixes[data], **options)
    with pytest.raises(DataError) as err:
        pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert err.value.field == field, err.value
    assert isinstance(err.value, ValueError)  # A bad-input error.
    assert fix in str(err.value) and "order='buffer'" in str(err.value), err.value  # The fix, and the way out.
    assert pipeline.claimed_steps() is None  # Nothing made.


def test_remote_files_without_a_manifest_and_skipped_damage_are_refused(prefixes, monkeypatch) -> None:
    from tfdist.data.records.files import FileInfo, Listing

    local = _pipeline(prefixes["plain"]).listing()
    remote = Listing(files=tuple(FileInfo(path="gs://b/" + os.path.basename(f.path), size=f.size) for f in local.files))
    obstacle = _resumable._obstacle(_pipeline(prefixes["plain"]), groups=False, listing=remote, claimed=True)
    assert obstacle is not None and obstacle[0] == "files"
    assert "manifest" in _resumable._claim_fix(*obstacle)
    counted = Listing(files=tuple(FileInfo(path=f.path, size=f.size, records=10) for f in remote.files), local=False)
    skipping = _pipeline(prefixes["plain"], on_corrupt="skip")
    obstacle = _resumable._obstacle(skipping, groups=False, listing=counted, claimed=True)
    assert obstacle is not None and obstacle[:2] == ("on_corrupt", "skip")
    assert "on_corrupt='raise'" in _resumable._claim_fix(*obstacle)


def test_the_buffer_order_under_parameter_servers_warns_once(prefixes, caplog) -> None:
    _resumable._WARNED.clear()
    pipeline = _pipeline(prefixes["plain"], class_weights="sqrt", order="buffer")
    with caplog.at_level(logging.WARNING, logger="tfdist.data"):
        assert pipeline.claimed_dataset_fn(tf.distribute.get_strategy()) is None
        assert pipeline.claimed_dataset_fn(tf.distribute.get_strategy()) is None
    assert caplog.text.count("Input order 'buffer' under parameter servers: every worker reads the whole data") == 1
