"""The parts of a TFRecord pipeline on their own: grouped options, listing, per-worker reads, verification."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, cast

import pytest
import tensorflow as tf

from tests.support.records import ID_ONLY as FEATURES
from tests.support.records import example
from tfdist import ClusterSpec, DataError
from tfdist.data import TFRecordPipeline, write_tfrecords
from tfdist.data.pipeline.options import EpochOptions, ShardOptions, SourceOptions, TuningOptions
from tfdist.data.records.verify import VerifyReport


def _examples(n: int) -> list[tf.train.Example]:
    return [example(i) for i in range(n)]


@pytest.fixture
def prefix(tmp_path: Path) -> str:
    prefix = os.path.join(tmp_path, "d")
    write_tfrecords(_examples(90), prefix, num_shards=3)
    return prefix


@pytest.fixture
def pipeline(prefix: str) -> TFRecordPipeline:
    return TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8)


def test_options_come_in_groups(prefix: str, pipeline: TFRecordPipeline) -> None:
    p = pipeline
    assert (p.source.files, p.sharding.policy, p.epochs.batch_size, p.tuning.prefetch) == (
        (f"{prefix}-*",),
        "auto",
        8,
        "autotune",
    )
    assert p.sampling.class_weights is None
    assert dataclasses.replace(cast(Any, p), batch_size=4).epochs.batch_size == 4  # Groups follow replace().
    with pytest.raises(DataError, match="`policy`"):
        ShardOptions(policy="bogus")
    with pytest.raises(DataError, match="`shard_policy`") as caught:  # The flat name, through the pipeline.
        dataclasses.replace(cast(Any, p), shard_policy="bogus")
    assert caught.value.field == "shard_policy"
    with pytest.raises(DataError, match="`files`"):
        SourceOptions(files=[])
    with pytest.raises(DataError, match="`num_epochs`"):
        EpochOptions(batch_size=1, num_epochs=0)


def test_each_option_is_declared_once_in_its_group(pipeline: TFRecordPipeline) -> None:
    flat = {}
    for name, kind in TFRecordPipeline.option_groups().items():
        prefix = "shard_" if name == "sharding" else ""
        flat.update({prefix + f.name: f for f in dataclasses.fields(kind)})
    assert set(TFRecordPipeline.option_names()) == set(flat)
    for field in dataclasses.fields(cast(Any, TFRecordPipeline)):
        if field.init:  # Same default as the group's (nothing copied by hand that could drift).
            assert (field.default, field.default_factory) == (
                flat[field.name].default,
                flat[field.name].default_factory,
            ), field.name
    p = pipeline
    assert p.option_values()["batch_size"] == 8
    assert TFRecordPipeline(**p.option_values()) == p


def test_flat_and_grouped_arguments(prefix: str) -> None:
    tuning = TuningOptions(prefetch=2, deterministic=False)
    p = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8, tuning=tuning)
    assert (p.tuning, p.prefetch, p.deterministic) == (tuning, 2, False)
    p = TFRecordPipeline(
        files=f"{prefix}-*", features=FEATURES, epochs=EpochOptions(batch_size=4), tuning=tuning, prefetch=3
    )  # A flat argument wins over its group's value.
    assert (p.batch_size, p.prefetch, p.tuning.prefetch, p.deterministic) == (4, 3, 3, False)
    with pytest.raises(DataError, match="did you mean 'shuffle_buffer'") as caught:
        TFRecordPipeline(files="x", features=FEATURES, batch_size=8, shuffle_bufer=4)
    assert (caught.value.field, caught.value.value) == ("options", ["shuffle_bufer"])
    with pytest.raises(DataError, match="`batch_size`. Received: None.*no default"):
        TFRecordPipeline(files="x", features=FEATURES)
    with pytest.raises(DataError, match="`tuning`. Received: 2. Expected a TuningOptions"):
        TFRecordPipeline(files="x", features=FEATURES, batch_size=8, tuning=2)
    with pytest.raises(DataError, match="keyword arguments"):
        TFRecordPipeline("x")  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.batch_size = 2  # type: ignore[attr-defined]


def test_listing_is_read_afresh(prefix: str, pipeline: TFRecordPipeline) -> None:
    listing = pipeline.listing()
    assert [f.records for f in listing.files] == [30, 30, 30]  # From the writer's manifest.
    write_tfrecords(_examples(10), f"{prefix}-more", num_shards=1)
    assert len(pipeline.listing().files) == 4  # No file list cached forever.


def test_worker_files_and_records_match_the_dataset(pipeline: TFRecordPipeline) -> None:
    files = [pipeline.worker_files(w, 3) for w in range(3)]
    assert (sorted(f for fs in files for f in fs)) == [f.path for f in pipeline.listing().files]
    for worker in range(3):
        records, report = pipeline.worker_records(worker, 3)
        ids = [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0] for r in records]
        context = tf.distribute.InputContext(3, worker, 1)
        read = [int(v) for b in pipeline.dataset(context) for v in b["id"].numpy()]
        assert sorted(ids) == sorted(read)
        assert isinstance(report, VerifyReport)
        assert (report.files_checked, report.corrupt_files) == (1, ())


def test_an_explicit_cluster_wins_over_tf_config(pipeline: TFRecordPipeline) -> None:
    spec = ClusterSpec(jobs=cast(Any, {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}), task_type="worker", task_id=1)
    mine = [int(v) for b in pipeline.dataset(cluster=spec) for v in b["id"].numpy()]
    everything = [int(v) for b in pipeline.dataset() for v in b["id"].numpy()]  # No TF_CONFIG: all.
    assert len(everything) == 90
    assert sorted(mine) == sorted(set(mine))
    assert len(mine) < 90
    with pytest.raises(DataError, match="`cluster`"):
        pipeline.dataset(cluster={"worker": ["a:1"]})
