"""Task bodies several test files run (imported by file in each task), and the small regression fit they share.

``ps_fit`` (tests/strategy and the Slurm jobs), ``ready_then_fit`` (tests/strategy, tests/launch) and the
communication tasks stay here; a body only one test file runs sits beside it (``_tasks_*.py``).
"""

from __future__ import annotations

import os
from typing import Any


def _regression_data(n: int = 512, seed: int = 0) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    w = rng.normal(size=(8, 1)).astype("float32")
    return x, (x @ w + 0.1 * rng.normal(size=(n, 1))).astype("float32")


def _sharded_by_element(dataset: Any) -> Any:
    """``dataset`` for MWMS to shard by element (DATA), without TF's file-sharding fallback warning."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def _flat_weights(model: Any) -> Any:
    """All of a model's weights as one flat numpy vector."""
    import numpy as np

    return np.concatenate([w.reshape(-1) for w in model.get_weights()])


def _regression_dataset(batch: int = 64) -> Any:
    """The regression data, batched, sharded by element."""
    import tensorflow as tf

    x, y = _regression_data()
    return _sharded_by_element(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))


def _small_model(keras: Any) -> Any:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def ps_fit(epochs: int = 3, steps: int = 20, epoch_sleep: float = 0.0) -> dict[str, Any]:
    """build_strategy('auto') on chief+workers+ps; tf-keras fit/evaluate with a sharded embedding."""
    import tfdist

    strategy = tfdist.build_strategy("auto", partition="fixed")
    import numpy as np
    import tensorflow as tf

    from tfdist import keras

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    # 100 distinct ids spread over both table shards, each seen ~40 times in 3 x 20 steps, and Adam: the
    # loss falls clearly within the run (SGD 0.1 over 1000 ids barely learned, so "last < first" flaked).
    ids = rng.integers(0, 100, size=(2048, 1)) * 10
    target = (np.sin(ids / 50.0)).astype("float32")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((ids, target)).shuffle(2048, seed=context.input_pipeline_id)
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.repeat().batch(context.get_per_replica_batch_size(64)).prefetch(2)

    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((1,), dtype="int64"),
                keras.layers.Embedding(1000, 8),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", steps_per_execution=5)
    creator = keras.utils.experimental.DatasetCreator(dataset_fn)
    import time

    def _epoch_end(epoch: int, logs: Any) -> None:
        print(f"EPOCH_END {epoch}", flush=True)  # Fault tests trigger their kills on this line.
        time.sleep(epoch_sleep)

    pause = keras.callbacks.LambdaCallback(on_epoch_end=_epoch_end)
    history = model.fit(creator, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[pause])
    evaluation = model.evaluate(creator, steps=5, verbose=0, return_dict=True)
    table = model.layers[0].embeddings
    shards = getattr(table, "variables", [table])
    from tfdist.errors import StrategyError
    from tfdist.keras import with_communication

    try:  # No all-reduce to compress under parameter servers: refused with the alternative named.
        with strategy.scope():
            with_communication(keras.optimizers.SGD(0.1), compression="powersgd")
        refused = ""
    except StrategyError as error:
        refused = str(error)
    return {
        "compressor_refused": refused,
        "strategy": type(strategy).__name__,
        "is_ps": isinstance(strategy, tf.distribute.ParameterServerStrategy),
        "loss": [float(v) for v in history.history["loss"]],
        "eval_loss": float(evaluation["loss"]),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "shard_devices": [v.device for v in shards],
        "shard_rows": [int(v.shape[0]) for v in shards],
    }


def wait_for_file(path: str, seconds: float) -> None:
    """Waits until ``path`` exists (a test writes it once something happened), ``seconds`` at most."""
    import time

    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def ready_then_fit(seconds: float, until: str = "") -> dict[str, Any]:
    """Builds the strategy, prints READY, waits ``seconds`` (ports can be probed from outside; with ``until``,
    until that file exists, ``seconds`` at most), then trains."""
    import sys
    import time

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    if until:
        wait_for_file(until, seconds)
    else:
        time.sleep(seconds)
    from tfdist import keras

    with strategy.scope():
        model = _small_model(keras)
    history = model.fit(_regression_dataset(), epochs=2, verbose=0)
    return {"replicas": strategy.num_replicas_in_sync, "loss": [float(v) for v in history.history["loss"]]}


