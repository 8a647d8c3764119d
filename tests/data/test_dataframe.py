"""write_tfrecords from a Spark DataFrame, on a real standalone Spark: the executors write the shards.

Read back with TFRecordPipeline, every record comes exactly once per epoch; with partition_by every class
group is complete; bad rows come back as tfdist errors naming the partition and row.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pyspark.sql", reason='pyspark is not installed; pip install ".[spark]"')

from tests.support import exact_tasks
from tfdist.data import read_manifest, row_example, write_tfrecords
from tfdist.errors import DataError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
SCHEMA = "id long, x array<float>, y float, label int, name string"


def _frame(spark: Any, partitions: int, records: int = exact_tasks.RECORDS) -> Any:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(records, exact_tasks.FEATURES_DIM)).astype("float32")
    rows = [(i, x[i].tolist(), float(x[i].sum()), exact_tasks.label_of(i), f"r{i}") for i in range(records)]
    # Range-partitioned by id: consecutive records, as many in each partition. The rows come from one task, through a
    # shuffle: a write's task then runs only its writer's Python worker (which imports TF), not a second one feeding
    # it, so the later writes find the same few workers, TF imported.
    rdd = spark.sparkContext.parallelize(rows, 1)
    return spark.createDataFrame(rdd, SCHEMA).repartitionByRange(partitions, "id")


def _ids_per_epoch(files: str, epochs: int, **options: Any) -> list[collections.Counter[int]]:
    pipeline = exact_tasks.pipeline(files, num_epochs=epochs, **options)
    seen: list[collections.Counter[int]] = [collections.Counter() for _ in range(epochs)]
    per_epoch = -(-exact_tasks.RECORDS // exact_tasks.GLOBAL_BATCH)
    for step, batch in enumerate(pipeline.dataset(cluster=None)):
        seen[step // per_epoch].update(batch["id"].numpy().tolist())
    return seen


def test_each_partition_writes_its_shard_and_every_record_reads_back_once_per_epoch(
    spark_session: Any, tmp_path: Path
) -> None:
    prefix = str(tmp_path / "part")
    paths = write_tfrecords(_frame(spark_session, 5), prefix, compression="GZIP")
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}-of-00005.tfrecord.gz" for i in range(5)]
    manifest = read_manifest(prefix)
    assert manifest is not None and manifest["records"] == exact_tasks.RECORDS and manifest["num_shards"] == 5
    assert sum(info["records"] for info in manifest["files"].values()) == exact_tasks.RECORDS
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]  # Swapped in whole, nothing staged is left.
    for counts in _ids_per_epoch(prefix + "-*", 2, compression="GZIP"):
        assert counts == collections.Counter(range(exact_tasks.RECORDS))
    # Written again with fewer partitions: the old shards are gone (all or nothing, as for any write).
    write_tfrecords(_frame(spark_session, 2), prefix, compression="GZIP", num_shards=2)
    assert sorted(os.listdir(tmp_path)) == ["part-00000-of-00002.tfrecord.gz", "part-00001-of-00002.tfrecord.gz"] + [
        "part-manifest.json"
    ]


def test_partition_by_writes_complete_class_groups_for_stratified_reading(spark_session: Any, tmp_path: Path) -> None:
    # Sorted by id into 4 partitions, so partitions hold only some classes: the driver adds their empty shards.
    prefix = str(tmp_path / "part")
    frame = _frame(spark_session, 1).orderBy("id").repartitionByRange(4, "id")
    write_tfrecords(frame, prefix, partition_by="label")
    manifest = read_manifest(prefix)
    assert manifest is not None
    assert manifest["classes"] == {"0": 240, "1": 120, "2": 80, "3": 40}
    for label in "0123":
        group = sorted(p for p in os.listdir(tmp_path) if p.startswith(f"part-label={label}-"))
        assert group == [f"part-label={label}-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert any(info["records"] == 0 for info in manifest["files"].values())
    import tensorflow as tf

    features = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    natural = _ids_per_epoch(prefix + "-*", 1, features=features, class_weights="natural", label_key="label")[0]
    assert natural == collections.Counter(range(exact_tasks.RECORDS))


def test_bad_rows_and_arguments_are_data_errors_naming_them(spark_session: Any, tmp_path: Path) -> None:
    prefix = str(tmp_path / "bad")
    with_null = spark_session.createDataFrame([(1, "a"), (2, None)], "id long, name string").coalesce(1)
    with pytest.raises(DataError, match=r"In partition 0, row 1: Invalid value for `name`\. Received: None"):
        write_tfrecords(with_null, prefix)
    assert not os.path.exists(tmp_path / "bad-manifest.json")
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]
    frame = _frame(spark_session, 3, records=30)
    with pytest.raises(DataError, match=r"`num_shards`.*repartition\(4\)"):
        write_tfrecords(frame, prefix, num_shards=4)
    with pytest.raises(DataError, match="`to_example`"):
        write_tfrecords([b"x"], prefix, num_shards=1, to_example=row_example)
    # to_example picks the features; one that returns no example is named.
    written = write_tfrecords(frame, prefix, to_example=lambda row: row_example({"id": row.id}))
    assert len(written) == 3
    with pytest.raises(DataError, match=r"In partition \d, row 0: Invalid value for `examples\[0\]`"):
        write_tfrecords(frame, prefix, to_example=lambda row: [row.id])
