"""Communication efficiency: compressed all-reduce, accumulation, autotuning (one real 2-worker cluster), and units."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

import tfdist
from tests.support import cluster_tasks
from tests.support.processes import assert_all_gone
from tfdist import testing
from tfdist.comm import TopK
from tfdist.comm.autotune import CollectiveTuning
from tfdist.comm.collective import CollectiveConfig, payload_bytes
from tfdist.errors import StorageError, StrategyError


@pytest.fixture(scope="module")
def communication_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[testing.ClusterRun, str]:
    """The one 2-worker cluster run all TestTwoWorkerCommunication checks share, and its tuning file."""
    tuning_path = str(tmp_path_factory.mktemp("tuning") / "tuning.json")
    cluster = testing.run_cluster(cluster_tasks.communication_checks, workers=2, timeout=240, args=[tuning_path])
    assert_all_gone([t.pid for t in cluster.result.tasks])
    return cluster, tuning_path


@pytest.fixture
def a(communication_run: tuple[testing.ClusterRun, str]) -> dict:
    """worker:0's values (the run must have succeeded)."""
    cluster, _ = communication_run
    assert cluster.ok, cluster.result.summary()
    return cluster.values["worker:0"]


@pytest.fixture
def b(communication_run: tuple[testing.ClusterRun, str]) -> dict:
    """worker:1's values (the run must have succeeded)."""
    cluster, _ = communication_run
    assert cluster.ok, cluster.result.summary()
    return cluster.values["worker:1"]


@pytest.fixture
def tuning_path(communication_run: tuple[testing.ClusterRun, str]) -> str:
    return communication_run[1]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
