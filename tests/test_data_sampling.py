"""The stratified sampler's mechanism: vectorized class choices, small class groups held in memory, fast build.

What these protect was measured in BENCHMARKS.md (issue 11 part 5); here only the behaviour: the mix matches
the weights, a seed makes it repeatable, and the faster paths read the same records as before.
"""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

from tfdist import DataError
from tfdist.data import TFRecordPipeline, stratified_sample, write_tfrecords
from tfdist.data import stratify
from tfdist.data._framing import first_record
from tfdist.data.files import FileInfo, Listing
from tfdist.data.sampling import class_choices

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}


def _example(i: int, label: int) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}))


def _halving(n: int = 1600) -> list[tf.train.Example]:
    """4 classes whose frequencies halve: 8/15, 4/15, 2/15, 1/15 of ``n`` (ids 0..n-1)."""
    labels = [0 if i % 15 < 8 else 1 if i % 15 < 12 else 2 if i % 15 < 14 else 3 for i in range(n)]
    return [_example(i, label) for i, label in enumerate(labels)]


class ClassChoicesTest(parameterized.TestCase):

    @parameterized.named_parameters(("skewed", [0.7, 0.2, 0.1]), ("zero_inside", [0.5, 0.0, 0.5]),
                                    ("zero_last", [0.25, 0.75, 0.0]), ("unnormalized", [3.0, 1.0, 0.0]))
    def test_choices_follow_the_probabilities(self, probabilities: list) -> None:
        picks = np.array(list(class_choices(probabilities, seed=5).take(30000).as_numpy_iterator()))
        expected = np.asarray(probabilities) / sum(probabilities)
        np.testing.assert_allclose(np.bincount(picks, minlength=3)[:3] / len(picks), expected, atol=0.012)
        self.assertEqual(picks.min() >= 0 and picks.max() <= 2, True)
        self.assertEqual(set(np.flatnonzero(expected == 0)) & set(picks.tolist()), set())  # Weight 0: never.

    def test_a_seed_repeats_the_choices(self) -> None:
        first = list(class_choices([0.5, 0.5], seed=3).take(3000).as_numpy_iterator())
        again = list(class_choices([0.5, 0.5], seed=3).take(3000).as_numpy_iterator())
        other = list(class_choices([0.5, 0.5], seed=4).take(3000).as_numpy_iterator())
        self.assertEqual(first, again)
        self.assertNotEqual(first, other)

    def test_exhausted_classes_are_dropped_or_stop_the_mix(self) -> None:
        # 'drop' keeps going with the other classes (every element once); 'stop' ends at the first empty class.
        datasets = [tf.data.Dataset.range(5), tf.data.Dataset.range(100, 300)]
        drop = list(stratified_sample(datasets, [0.5, 0.5], seed=0, on_exhausted="drop").as_numpy_iterator())
        self.assertEqual(sorted(drop), list(range(5)) + list(range(100, 300)))
        stop = list(stratified_sample(datasets, [0.5, 0.5], seed=0, on_exhausted="stop").as_numpy_iterator())
        self.assertLess(len(stop), 40)


