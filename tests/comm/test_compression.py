"""PowerSGD and top-k against NumPy references, on real replicas (one process, logical CPUs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import compression_tasks
from tests.support.compression_tasks import SHAPES
from tfdist import testing
from tfdist.comm import Compressor, PowerSGD, TopK
from tfdist.comm.powersgd import EPSILON, lowrank_value_count, matrix_shape
from tfdist.comm.topk import topk_count
from tfdist.errors import StrategyError

REPLICAS, STEPS, RANK, DENSITY = 3, 6, 2, 0.1


def _orthogonalize(p: Any) -> Any:
    p = p.copy()
    for i in range(p.shape[1]):
        p[:, i] /= np.linalg.norm(p[:, i]) + EPSILON
        for j in range(i + 1, p.shape[1]):
            p[:, j] -= (p[:, i] @ p[:, j]) * p[:, i]
    return p


def reference_powersgd(grads: list, q0: list) -> list[dict[str, Any]]:
    """The algorithm of the paper, in float64 NumPy: per step the sums, each replica's errors, the Qs."""
    views = [matrix_shape(s, rank=RANK, min_compression_rate=compression_tasks.RATE) for s in SHAPES]
    errors = [[np.zeros(v) if v else None for v in views] for _ in range(REPLICAS)]
    qs: list[Any] = [None if q is None else q.astype("float64") for q in q0]
    steps = []
    for step_grads in grads:
        sums: list[Any] = [sum(step_grads[w][i].astype("float64") for w in range(REPLICAS)) for i in range(len(SHAPES))]
        for i, view in enumerate(views):
            if view is None:
                continue
            ms = [step_grads[w][i].reshape(view) + errors[w][i] for w in range(REPLICAS)]
            p = _orthogonalize(sum(m @ qs[i] for m in ms))
            local = [m.T @ p for m in ms]
            qs[i] = sum(local)
            sums[i] = (p @ qs[i].T).reshape(SHAPES[i])
            for w in range(REPLICAS):
                errors[w][i] = ms[w] - p @ local[w].T
        steps.append({"sums": sums, "errors": [list(e) for e in errors], "qs": list(qs)})
    return steps


