"""A finite epoch reads every record exactly once: every shard policy, worker count, odd batch and compression."""

from __future__ import annotations

import collections
import logging
import os

import pytest
import tensorflow as tf
from absl.testing import parameterized

from tests.support.records import FEATURES, example
from tests.support.records import ids as _ids
from tfdist.data import TFRecordPipeline, write_tfrecords


def _example(i: int) -> tf.train.Example:
    return example(i, i % 3)


RECORDS = 601  # Prime: no batch size or worker count divides it.


class ExactlyOnceTest(parameterized.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.root = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tfdist-once-{os.getpid()}")
        cls.prefixes = {}
        for compression in (None, "GZIP", "ZLIB"):
            prefix = os.path.join(cls.root, str(compression).lower())
            write_tfrecords((_example(i) for i in range(RECORDS)), prefix, num_shards=8, compression=compression)
            cls.prefixes[compression] = prefix

    @classmethod
    def tearDownClass(cls) -> None:
        import shutil

        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    @parameterized.product(
        policy=("file", "data", "hash", "auto"), workers=(2, 3, 4), compression=(None, "GZIP", "ZLIB")
    )
    def test_every_record_once(self, policy: str, workers: int, compression: str) -> None:
        batch = 7 * workers  # Per replica 7: divides neither the data nor any worker's share.
        pipeline = TFRecordPipeline(
            files=f"{self.prefixes[compression]}-*",
            features=FEATURES,
            batch_size=batch,
            shard_policy=policy,
            shard_key="id",
            shuffle_buffer=50,
            seed=workers,
        )
        seen = [i for worker in range(workers) for i in _ids(pipeline, workers, worker)]
        self.assertLen(seen, RECORDS)
        self.assertLen(set(seen), RECORDS)
        self.assertEqual(set(seen), set(range(RECORDS)))

    @parameterized.named_parameters(("plain", None), ("gzip", "GZIP"))
    def test_off_gives_every_worker_everything_once(self, compression: str) -> None:
        pipeline = TFRecordPipeline(
            files=f"{self.prefixes[compression]}-*", features=FEATURES, batch_size=22, shard_policy="off"
        )
        for worker in range(2):
            seen = _ids(pipeline, 2, worker)
            self.assertEqual((len(seen), set(seen)), (RECORDS, set(range(RECORDS))))

    def test_parse_fn_path_keeps_the_partial_batch(self) -> None:
        pipeline = TFRecordPipeline(
            files=f"{self.prefixes[None]}-*",
            batch_size=50,
            num_epochs=2,
            parse_fn=lambda r: tf.io.parse_single_example(r, FEATURES)["id"],
        )
        values = [int(v) for b in pipeline.dataset() for v in b.numpy()]
        self.assertEqual(collections.Counter(values), collections.Counter({i: 2 for i in range(RECORDS)}))

    def test_batch_larger_than_the_data_still_reads_it(self) -> None:
        pipeline = TFRecordPipeline(files=f"{self.prefixes[None]}-*", features=FEATURES, batch_size=10_000)
        batches = [b["id"].numpy() for b in pipeline.dataset()]
        self.assertEqual([len(b) for b in batches], [RECORDS])


class StaticBatchTest(parameterized.TestCase):
    """drop_remainder=True is an explicit choice, and what it drops is logged with the count."""

    @parameterized.named_parameters(("features", False), ("parse_fn", True))
    def test_dropped_records_are_logged_with_their_count(self, parse_fn: bool) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "d")
        write_tfrecords((_example(i) for i in range(103)), prefix, num_shards=2)
        kwargs = {"parse_fn": lambda r: tf.io.parse_single_example(r, FEATURES)} if parse_fn else {"features": FEATURES}
        pipeline = TFRecordPipeline(files=f"{prefix}-*", batch_size=20, drop_remainder=True, **kwargs)
        with self.assertLogs("tfdist.data", logging.WARNING) as logs:
            batches = list(pipeline.dataset())
        self.assertEqual([len(b["id"]) for b in batches], [20] * 5)
        self.assertEqual(batches[0]["id"].shape, (20,))  # Still a static batch after the filter.
        dropped = [line for line in logs.output if "drops its last partial batch" in line]
        self.assertLen(dropped, 1)
        self.assertIn("3 record(s) not read", dropped[0])

    def test_static_batch_shape_is_static(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "s")
        write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=1)
        static = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8, drop_remainder=True)
        partial = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8)
        self.assertEqual(static.dataset().element_spec["id"].shape.as_list(), [8])
        self.assertEqual(partial.dataset().element_spec["id"].shape.as_list(), [None])

    def test_nothing_logged_when_the_batch_divides(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "e")
        write_tfrecords((_example(i) for i in range(40)), prefix, num_shards=1)
        pipeline = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8, drop_remainder=True)
        logger = logging.getLogger("tfdist.data")
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger.addHandler(handler)
        try:
            self.assertEqual(sum(len(b["id"]) for b in pipeline.dataset()), 40)
        finally:
            logger.removeHandler(handler)
        self.assertFalse([r for r in records if "drops" in r.getMessage()])


if __name__ == "__main__":
    pytest.main([__file__])