class StratifiedPipelineTest(parameterized.TestCase):

    def setUp(self) -> None:
        super().setUp()
        self.prefix = os.path.join(self.create_tempdir().full_path, "part")
        write_tfrecords(_halving(), self.prefix, num_shards=4, partition_by="label")

    def _labels(self, **kwargs: object) -> list[int]:
        pipeline = TFRecordPipeline(files=f"{self.prefix}-*", features=FEATURES, batch_size=64, label_key="label",
                                    **kwargs)  # type: ignore[arg-type]
        return [int(v) for batch in pipeline.dataset() for v in batch["label"].numpy()]

    @parameterized.named_parameters(
        ("balanced", "balanced", [0.25] * 4, {}),
        ("sqrt", "sqrt", np.sqrt([8, 4, 2, 1]) / np.sqrt([8, 4, 2, 1]).sum(), {}),
        ("mapping_shuffled", {0: 1, 1: 1, 2: 2, 3: 4}, [0.125, 0.125, 0.25, 0.5], {"shuffle_buffer": 256}),
        ("block_1", "balanced", [0.25] * 4, {"sample_block": 1}),
    )
    def test_a_finite_epoch_keeps_the_mix_and_the_size(self, weights: object, expected: list,
                                                       extra: dict) -> None:
        labels = self._labels(class_weights=weights, num_epochs=3, seed=2, **extra)
        self.assertLen(labels, 3 * 1600)  # Each epoch draws as many records as the share.
        np.testing.assert_allclose(np.bincount(labels, minlength=4) / len(labels), expected, atol=0.03)
        self.assertEqual(labels, self._labels(class_weights=weights, num_epochs=3, seed=2, **extra))  # Seeded.

    def test_natural_mix_reads_each_record_once(self) -> None:
        pipeline = TFRecordPipeline(files=f"{self.prefix}-*", features=FEATURES, batch_size=64, label_key="label",
                                    class_weights="natural", seed=0)
        ids = [int(v) for batch in pipeline.dataset() for v in batch["id"].numpy()]
        self.assertEqual(sorted(ids), list(range(1600)))

    def test_small_redrawn_groups_are_held_in_memory(self) -> None:
        groups = stratify.class_groups(Listing(files=tuple(
            FileInfo(path=f"d-y={label}-00000-of-00001.tfrecord", size=size)
            for label, size in (("0", 8000), ("1", 4000), ("2", 2000), ("3", 1000)))), "y")
        counts = {"0": 800, "1": 400, "2": 200, "3": 100}
        balanced = {label: 0.25 for label in counts}  # 500 draws each of 2,000: 2+ passes of '2' and '3'.
        self.assertEqual(stratify._held_in_memory(groups, counts, balanced, share=2000, count=1), ["3", "2"])
        self.assertEqual(stratify._held_in_memory(groups, counts, balanced, share=1000, count=2), ["3", "2"])
        self.assertEqual(stratify._held_in_memory(groups, counts, balanced, share=1500, count=1), ["3"])
        natural = {label: c / 1500 for label, c in counts.items()}
        self.assertEqual(stratify._held_in_memory(groups, counts, natural, share=1500, count=1), [])
        budget = stratify.MEMORY_BUDGET
        try:
            stratify.MEMORY_BUDGET = 1500  # Only the smallest fits.
            self.assertEqual(stratify._held_in_memory(groups, counts, balanced, share=2000, count=1), ["3"])
        finally:
            stratify.MEMORY_BUDGET = budget
        variable = stratify._held_in_memory(groups, counts, "a tf.Variable", share=2000, count=1)
        self.assertEqual(variable, ["3", "2"])  # An even share (500) is 2+ passes of these.


class FastReadTest(parameterized.TestCase):

    def test_first_record_and_damaged_headers(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "r")
        path = write_tfrecords([_example(i, 0) for i in range(3)], prefix, num_shards=1)[0]
        record = first_record(path, check_data=True)
        self.assertEqual(tf.train.Example.FromString(record).features.feature["id"].int64_list.value, [0])
        with open(path, "rb") as f:
            data = bytearray(f.read())
        damaged = os.path.join(self.create_tempdir().full_path, "bad.tfrecord")
        for offset in (2, 20):  # In the length (its CRC fails), then in the data (only check_data sees it).
            broken = bytearray(data)
            broken[offset] ^= 0xFF
            with open(damaged, "wb") as f:
                f.write(broken)
            self.assertIsNone(first_record(damaged, check_data=True))
        self.assertIsNotNone(first_record(damaged))
        with open(damaged, "wb") as f:
            f.write(data[:5])
        self.assertIsNone(first_record(damaged))

    def test_a_wrong_spec_is_still_named_before_reading(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "s")
        write_tfrecords([_example(i, i % 2) for i in range(8)], prefix, num_shards=2)
        with pytest.raises(DataError, match=r"features\['id'\]"):
            TFRecordPipeline(files=f"{prefix}-*", batch_size=4,
                             features={"id": tf.io.FixedLenFeature([], tf.string)}).dataset()

    @parameterized.named_parameters(("deterministic", True), ("any_order", False))
    def test_every_record_once_on_the_fast_reader(self, deterministic: bool) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "f")
        write_tfrecords([_example(i, i % 3) for i in range(301)], prefix, num_shards=5)
        for policy in ("file", "data"):
            seen = collections.Counter()
            for worker in range(2):
                context = tf.distribute.InputContext(2, worker, 2)
                pipeline = TFRecordPipeline(files=f"{prefix}-*", features=FEATURES, batch_size=8,
                                            shard_policy=policy, deterministic=deterministic, shuffle_buffer=16,
                                            seed=1)
                seen.update(int(v) for b in pipeline.dataset(context) for v in b["id"].numpy())
            self.assertEqual(seen, collections.Counter(range(301)), policy)