def _comm_fit(
    keras: Any,
    strategy: Any,
    *,
    batch: int,
    epochs: int,
    compression: Any = "",
    accumulate: int = 1,
    tuning: str = "",
    state_dir: str = "",
    local: int = 0,
    **compressor: Any,
) -> dict[str, Any]:
    """One seeded fit of the regression model; compression/accumulation/tuning/local SGD as asked."""
    import numpy as np

    from tfdist.keras import accumulate_gradients, local_sgd, with_communication

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)
        if compression or tuning:
            optimizer = with_communication(
                optimizer, compression=compression or "none", tuning=tuning or None, **compressor
            )
        model.compile(optimizer=optimizer, loss="mse")
    accumulate_gradients(model, steps=accumulate)
    middle: list[float] = []
    callbacks = []
    if local:
        local_sgd(model, period=local)

        def probe(batch: int, logs: Any) -> None:  # The weights halfway through a period: this worker's own.
            if not middle and int(optimizer.iterations.numpy()) % local == local // 2:
                middle.append(float(np.sum(np.abs(_flat_weights(model)))))

        callbacks.append(keras.callbacks.LambdaCallback(on_train_batch_end=probe))
    history = model.fit(_regression_dataset(batch), epochs=epochs, verbose=0, callbacks=callbacks)
    weights = _flat_weights(model)
    out = {
        "middle": middle,
        "loss": [float(v) for v in history.history["loss"]],
        "weights": weights.tolist(),
        "bytes": getattr(optimizer, "communication_bytes_per_step", None),
        "updates": int(optimizer.iterations.numpy()),
    }
    if state_dir:
        out["state"] = _compressor_state(strategy, optimizer, state_dir)
    return out


def _compressor_state(strategy: Any, optimizer: Any, directory: str) -> dict[str, Any]:
    """This worker's own compressor state, and what a checkpoint written by every worker saves of it."""
    import tensorflow as tf

    import tfdist

    spec = tfdist.ClusterSpec.from_tf_config()
    path = tf.train.Checkpoint(optimizer=optimizer).write(os.path.join(directory, f"state-{spec.task_id}"))
    states = optimizer.compression_variables  # In the order they are tracked.

    def local() -> list[Any]:
        return [strategy.experimental_local_results(v)[0].numpy().tolist() for v in states]

    def saved(i: int) -> Any:  # The Q factor as a variable; an error as the rows of every replica.
        key = f"optimizer/tfdist_compression_state/{i}/.ATTRIBUTES/"
        names = {name for name, _ in tf.train.list_variables(path)}
        if key + "VARIABLE_VALUE" in names:
            return tf.train.load_variable(path, key + "VARIABLE_VALUE").tolist()
        return {
            "rows": tf.train.load_variable(path, key + "per_replica").tolist(),
            "ids": tf.train.load_variable(path, key + "replica_ids").tolist(),
        }

    out = {"names": [v.name for v in states], "local": local(), "saved": [saved(i) for i in range(len(states))]}
    for v in states:  # A restore must bring the values back, not find them still there.
        for component in strategy.experimental_local_results(v):
            component.assign(tf.zeros_like(component))
    tf.train.Checkpoint(optimizer=optimizer).read(path).assert_existing_objects_matched()
    out["restored"] = local()  # What a resume from that checkpoint starts with, on this worker.
    return out


def communication_checks(tuning_path: str) -> dict[str, Any]:
    """Compression, accumulation and the autotuner on one 2-worker MWMS cluster (many checks per TF start)."""
    import tfdist

    strategy = tfdist.build_strategy(
        "multi_worker_mirrored", communication="ring", bytes_per_pack=1 << 20, timeout_seconds=120
    )
    from tfdist import keras
    from tfdist._compat import communication_options
    from tfdist.comm import PowerSGD, TopK
    from tfdist.comm.autotune import CollectiveTuning, autotune_collectives

    out: dict[str, Any] = {
        name: _comm_fit(keras, strategy, batch=64, epochs=4, compression=name) for name in ("none", "fp16", "bf16")
    }
    state_dir = os.path.dirname(tuning_path)
    # PowerSGD from the first step (its default warm-up would take 25 of these 32 steps).
    for name, compressor in (("powersgd", PowerSGD(rank=2, warmup_steps=0)), ("topk", TopK(density=0.25))):
        out[name] = _comm_fit(
            keras, strategy, batch=64, epochs=4, compression=compressor, state_dir=os.path.join(state_dir, name)
        )
    out["local1"] = _comm_fit(keras, strategy, batch=64, epochs=4, local=1)
    out["local4"] = _comm_fit(keras, strategy, batch=64, epochs=4, local=4)
    out["accumulate4_powersgd"] = _comm_fit(
        keras, strategy, batch=128, epochs=3, accumulate=4, compression=PowerSGD(rank=2, warmup_steps=0)
    )
    out["plain"] = _comm_fit(keras, strategy, batch=64, epochs=4)
    out["batch128"] = _comm_fit(keras, strategy, batch=128, epochs=3)
    out["accumulate4"] = _comm_fit(keras, strategy, batch=128, epochs=3, accumulate=4)
    out["accumulate4_fp16"] = _comm_fit(keras, strategy, batch=128, epochs=3, accumulate=4, compression="fp16")
    shapes = [(8, 16), (16,), (16, 1), (1,), (512, 1024)]
    tuning = autotune_collectives(strategy, shapes, candidates=(0, 64 << 10, 1 << 20), repeats=2)
    spec = tfdist.ClusterSpec.from_tf_config()
    if spec.is_chief:
        tuning.save(tuning_path)
    out["tuning"] = {
        "bytes_per_pack": tuning.bytes_per_pack,
        "split_bytes": tuning.split_bytes,
        "timings_ms": dict(tuning.timings_ms),
        "workers": tuning.workers,
        "total_bytes": tuning.total_bytes,
    }
    strategy.reduce("SUM", strategy.experimental_distribute_values_from_function(lambda c: 1.0), axis=None)
    out["reloaded_equal"] = CollectiveTuning.load(tuning_path) == tuning if spec.is_chief else None
    out["tuned_fit"] = _comm_fit(keras, strategy, batch=64, epochs=2, tuning=tuning_path)
    out["fp16_sums"] = _fp16_sums(strategy)
    out["loss_scaled"] = _loss_scaled_fit(keras, strategy)
    out["sparse"] = _sparse_fit(keras, strategy)
    effective = communication_options(strategy)  # What TF's all-reduce launchers merge per call.
    out["strategy_options"] = {
        "implementation": effective.implementation.name,
        "bytes_per_pack": effective.bytes_per_pack,
        "timeout_seconds": effective.timeout_seconds,
    }
    return out


