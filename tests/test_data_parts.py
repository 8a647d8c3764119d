"""The parts of a TFRecord pipeline on their own: grouped options, listing, per-worker reads, verification."""

from __future__ import annotations

import dataclasses
import os

import pytest
import tensorflow as tf
from absl.testing import parameterized

from tfdist import ClusterSpec, DataError
from tfdist.data import TFRecordPipeline, write_tfrecords
from tfdist.data.pipeline.options import EpochOptions, ShardOptions, SourceOptions
from tfdist.data.records.verify import VerifyReport

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}


def _examples(n: int) -> list[tf.train.Example]:
    return [tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})) for i in range(n)]


class PartsTest(parameterized.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.prefix = os.path.join(self.create_tempdir().full_path, "d")
        write_tfrecords(_examples(90), self.prefix, num_shards=3)
        self.pipeline = TFRecordPipeline(files=f"{self.prefix}-*", features=FEATURES, batch_size=8)

    def test_options_come_in_groups(self) -> None:
        p = self.pipeline
        self.assertEqual((p.source.files, p.sharding.policy, p.epochs.batch_size, p.tuning.prefetch),
                         ((f"{self.prefix}-*",), "auto", 8, "autotune"))
        self.assertIsNone(p.sampling.class_weights)
        self.assertEqual(dataclasses.replace(p, batch_size=4).epochs.batch_size, 4)  # Groups follow replace().
        with pytest.raises(DataError, match="`shard_policy`"):
            ShardOptions(policy="bogus")
        with pytest.raises(DataError, match="`files`"):
            SourceOptions(files=[])
        with pytest.raises(DataError, match="`num_epochs`"):
            EpochOptions(batch_size=1, num_epochs=0)

    def test_listing_is_read_afresh(self) -> None:
        listing = self.pipeline.listing()
        self.assertEqual([f.records for f in listing.files], [30, 30, 30])  # From the writer's manifest.
        write_tfrecords(_examples(10), f"{self.prefix}-more", num_shards=1)
        self.assertLen(self.pipeline.listing().files, 4)  # No file list cached forever.

    def test_worker_files_and_records_match_the_dataset(self) -> None:
        files = [self.pipeline.worker_files(w, 3) for w in range(3)]
        self.assertEqual(sorted(f for fs in files for f in fs), [f.path for f in self.pipeline.listing().files])
        for worker in range(3):
            records, report = self.pipeline.worker_records(worker, 3)
            ids = [tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0] for r in records]
            context = tf.distribute.InputContext(3, worker, 1)
            read = [int(v) for b in self.pipeline.dataset(context) for v in b["id"].numpy()]
            self.assertEqual(sorted(ids), sorted(read))
            self.assertIsInstance(report, VerifyReport)
            self.assertEqual((report.files_checked, report.corrupt_files), (1, ()))

    def test_an_explicit_cluster_wins_over_tf_config(self) -> None:
        spec = ClusterSpec(jobs={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_id=1)
        mine = [int(v) for b in self.pipeline.dataset(cluster=spec) for v in b["id"].numpy()]
        everything = [int(v) for b in self.pipeline.dataset() for v in b["id"].numpy()]  # No TF_CONFIG: all.
        self.assertEqual(len(everything), 90)
        self.assertEqual(sorted(mine), sorted(set(mine)))
        self.assertLess(len(mine), 90)
        with pytest.raises(DataError, match="`cluster`"):
            self.pipeline.dataset(cluster={"worker": ["a:1"]})
