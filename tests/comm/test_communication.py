"""Communication efficiency: compressed all-reduce, accumulation, autotuning (one real 2-worker cluster), and units."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile

import numpy as np
import pytest
from absl.testing import absltest, parameterized

import tfdist
from tests.support import cluster_tasks
from tests.support.processes import assert_all_gone
from tfdist import testing
from tfdist.comm.autotune import CollectiveTuning
from tfdist.comm.collective import CollectiveConfig, payload_bytes
from tfdist.errors import StorageError, StrategyError


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
class TwoWorkerCommunicationTest(absltest.TestCase):
    """All checks share one cluster run: each TF process costs seconds to start."""

    cluster: testing.ClusterRun
    tuning_dir: str
    tuning_path: str

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tuning_dir = tempfile.mkdtemp()
        cls.tuning_path = os.path.join(cls.tuning_dir, "tuning.json")
        cls.cluster = testing.run_cluster(
            cluster_tasks.communication_checks, workers=2, timeout=240, args=[cls.tuning_path]
        )
        assert_all_gone([t.pid for t in cls.cluster.result.tasks])

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tuning_dir, ignore_errors=True)
        super().tearDownClass()

    def setUp(self) -> None:
        self.assertTrue(self.cluster.ok, self.cluster.result.summary())
        self.a, self.b = self.cluster.values["worker:0"], self.cluster.values["worker:1"]

    def test_workers_stay_identical_under_every_setting(self) -> None:
        for name in ("none", "fp16", "bf16", "accumulate4", "accumulate4_fp16", "tuned_fit"):
            np.testing.assert_array_equal(self.a[name]["weights"], self.b[name]["weights"], err_msg=name)

    def test_compressed_fit_reaches_the_uncompressed_loss(self) -> None:
        reference = self.a["none"]["loss"]
        self.assertLess(reference[-1], reference[0] / 2)
        for name in ("fp16", "bf16"):
            np.testing.assert_allclose(self.a[name]["loss"], reference, rtol=1e-3, err_msg=name)
            np.testing.assert_allclose(self.a[name]["weights"], self.a["none"]["weights"], atol=2e-3, err_msg=name)

    def test_wrapper_without_compression_equals_plain_keras(self) -> None:
        np.testing.assert_array_equal(self.a["none"]["weights"], self.a["plain"]["weights"])

    def test_bytes_per_step_halve(self) -> None:
        full = self.a["none"]["bytes"]
        params = len(self.a["none"]["weights"])
        self.assertEqual(full, 4 * params)
        self.assertEqual(self.a["bf16"]["bytes"], full // 2)
        self.assertEqual(self.a["fp16"]["bytes"], full // 2 + 4)  # + the float32 range scalar

    def test_accumulation_equals_one_large_batch(self) -> None:
        large, accumulated = self.a["batch128"], self.a["accumulate4"]
        self.assertEqual(accumulated["updates"], large["updates"])
        np.testing.assert_allclose(accumulated["weights"], large["weights"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(accumulated["loss"], large["loss"], rtol=1e-6)
        np.testing.assert_allclose(self.a["accumulate4_fp16"]["weights"], large["weights"], atol=2e-3)

    def test_autotuner_agrees_across_workers_and_saves_what_it_chose(self) -> None:
        tuning = self.a["tuning"]
        self.assertEqual(tuning, self.b["tuning"])
        self.assertEqual(set(tuning["timings_ms"]), {"0", str(64 << 10), str(1 << 20)})
        fastest = min(tuning["timings_ms"], key=tuning["timings_ms"].get)
        self.assertEqual(tuning["bytes_per_pack"], int(fastest))
        self.assertEqual(tuning["workers"], 2)
        self.assertEqual(tuning["total_bytes"], 4 * (8 * 16 + 16 + 16 + 1 + 512 * 1024))
        self.assertTrue(self.a["reloaded_equal"])
        self.assertEqual(CollectiveTuning.load(self.tuning_path).bytes_per_pack, tuning["bytes_per_pack"])
        self.assertLess(self.a["tuned_fit"]["loss"][-1], self.a["tuned_fit"]["loss"][0])

    def test_loss_scale_optimizer_skips_overflowing_steps_and_then_trains(self) -> None:
        scaled = self.a["loss_scaled"]
        self.assertTrue(scaled["finite"])
        # Each overflow (seen through the fp16 all-reduce) halves the scale and skips the step: 2**40 needs
        # 25 of them, i.e. all of the first 3 epochs (8 steps each), whose loss is therefore unchanged ...
        self.assertLessEqual(scaled["final_scale"], 2.0**15)
        self.assertEqual(scaled["loss"][0], scaled["loss"][2])
        # ... and then it trains.
        self.assertLess(scaled["loss"][-1], scaled["loss"][0] / 2)
        np.testing.assert_array_equal(scaled["weights"], self.b["loss_scaled"]["weights"])

    def test_sparse_embedding_gradients_keep_tf_aggregation(self) -> None:
        sparse = self.a["sparse"]
        np.testing.assert_array_equal(sparse["weights"], self.b["sparse"]["weights"])
        self.assertLess(sparse["loss"][-1], sparse["loss"][0])
        dense_params = (4 * 8 + 8) + (8 + 1)  # The embedding's IndexedSlices are not in the compressed bytes.
        self.assertEqual(sparse["bytes"], 2 * dense_params + 4)

    def test_build_strategy_options_reach_tf_collectives(self) -> None:
        self.assertEqual(
            self.a["strategy_options"], {"implementation": "RING", "bytes_per_pack": 1 << 20, "timeout_seconds": 120}
        )

    def test_fp16_sums_do_not_overflow_and_keep_non_finite(self) -> None:
        sums = self.a["fp16_sums"]
        self.assertEqual(sums["large"][0], 120000.0)  # float16 tops out at 65504
        # One scale for all: 120000 is scaled by 2**-2, so tiny values keep float16's absolute step, 2**-24 / 2**-2.
        self.assertAlmostEqual(sums["large"][1], 2e-6, delta=2**-22)
        self.assertEqual(sums["large"][2:], [-6.0, 0.0])
        self.assertTrue(all(math.isnan(v) or math.isinf(v) for v in sums["inf"]))
        self.assertEqual(sums["zeros"], [0.0, 0.0])


class CollectiveConfigTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("unknown_compression", {"compression": "fp8"}, r"`compression`.*Received: 'fp8'.*'fp16'"),
        ("negative_pack", {"bytes_per_pack": -1}, r"`bytes_per_pack`.*Received: -1"),
        ("float_split", {"split_bytes": 1.5}, r"`split_bytes`.*Received: 1.5"),
    )
    def test_rejects(self, kwargs: dict, pattern: str) -> None:
        with pytest.raises(StrategyError, match=pattern):
            CollectiveConfig(**kwargs)

    def test_payload_bytes_counts_the_wire_dtype(self) -> None:
        tensors = [np.zeros([3, 4], np.float32), np.zeros([5], np.float64)]
        self.assertEqual(payload_bytes(tensors, CollectiveConfig()), 12 * 4 + 5 * 8)
        self.assertEqual(payload_bytes(tensors, CollectiveConfig(compression="fp16")), 17 * 2)


class TuningFileTest(absltest.TestCase):
    def setUp(self) -> None:
        self.path = os.path.join(self.create_tempdir().full_path, "tuning.json")

    def test_round_trip(self) -> None:
        tuning = CollectiveTuning(
            bytes_per_pack=4 << 20, split_bytes=4 << 20, timings_ms={"0": 9.0}, workers=2, total_bytes=100
        )
        tuning.save(self.path)
        self.assertEqual(CollectiveTuning.load(self.path), tuning)
        self.assertEqual(json.loads(open(self.path).read())["format"], "tfdist-collective-tuning/1")

    def test_rejects_other_json(self) -> None:
        with open(self.path, "w") as f:
            json.dump({"bytes_per_pack": 1}, f)
        with pytest.raises(StrategyError, match=r"`tuning`.*format 'tfdist-collective-tuning/1'"):
            CollectiveTuning.load(self.path)

    def test_rejects_missing_file(self) -> None:
        with pytest.raises(StorageError, match=r"Cannot read the tuning file '/nonexistent/t.json'") as caught:
            CollectiveTuning.load("/nonexistent/t.json")
        self.assertEqual((caught.value.field, caught.value.value), ("tuning", "/nonexistent/t.json"))
        self.assertNotIsInstance(caught.value, ValueError)

    def test_build_strategy_loads_the_pack_size_and_explicit_options_win(self) -> None:
        from tfdist.strategy.builders import resolve_options

        CollectiveTuning(bytes_per_pack=2 << 20, split_bytes=2 << 20).save(self.path)
        self.assertEqual(resolve_options(tuning=self.path).bytes_per_pack, 2 << 20)
        self.assertEqual(resolve_options(tuning=self.path, bytes_per_pack=1024).bytes_per_pack, 1024)
        with pytest.raises(StorageError, match=r"tuning file '/nonexistent.json'"):
            tfdist.build_strategy("default", tuning="/nonexistent.json")


class KerasWrappersTest(absltest.TestCase):
    def test_with_communication_keeps_the_optimizer_config(self) -> None:
        import tf_keras

        from tfdist.keras import with_communication

        opt = with_communication(tf_keras.optimizers.Adam(0.003, beta_1=0.8), compression="bf16")
        self.assertIsInstance(opt, tf_keras.optimizers.Adam)
        self.assertEqual(opt.get_config()["beta_1"], 0.8)
        self.assertEqual(opt.communication, CollectiveConfig(compression="bf16"))
        with pytest.raises(StrategyError, match=r"`optimizer`.*an optimizer not wrapped yet"):
            with_communication(opt)
        with pytest.raises(StrategyError, match=r"`optimizer`.*Received: 'str'.*tf_keras.optimizers.Optimizer"):
            with_communication("sgd")

    def test_with_communication_reads_the_tuning(self) -> None:
        import tf_keras

        from tfdist.keras import with_communication

        path = os.path.join(self.create_tempdir().full_path, "t.json")
        CollectiveTuning(bytes_per_pack=1 << 20, split_bytes=2 << 20).save(path)
        opt = with_communication(tf_keras.optimizers.SGD(0.1), tuning=path)
        self.assertEqual((opt.communication.bytes_per_pack, opt.communication.split_bytes), (1 << 20, 2 << 20))

    def test_accumulate_gradients_validates(self) -> None:
        import tf_keras

        from tfdist.keras import accumulate_gradients

        model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
        with pytest.raises(StrategyError, match=r"`steps`.*Received: 0"):
            accumulate_gradients(model, steps=0)

        class Custom(tf_keras.Model):
            def train_step(self, data):
                return {}

        with pytest.raises(StrategyError, match=r"`model`.*Received: 'Custom'.*standard train_step"):
            accumulate_gradients(Custom(), steps=2)
        self.assertIs(accumulate_gradients(model, steps=1), model)
        self.assertNotIn("train_step", model.__dict__)