class TestTwoWorkerCommunication:
    """All checks share one cluster run: each TF process costs seconds to start."""

    def test_workers_stay_identical_under_every_setting(self, a: dict, b: dict) -> None:
        for name in ("none", "fp16", "bf16", "accumulate4", "accumulate4_fp16", "tuned_fit"):
            np.testing.assert_array_equal(a[name]["weights"], b[name]["weights"], err_msg=name)

    def test_compressed_fit_reaches_the_uncompressed_loss(self, a: dict) -> None:
        reference = a["none"]["loss"]
        assert reference[-1] < reference[0] / 2
        for name in ("fp16", "bf16"):
            np.testing.assert_allclose(a[name]["loss"], reference, rtol=1e-3, err_msg=name)
            np.testing.assert_allclose(a[name]["weights"], a["none"]["weights"], atol=2e-3, err_msg=name)

    def test_compressors_train_and_keep_workers_identical(self, a: dict, b: dict) -> None:
        reference = a["none"]["loss"]
        for name in ("powersgd", "topk", "accumulate4_powersgd"):
            np.testing.assert_array_equal(a[name]["weights"], b[name]["weights"], err_msg=name)
            loss = a[name]["loss"]
            assert loss[-1] < loss[0] / 2, (name, loss)
        # Error feedback: over 4 epochs the compressed runs end near the uncompressed loss.
        assert a["powersgd"]["loss"][-1] < 1.5 * reference[-1]
        assert a["topk"]["loss"][-1] < 2.0 * reference[-1]
        # The 8x16 kernel goes as rank-2 factors (2 * (8 + 16) values), the rest whole: 81 of 161 values.
        assert a["powersgd"]["bytes"] == 4 * (2 * (8 + 16) + 16 + 16 + 1)
        # Top-k at density 0.25 sends ceil(n / 4) values and int32 indices per tensor.
        assert a["topk"]["bytes"] == 8 * (32 + 4 + 4 + 1)

    def test_compressor_state_is_per_worker_and_checkpointed_per_worker(self, a: dict, b: dict) -> None:
        for name, kinds in (("powersgd", ["powersgd_error", "powersgd_q"]), ("topk", ["topk_error"] * 4)):
            state_a, state_b = a[name]["state"], b[name]["state"]
            assert [n.split("/")[-1].split(":")[0] for n in state_a["names"]] == kinds
            for i, kind in enumerate(kinds):
                local_a, local_b = np.array(state_a["local"][i]), np.array(state_b["local"][i])
                if kind == "powersgd_q":  # All-reduced every step: the same everywhere, saved and restored as is.
                    np.testing.assert_array_equal(local_a, local_b)
                    np.testing.assert_array_equal(state_a["saved"][i], local_a)
                    np.testing.assert_array_equal(state_a["restored"][i], local_a)
                    continue
                if local_a.size > 1:  # Each worker keeps what it did not send (all of a 1-value bias is sent).
                    assert not np.allclose(local_a, local_b) and np.abs(local_a).max() > 0
                else:
                    assert local_a.tolist() == local_b.tolist() == [0.0]
                # A checkpoint keeps every worker's own error, by replica id (the same file on every worker),
                # and a restore gives each worker its own back, bit for bit.
                for state in (state_a, state_b):
                    assert state["saved"][i]["ids"] == [0, 1]
                    np.testing.assert_array_equal(state["saved"][i]["rows"], [local_a, local_b])
                np.testing.assert_array_equal(state_a["restored"][i], local_a)
                np.testing.assert_array_equal(state_b["restored"][i], local_b)

    def test_local_sgd_averages_every_period_and_equals_sync_sgd_at_period_1(self, a: dict, b: dict) -> None:
        # Period 1: each worker's step from its own batch, then the mean: synchronous SGD's step.
        np.testing.assert_allclose(a["local1"]["weights"], a["plain"]["weights"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a["local1"]["loss"], a["plain"]["loss"], rtol=1e-5)
        local = a["local4"]
        assert local["updates"] == a["plain"]["updates"] == 32  # 8 steps per epoch: the last one ends a period.
        np.testing.assert_array_equal(local["weights"], b["local4"]["weights"])  # Averaged at the end ...
        assert local["middle"] and local["middle"] != b["local4"]["middle"]  # ... apart within a period.
        assert local["loss"][-1] < local["loss"][0] / 2
        assert not np.allclose(local["weights"], a["plain"]["weights"], atol=1e-4)  # Not synchronous SGD.

    def test_wrapper_without_compression_equals_plain_keras(self, a: dict) -> None:
        np.testing.assert_array_equal(a["none"]["weights"], a["plain"]["weights"])

    def test_bytes_per_step_halve(self, a: dict) -> None:
        full = a["none"]["bytes"]
        params = len(a["none"]["weights"])
        assert full == 4 * params
        assert a["bf16"]["bytes"] == full // 2
        assert a["fp16"]["bytes"] == full // 2 + 4  # + the float32 range scalar

    def test_accumulation_equals_one_large_batch(self, a: dict) -> None:
        large, accumulated = a["batch128"], a["accumulate4"]
        assert accumulated["updates"] == large["updates"]
        np.testing.assert_allclose(accumulated["weights"], large["weights"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(accumulated["loss"], large["loss"], rtol=1e-6)
        np.testing.assert_allclose(a["accumulate4_fp16"]["weights"], large["weights"], atol=2e-3)

    def test_autotuner_agrees_across_workers_and_saves_what_it_chose(self, a: dict, b: dict, tuning_path: str) -> None:
        tuning = a["tuning"]
        assert tuning == b["tuning"]
        assert set(tuning["timings_ms"]) == {"0", str(64 << 10), str(1 << 20)}
        fastest = min(tuning["timings_ms"], key=tuning["timings_ms"].get)
        assert tuning["bytes_per_pack"] == int(fastest)
        assert tuning["workers"] == 2
        assert tuning["total_bytes"] == 4 * (8 * 16 + 16 + 16 + 1 + 512 * 1024)
        assert a["reloaded_equal"]
        assert CollectiveTuning.load(tuning_path).bytes_per_pack == tuning["bytes_per_pack"]
        assert a["tuned_fit"]["loss"][-1] < a["tuned_fit"]["loss"][0]

    def test_loss_scale_optimizer_skips_overflowing_steps_and_then_trains(self, a: dict, b: dict) -> None:
        scaled = a["loss_scaled"]
        assert scaled["finite"]
        # Each overflow (seen through the fp16 all-reduce) halves the scale and skips the step: 2**40 needs
        # 25 of them, i.e. all of the first 3 epochs (8 steps each), whose loss is therefore unchanged ...
        assert scaled["final_scale"] <= 2.0**15
        assert scaled["loss"][0] == scaled["loss"][2]
        # ... and then it trains.
        assert scaled["loss"][-1] < scaled["loss"][0] / 2
        np.testing.assert_array_equal(scaled["weights"], b["loss_scaled"]["weights"])

    def test_sparse_embedding_gradients_keep_tf_aggregation(self, a: dict, b: dict) -> None:
        sparse = a["sparse"]
        np.testing.assert_array_equal(sparse["weights"], b["sparse"]["weights"])
        assert sparse["loss"][-1] < sparse["loss"][0]
        dense_params = (4 * 8 + 8) + (8 + 1)  # The embedding's IndexedSlices are not in the compressed bytes.
        assert sparse["bytes"] == 2 * dense_params + 4

    def test_build_strategy_options_reach_tf_collectives(self, a: dict) -> None:
        assert a["strategy_options"] == {"implementation": "RING", "bytes_per_pack": 1 << 20, "timeout_seconds": 120}

    def test_fp16_sums_do_not_overflow_and_keep_non_finite(self, a: dict) -> None:
        sums = a["fp16_sums"]
        assert sums["large"][0] == 120000.0  # float16 tops out at 65504
        # One scale for all: 120000 is scaled by 2**-2, so tiny values keep float16's absolute step, 2**-24 / 2**-2.
        assert sums["large"][1] == pytest.approx(2e-6, abs=2**-22)
        assert sums["large"][2:] == [-6.0, 0.0]
        assert all(math.isnan(v) or math.isinf(v) for v in sums["inf"])
        assert sums["zeros"] == [0.0, 0.0]


@pytest.mark.parametrize(
    "kwargs,pattern",
    [
        pytest.param({"compression": "fp8"}, r"`compression`.*Received: 'fp8'.*'fp16'", id="unknown_compression"),
        pytest.param({"bytes_per_pack": -1}, r"`bytes_per_pack`.*Received: -1", id="negative_pack"),
        pytest.param({"split_bytes": 1.5}, r"`split_bytes`.*Received: 1.5", id="float_split"),
    ],
)
def test_collective_config_rejects(kwargs: dict, pattern: str) -> None:
    with pytest.raises(StrategyError, match=pattern):
        CollectiveConfig(**kwargs)


def test_collective_config_payload_bytes_counts_the_wire_dtype() -> None:
    tensors = [np.zeros([3, 4], np.float32), np.zeros([5], np.float64)]
    assert payload_bytes(tensors, CollectiveConfig()) == 12 * 4 + 5 * 8
    assert payload_bytes(tensors, CollectiveConfig(compression="fp16")) == 17 * 2


@pytest.fixture
def tuning_file(tmp_path: Path) -> str:
    return os.path.join(tmp_path, "tuning.json")


def test_tuning_file_round_trip(tuning_file: str) -> None:
    tuning = CollectiveTuning(
        bytes_per_pack=4 << 20, split_bytes=4 << 20, timings_ms={"0": 9.0}, workers=2, total_bytes=100
    )
    tuning.save(tuning_file)
    assert CollectiveTuning.load(tuning_file) == tuning
    assert json.loads(open(tuning_file).read())["format"] == "tfdist-collective-tuning/1"


def test_tuning_file_rejects_other_json(tuning_file: str) -> None:
    with open(tuning_file, "w") as f:
        json.dump({"bytes_per_pack": 1}, f)
    with pytest.raises(StrategyError, match=r"`tuning`.*format 'tfdist-collective-tuning/1'"):
        CollectiveTuning.load(tuning_file)


def test_tuning_file_rejects_missing_file() -> None:
    with pytest.raises(StorageError, match=r"Cannot read the tuning file '/nonexistent/t.json'") as caught:
        CollectiveTuning.load("/nonexistent/t.json")
    assert (caught.value.field, caught.value.value) == ("tuning", "/nonexistent/t.json")
    assert not isinstance(caught.value, ValueError)


def test_build_strategy_loads_the_pack_size_and_explicit_options_win(tuning_file: str) -> None:
    from tfdist.strategy.builders import resolve_options

    CollectiveTuning(bytes_per_pack=2 << 20, split_bytes=2 << 20).save(tuning_file)
    assert resolve_options(tuning=tuning_file).bytes_per_pack == 2 << 20
    assert resolve_options(tuning=tuning_file, bytes_per_pack=1024).bytes_per_pack == 1024
    with pytest.raises(StorageError, match=r"tuning file '/nonexistent.json'"):
        tfdist.build_strategy("default", tuning="/nonexistent.json")


def test_with_communication_keeps_the_optimizer_config() -> None:
    import tf_keras

    from tfdist.keras import with_communication

    opt = with_communication(tf_keras.optimizers.Adam(0.003, beta_1=0.8), compression="bf16")
    assert isinstance(opt, tf_keras.optimizers.Adam)
    assert opt.get_config()["beta_1"] == 0.8
    assert opt.communication == CollectiveConfig(compression="bf16")
    typed = with_communication(tf_keras.optimizers.SGD(0.1), compression=TopK(density=0.5))
    assert typed.communication == CollectiveConfig(compression="topk", density=0.5)
    with pytest.raises(StrategyError, match=r"`rank`. Received: 2. Expected no `rank` with 'topk'"):
        with_communication(tf_keras.optimizers.SGD(0.1), compression="topk", rank=2)
    with pytest.raises(StrategyError, match=r"`optimizer`.*an optimizer not wrapped yet"):
        with_communication(opt)
    with pytest.raises(StrategyError, match=r"`optimizer`.*Received: 'str'.*tf_keras.optimizers.Optimizer"):
        with_communication("sgd")


def test_with_communication_reads_the_tuning(tmp_path: Path) -> None:
    import tf_keras

    from tfdist.keras import with_communication

    path = os.path.join(tmp_path, "t.json")
    CollectiveTuning(bytes_per_pack=1 << 20, split_bytes=2 << 20).save(path)
    opt = with_communication(tf_keras.optimizers.SGD(0.1), tuning=path)
    assert (opt.communication.bytes_per_pack, opt.communication.split_bytes) == (1 << 20, 2 << 20)


def test_accumulate_gradients_validates() -> None:
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
    assert accumulate_gradients(model, steps=1) is model
    assert "train_step" not in model.__dict__


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_compressors_and_local_sgd_on_three_workers() -> None:
    # Uneven shards too: 512 records in global batches of 96 leave a last batch of 32 (11, 11 and 10).
    cluster = testing.run_cluster(cluster_tasks.compressed_fits, workers=3, timeout=240)
    assert_all_gone([t.pid for t in cluster.result.tasks])
    assert cluster.ok, cluster.result.summary()
    runs = [cluster.values[f"worker:{i}"] for i in range(3)]
    for name in ("plain", "powersgd", "powersgd_warm3", "powersgd_all_warm", "topk", "local1", "local4"):
        for other in runs[1:]:
            np.testing.assert_array_equal(runs[0][name]["weights"], other[name]["weights"], err_msg=name)
        loss = runs[0][name]["loss"]
        assert loss[-1] < loss[0] / 2, (name, loss)
    np.testing.assert_allclose(runs[0]["local1"]["weights"], runs[0]["plain"]["weights"], rtol=1e-5, atol=1e-6)
    # Warming up is TF's plain all-reduce; past it, PowerSGD compresses.
    warm, plain = runs[0]["powersgd_all_warm"]["weights"], runs[0]["plain"]["weights"]
    np.testing.assert_allclose(warm, plain, rtol=1e-5, atol=1e-6)
    assert not np.allclose(runs[0]["powersgd_warm3"]["weights"], plain, rtol=1e-3, atol=1e-4)
    middles = {tuple(r["local4"]["middle"]) for r in runs}
    assert len(middles) == 3  # Three workers, three different weights inside a period.
    assert runs[0]["powersgd"]["bytes"] == 4 * (2 * (8 + 16) + 16 + 16 + 1)