def reference_topk(grads: list) -> list[dict[str, Any]]:
    errors = [[np.zeros(s) for s in SHAPES] for _ in range(REPLICAS)]
    steps = []
    for step_grads in grads:
        sums = [np.zeros(math.prod(s)) for s in SHAPES]
        for w in range(REPLICAS):
            for i, shape in enumerate(SHAPES):
                flat = step_grads[w][i].reshape(-1).astype("float64") + errors[w][i].reshape(-1)
                pick = np.argsort(-np.abs(flat), kind="stable")[: topk_count(flat.size, density=DENSITY)]
                sums[i][pick] += flat[pick]
                flat[pick] = 0.0
                errors[w][i] = flat.reshape(shape)
        steps.append(
            {"sums": [s.reshape(shape) for s, shape in zip(sums, SHAPES)], "errors": [list(e) for e in errors]}
        )
    return steps


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    cluster = testing.run_cluster(
        compression_tasks.compressed_steps, workers=1, timeout=180, args=[REPLICAS, STEPS, RANK, DENSITY]
    )
    assert cluster.ok, cluster.result.summary()
    return cluster.values["worker:0"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
class TestOnReplicas:
    """One TF process, 3 replicas, 6 steps; every number checked against float64 NumPy."""

    def test_powersgd_matches_the_reference_step_by_step(self, run: dict) -> None:
        grads, q0 = compression_tasks.inputs(REPLICAS, STEPS, RANK)
        compressed = [
            i
            for i, s in enumerate(SHAPES)
            if matrix_shape(s, rank=RANK, min_compression_rate=compression_tasks.RATE) is not None
        ]
        assert compressed == [0, 1, 4]  # (6, 5), the conv kernel and (8, 16); the vector and (5, 2) go whole.
        for step, (got, want) in enumerate(zip(run["powersgd"], reference_powersgd(grads, q0))):
            for replica in range(REPLICAS):  # Every replica applies the same sum.
                for i, shape in enumerate(SHAPES):
                    value = np.reshape(got["sums"][replica][i], shape)
                    np.testing.assert_allclose(value, want["sums"][i], rtol=1e-4, atol=1e-4, err_msg=f"{step} {i}")
                for k, i in enumerate(compressed):  # Each replica's own error; the shared warm-start Q.
                    np.testing.assert_allclose(got["errors"][replica][k], want["errors"][replica][i], atol=1e-4)
                    np.testing.assert_allclose(got["qs"][replica][k], want["qs"][i], rtol=1e-4, atol=1e-4)
            # Compression changed the matrices: the sums are not the plain sums.
            plain = sum(grads[step][w][0] for w in range(REPLICAS))
            assert not np.allclose(np.reshape(got["sums"][0][0], SHAPES[0]), plain, atol=1e-2)

    def test_powersgd_error_feedback_loses_nothing(self, run: dict) -> None:
        # Applied sums plus the errors held = every gradient ever computed (telescoping), per tensor.
        grads, _ = compression_tasks.inputs(REPLICAS, STEPS, RANK)
        last = run["powersgd"][-1]
        for k, i in enumerate([0, 1, 4]):
            applied = sum(np.reshape(s["sums"][0][i], SHAPES[i]) for s in run["powersgd"])
            held = sum(np.reshape(last["errors"][w][k], SHAPES[i]) for w in range(REPLICAS))
            total = sum(g[w][i] for g in grads for w in range(REPLICAS))
            np.testing.assert_allclose(applied + held, total, atol=5e-4)

    def test_powersgd_warms_up_with_plain_sums_then_compresses_from_its_first_state(self, run: dict) -> None:
        grads, q0 = compression_tasks.inputs(REPLICAS, STEPS, RANK)
        warmup, compressed = compression_tasks.WARMUP, [0, 1, 4]
        later = reference_powersgd(grads[warmup:], q0)  # the paper's steps, from zero errors and the seeded Q
        for step, got in enumerate(run["warm"]):
            for replica in range(REPLICAS):
                assert got["steps"][replica] == [[min(step + 1, warmup)]] * len(compressed)
                for i, shape in enumerate(SHAPES):
                    value = np.reshape(got["sums"][replica][i], shape)
                    want = sum(grads[step][w][i] for w in range(REPLICAS)) if step < warmup else None
                    want = later[step - warmup]["sums"][i] if want is None else want
                    np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4, err_msg=f"{step} {i}")
                for k, i in enumerate(compressed):
                    if step < warmup:  # no error kept, the Q factor untouched
                        assert not np.any(got["errors"][replica][k]) and np.array_equal(got["qs"][replica][k], q0[i])
                    else:
                        want_error = later[step - warmup]["errors"][replica][i]
                        np.testing.assert_allclose(got["errors"][replica][k], want_error, atol=1e-4)

    def test_topk_matches_the_reference_and_loses_nothing(self, run: dict) -> None:
        grads, _ = compression_tasks.inputs(REPLICAS, STEPS, RANK)
        for step, (got, want) in enumerate(zip(run["topk"], reference_topk(grads))):
            for replica in range(REPLICAS):
                for i, shape in enumerate(SHAPES):
                    np.testing.assert_allclose(np.reshape(got["sums"][replica][i], shape), want["sums"][i], atol=1e-5)
                    np.testing.assert_allclose(
                        np.reshape(got["errors"][replica][i], shape), want["errors"][replica][i], atol=1e-5
                    )
            sent = [np.count_nonzero(np.reshape(got["sums"][0][i], -1)) for i in range(len(SHAPES))]
            assert all(n <= REPLICAS * topk_count(math.prod(s), density=DENSITY) for n, s in zip(sent, SHAPES)), step
        last = run["topk"][-1]
        for i, shape in enumerate(SHAPES):
            applied = sum(np.reshape(s["sums"][0][i], shape) for s in run["topk"])
            held = sum(np.reshape(last["errors"][w][i], shape) for w in range(REPLICAS))
            np.testing.assert_allclose(applied + held, sum(g[w][i] for g in grads for w in range(REPLICAS)), atol=1e-4)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_errors_are_checkpointed_per_replica_and_shared_out_on_another_count() -> None:
    cluster = testing.run_cluster(compression_tasks.per_replica_round_trip, workers=1, timeout=180)
    assert cluster.ok, cluster.result.summary()
    saved = cluster.values["worker:0"]
    ones, twos = [[1.0] * 3] * 2, [[2.0] * 3] * 2
    assert saved["keys"] == ["m/states/0/.ATTRIBUTES/per_replica", "m/states/0/.ATTRIBUTES/replica_ids"]
    assert saved["saved"] == [ones, twos] and saved["ids"] == [0, 1]  # Each replica's own value, by id.
    assert saved["two"] == [ones, twos]  # The same replicas: each gets its own back.
    assert saved["three"] == [[[1.0] * 3] * 2] * 3  # (1 + 2) / 3 each: the sum is kept.
    assert saved["none"] == [[[3.0] * 3] * 2]  # One replica: the whole sum.
    assert saved["resized"] == [[2, 3], [2, 1]]