def compressed_fits() -> dict[str, Any]:
    """PowerSGD (also after a warm-up), top-k and local SGD fits on whatever number of workers the cluster has
    (3 in the test)."""
    import tfdist
    from tfdist.comm import PowerSGD

    strategy = tfdist.build_strategy("multi_worker_mirrored", communication="ring", timeout_seconds=120)
    from tfdist import keras

    fits: dict[str, dict[str, Any]] = {
        "plain": {},
        "powersgd": {"compression": PowerSGD(rank=2, warmup_steps=0)},
        "powersgd_warm3": {"compression": PowerSGD(rank=2, warmup_steps=3)},
        "powersgd_all_warm": {"compression": PowerSGD(rank=2, warmup_steps=10**6)},
        "topk": {"compression": "topk", "density": 0.25},
        "local1": {"local": 1},
        "local4": {"local": 4},
    }
    return {name: _comm_fit(keras, strategy, batch=96, epochs=4, **options) for name, options in fits.items()}


def _sparse_fit(keras: Any, strategy: Any) -> dict[str, Any]:
    """An embedding (IndexedSlices gradient) next to dense layers, with fp16 compression of the dense ones."""
    import numpy as np
    import tensorflow as tf

    from tfdist.keras import with_communication

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, size=(512,))
    targets = (ids % 7 / 7.0).astype("float32")
    data = _sharded_by_element(tf.data.Dataset.from_tensor_slices((ids, targets)).batch(64))
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((), dtype="int64"),
                keras.layers.Embedding(50, 4),
                keras.layers.Dense(8, activation="tanh"),
                keras.layers.Dense(1),
            ]
        )
        optimizer = with_communication(keras.optimizers.SGD(0.1), compression="fp16")
        model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(data, epochs=4, verbose=0)
    weights = _flat_weights(model)
    return {
        "loss": [float(v) for v in history.history["loss"]],
        "weights": weights.tolist(),
        "bytes": optimizer.communication_bytes_per_step,
    }


def _loss_scaled_fit(keras: Any, strategy: Any) -> dict[str, Any]:
    """Mixed precision: LossScaleOptimizer around an fp16-compressing optimizer, starting at an overflowing scale."""
    import numpy as np

    from tfdist.keras import with_communication

    keras.utils.set_random_seed(1)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = keras.Sequential(
                [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1, dtype="float32")]
            )
            inner = with_communication(keras.optimizers.SGD(0.05), compression="fp16")
            optimizer = keras.mixed_precision.LossScaleOptimizer(inner, initial_scale=2.0**40)
            model.compile(optimizer=optimizer, loss="mse")
        history = model.fit(_regression_dataset(64), epochs=5, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    weights = _flat_weights(model)
    return {
        "loss": [float(v) for v in history.history["loss"]],
        "weights": weights.tolist(),
        "final_scale": float(optimizer.loss_scale.numpy()),
        "finite": bool(np.isfinite(weights).all()),
    }


def _fp16_sums(strategy: Any) -> dict[str, list[float]]:
    """fp16 all-reduce of values whose sum overflows float16, and of a non-finite gradient."""
    import tensorflow as tf

    from tfdist.comm.collective import CollectiveConfig, all_reduce_sum

    device = strategy.extended.worker_devices[0]
    fp16 = CollectiveConfig(compression="fp16")

    def reduce(values: list[float]) -> list[float]:
        def replica_fn() -> Any:
            with tf.device(device):
                return all_reduce_sum([tf.constant(values)], fp16)[0]

        result = strategy.run(tf.function(replica_fn))
        return [float(v) for v in strategy.experimental_local_results(result)[0].numpy()]

    return {
        "large": reduce([60000.0, 1e-6, -3.0, 0.0]),
        "inf": reduce([float("inf"), 1.0]),
        "zeros": reduce([0.0, 0.0]),
    }
