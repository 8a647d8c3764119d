"""Keras helpers without a cluster: straggler naming, pipeline slots, fit_input errors."""

from __future__ import annotations

import json
import os

import pytest
from absl.testing import absltest

from tfdist import ClusterSpec, StrategyError
from tfdist.data.pipeline import _context


class StragglerTest(absltest.TestCase):
    def test_chief_names_the_slow_worker(self) -> None:
        from tfdist.keras.cluster_aware import ThroughputLogger

        spec = ClusterSpec.local(workers=3).with_task("worker", 0)
        report_dir = self.create_tempdir().full_path
        for worker, step_s in ((1, 0.010), (2, 0.031)):
            with open(os.path.join(report_dir, f"throughput-worker-{worker}-epoch0.json"), "w") as f:
                json.dump({"task": f"worker:{worker}", "epoch": 0, "step_s": step_s}, f)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TF_CONFIG", json.dumps(spec.to_tf_config()))
            logger = ThroughputLogger(64, report_dir=report_dir)
        logger._steps = [0.011] * 5
        with self.assertLogs("tfdist.keras", "WARNING") as logs:
            logger.on_epoch_end(0)
        self.assertEqual(logger.stragglers, [["worker:2"]])
        self.assertIn("stragglers", logs.output[0])
        self.assertAlmostEqual(logger.history[0]["examples_per_s"], 64 / 0.011, places=3)


class SlotTest(absltest.TestCase):
    def test_collective_clusters_split_by_tf_config_and_ps_clusters_do_not(self) -> None:
        mwms = ClusterSpec.local(workers=2, chief=True)
        ps = ClusterSpec.local(workers=2, ps=1, chief=True)
        cases = [
            (mwms.to_tf_config("chief", 0), (0, 3)),
            (mwms.to_tf_config("worker", 1), (2, 3)),
            (ps.to_tf_config("chief", 0), (0, 1)),
            (None, (0, 1)),
        ]
        for config, expected in cases:
            with pytest.MonkeyPatch.context() as patch:
                if config is None:
                    patch.delenv("TF_CONFIG", raising=False)
                else:
                    patch.setenv("TF_CONFIG", json.dumps(config))
                where = _context.slot(None, 64)
            self.assertEqual((where.index, where.count, where.batch_size, where.per_replica), (*expected, 64, False))


def test_dataset_function_under_mirrored_needs_steps() -> None:
    import tensorflow as tf

    from tfdist.keras import fit_input

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with pytest.raises(StrategyError, match="Keras cannot size an epoch of a distributed dataset"):
        fit_input(lambda ctx: tf.data.Dataset.range(4).batch(2), strategy=strategy)
    dataset = fit_input(lambda ctx: tf.data.Dataset.range(4).batch(2), strategy=strategy, steps_per_epoch=2)
    assert isinstance(dataset, tf.distribute.DistributedDataset)


def test_default_strategy_gets_the_plain_dataset() -> None:
    import tensorflow as tf

    from tfdist.keras import fit_input

    dataset = fit_input(lambda ctx: tf.data.Dataset.range(4).batch(ctx.get_per_replica_batch_size(2)))
    assert [list(b.numpy()) for b in dataset] == [[0, 1], [2, 3]]


def test_linear_scaling_needs_a_finite_rate() -> None:
    import math

    from tfdist.keras.elastic import LinearScaling

    for bad in (math.nan, math.inf, 0, -0.1, True, "0.1"):
        with pytest.raises(StrategyError, match="`base_learning_rate`"):
            LinearScaling(bad, reference_world_size=2)
    assert LinearScaling(0.1, reference_world_size=2).base_learning_rate == 0.1