def test_which_tensors_powersgd_compresses_and_their_bytes() -> None:
    assert matrix_shape((7, 7, 3, 64), rank=4) == (147, 64)  # ResNet's first conv: [kh*kw*cin, cout].
    assert matrix_shape((2048, 1000), rank=4) == (2048, 1000)
    assert matrix_shape((64,), rank=4) is None and matrix_shape((8, 4), rank=4) is None
    assert matrix_shape((6, 5), rank=3) is None  # 3 * (6 + 5) = 33 >= 30: the factors would be larger.
    factors, whole = lowrank_value_count([(2048, 1000), (1000,)], rank=4)
    assert (factors, whole) == (4 * 3048, 1000)
    assert 2048 * 1000 / factors > 160  # 168x fewer values for the classifier of ResNet-50.


def test_a_minimum_compression_rate_sends_the_matrices_it_would_not_shrink_enough_whole() -> None:
    assert matrix_shape((16, 8), rank=2) == (16, 8)  # 128 values against 48 in factors: 2.7x
    assert matrix_shape((16, 8), rank=2, min_compression_rate=2) == (16, 8)
    # The default rate is torch's 2: 30 values against 22 in factors (1.4x) go whole, unless asked for.
    assert matrix_shape((6, 5), rank=2) is None and matrix_shape((6, 5), rank=2, min_compression_rate=1) == (6, 5)
    assert matrix_shape((4, 4), rank=1) is None  # 16 against 8: exactly 2x is not more.
    assert PowerSGD(rank=2).state_slots((6, 5)) == () and PowerSGD(rank=2, min_compression_rate=1).state_slots((6, 5))
    assert matrix_shape((16, 8), rank=2, min_compression_rate=2.7) is None
    assert lowrank_value_count([(16, 8), (2048, 1000)], rank=2, min_compression_rate=3) == (2 * 3048, 128)
    assert PowerSGD(rank=2, min_compression_rate=3).sent_bytes([(16, 8)]) == 4 * 128
    assert [s.kind for s in PowerSGD(rank=2, warmup_steps=5).state_slots((16, 8))] == ["error", "q", "steps"]
    assert PowerSGD(rank=2, warmup_steps=5).state_slots((16, 8))[2].shared
    assert PowerSGD(rank=2, warmup_steps=5).state_slots((4,)) == ()
    # A warm-up by default (25 steps), none when asked: then no step count is kept either.
    assert [s.kind for s in PowerSGD(rank=2).state_slots((16, 8))] == ["error", "q", "steps"]
    assert [s.kind for s in PowerSGD(rank=2, warmup_steps=0).state_slots((16, 8))] == ["error", "q"]


def test_bad_settings_name_the_field() -> None:
    for options, field in (
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"warmup_steps": 1.5}, "warmup_steps"),
        ({"min_compression_rate": 0.5}, "min_compression_rate"),
        ({"min_compression_rate": float("nan")}, "min_compression_rate"),
        ({"min_compression_rate": "2"}, "min_compression_rate"),
        ({"warmup_steps": 2**24 + 1}, "warmup_steps"),
        ({"warmup_steps": True}, "warmup_steps"),
    ):
        with pytest.raises(StrategyError, match=f"`{field}`"):
            PowerSGD(**options)
    with pytest.raises(StrategyError, match="`rank`. Received: 0"):
        matrix_shape((8, 8), rank=0)
    for density in (0.0, 1.5, True, "1%"):
        with pytest.raises(StrategyError, match="`density`"):
            topk_count(100, density=density)  # type: ignore[arg-type]
    assert topk_count(100, density=1.0) == 100


def test_sparse_gradients_are_summed_by_tf_uncompressed_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    import tf_keras as keras

    from tfdist.keras import with_communication

    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((1,), dtype="int64"),
            keras.layers.Embedding(10, 4, name="ids"),  # Named: default names would shift other tests' names.
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(8, name="out"),
        ]
    )
    model.compile(optimizer=with_communication(keras.optimizers.SGD(0.5), compression="topk", density=0.5), loss="mse")
    table = model.layers[0].embeddings.numpy()
    with caplog.at_level("WARNING", logger="tfdist.keras"):
        loss = model.fit(np.arange(8).reshape(8, 1), np.ones((8, 8)), epochs=5, verbose=0).history["loss"]
    assert loss[-1] < loss[0]
    assert "get sparse (IndexedSlices) gradients" in caplog.text and "ids/embeddings" in caplog.text
    rows = model.layers[0].embeddings.numpy()
    assert not np.allclose(rows[:8], table[:8]) and np.array_equal(rows[8:], table[8:])  # Only the rows used.
    assert [v.name.split("/")[0] for v in model.optimizer.compression_variables] == ["out", "out"]
    assert caplog.text.count("get sparse") == 1  # Once, however often the step is traced.


@pytest.mark.parametrize(
    "compression",
    # Rate 1: the 4x16 kernel (64 values against 40 in factors) is compressed.
    [
        PowerSGD(rank=2, warmup_steps=0, min_compression_rate=1),
        PowerSGD(rank=2, warmup_steps=2, min_compression_rate=1),
        TopK(),
    ],
    ids=["powersgd", "powersgd_warmup", "topk"],
)
def test_a_checkpoint_read_before_the_first_step_restores_the_state_created_in_it(
    compression: Compressor, tmp_path: Path
) -> None:
    # BackupAndRestore reads the backup before fit's first step creates the errors and Q factors: the read
    # must wait for them and restore them, so the resumed model steps exactly as the saved one goes on.
    import tf_keras as keras

    from tfdist.keras import with_communication

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x @ np.ones((4, 1), "float32")

    def model() -> Any:
        keras.utils.set_random_seed(1)
        made = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
        compressor = with_communication(keras.optimizers.SGD(0.02, momentum=0.5), compression=compression)
        made.compile(optimizer=compressor, loss="mse")
        return made

    saved = model()
    saved.fit(x[:48], y[:48], batch_size=16, verbose=0, shuffle=False)
    written = _checkpoint(saved).write(str(tmp_path / "ckpt"))
    resumed = model()
    reader = _checkpoint(resumed)
    reader.read(written)
    assert resumed.optimizer.compression_variables == []  # Not created yet: the read is deferred.
    for m in (saved, resumed):
        m.fit(x[48:], y[48:], batch_size=16, verbose=0, shuffle=False)
    states = list(zip(saved.optimizer.compression_variables, resumed.optimizer.compression_variables))
    assert any(np.abs(a.numpy()).max() > 0 for a, _ in states)  # Errors were kept: the check is not of zeros.
    for a, b in states:
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(saved.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_compressed_model_exports_as_a_saved_model_without_its_state(tmp_path: Path) -> None:
    # A SavedModel's traced save function cannot reach each replica's error: the export leaves the
    # compressor's state out (backups and tf.train.Checkpoint carry it) and loads as the model it was.
    import tf_keras as keras

    from tfdist.keras import with_communication

    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(with_communication(keras.optimizers.SGD(0.01), compression="topk", density=0.1), loss="mse")
    model.fit(x, x.sum(1, keepdims=True), verbose=0)
    model.save(str(tmp_path / "saved"))
    loaded = keras.models.load_model(str(tmp_path / "saved"), compile=False)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def _checkpoint(model: Any) -> Any:
    import tensorflow as tf

    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def test_one_worker_trains_and_counts_its_bytes() -> None:
    # Without a cluster (one replica) the compressors still train: what is not sent waits in the error.
    import tf_keras as keras

    from tfdist.keras import with_communication

    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = x @ np.ones((8, 1), "float32")
    for compression, options, sent in (  # 32 steps: PowerSGD's 25 of warm-up, then 7 compressed.
        ("powersgd", {"rank": 2}, 2 * (8 + 16) + 16 + 16 + 1 + 1),  # And one value: the warm-up's sum, ended.
        ("topk", {}, 2 + 1 + 1 + 1),
    ):
        keras.utils.set_random_seed(1)
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="tanh", name="hidden"),
                keras.layers.Dense(1, name="out"),
            ]
        )
        optimizer = with_communication(keras.optimizers.SGD(0.05), compression=compression, **options)
        model.compile(optimizer=optimizer, loss="mse")
        loss = model.fit(x, y, batch_size=32, epochs=4, verbose=0).history["loss"]
        assert loss[-1] < loss[0] / 2, (compression, loss)
        per_value = 4 if compression == "powersgd" else 8  # Top-k: 1% of each tensor, at least one entry.
        assert optimizer.communication_bytes_per_step == per_value * sent
        assert optimizer.compression_variables, compression


def test_powersgd_under_mixed_precision_trains_like_float32() -> None:
    # LossScaleOptimizer unscales the gradients before the inner optimizer compresses them; the state is
    # float32 whatever the policy.
    import tf_keras as keras

    from tfdist.keras import with_communication

    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = x @ np.ones((8, 1), "float32")
    losses, states = [], []
    for policy in ("float32", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(1)
            model = keras.Sequential(
                [
                    keras.Input((8,)),
                    keras.layers.Dense(16, activation="tanh", name="hidden"),
                    keras.layers.Dense(1, dtype="float32", name="out"),
                ]
            )
            inner = with_communication(keras.optimizers.SGD(0.05), compression="powersgd", rank=2)
            optimizer = keras.mixed_precision.LossScaleOptimizer(inner) if policy != "float32" else inner
            model.compile(optimizer=optimizer, loss="mse")
            losses.append(model.fit(x, y, batch_size=32, epochs=4, verbose=0).history["loss"])
            states.append([v.dtype.name for v in inner.compression_variables])
        finally:
            keras.mixed_precision.set_global_policy("float32")
    assert losses[0][-1] < losses[0][0] / 2
    np.testing.assert_allclose(losses[1], losses[0], rtol=2e-2)
    assert states == [["float32", "float32", "float32"]] * 2  # Error, Q and the warm-up's steps.


def test_topk_of_large_tensors_is_exact_with_ties_and_zeros() -> None:
    # Above 16,384 values a sampled threshold narrows the candidates; the selection must stay top_k's.
    import tensorflow as tf

    from tfdist.comm.topk import topk_sum

    rng = np.random.default_rng(3)
    cases = [
        rng.normal(size=(300, 1000)).astype("float32"),  # Distinct magnitudes.
        np.repeat(np.arange(50, dtype="float32"), 2000),  # Ties across the threshold: the lower index wins.
        np.zeros(40_000, "float32"),  # Nothing passes a threshold of 0 more than everything.
        np.concatenate([np.full(100, 9.0), np.zeros(60_000)]).astype("float32"),  # Fewer large than k.
    ]
    for grad in cases:
        error = rng.normal(size=grad.shape).astype("float32") * 0.01 if grad.ndim == 2 else np.zeros_like(grad)
        summed, errors = topk_sum(
            [tf.constant(grad)], [tf.constant(error)], density=0.01, all_gather=lambda ts: [tf.identity(t) for t in ts]
        )
        flat = (grad + error).reshape(-1).astype("float64")
        pick = np.argsort(-np.abs(flat), kind="stable")[: topk_count(flat.size, density=0.01)]
        want = np.zeros_like(flat)
        want[pick] = flat[pick]
        np.testing.assert_allclose(summed[0].numpy().reshape(-1), want, atol=1e-6)
        np.testing.assert_allclose(errors[0].numpy().reshape(-1), flat - want, atol=1e-6)
