"""Functions that run inside the tasks of local test clusters (imported by file in each task)."""

from __future__ import annotations

import os
from typing import Any, cast


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


def mwms_fit(epochs: int = 3) -> dict[str, Any]:
    """build_strategy('auto') on a 2-worker cluster, a short fit; report what the test checks."""
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    import tensorflow as tf

    from tfdist import keras

    keras.utils.set_random_seed(1)
    spec = tfdist.ClusterSpec.from_tf_config()
    dataset = _regression_dataset()
    with strategy.scope():
        model = _small_model(keras)
    history = model.fit(dataset, epochs=epochs, verbose=0)
    weights = _flat_weights(model)
    return {
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "is_mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        "fingerprint": spec.fingerprint,
        "is_chief": spec.is_chief,
        "loss": [float(v) for v in history.history["loss"]],
        "weights": weights.tolist(),
    }


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


def mwms_backup_fit(
    backup_dir: str, log_path: str, epochs: int, crash_marker: str = "", epoch_sleep: float = 0.0
) -> dict[str, Any]:
    """MWMS fit with BackupAndRestore; logs 'restart epoch' per finished epoch; may crash once.

    After each epoch's backup it prints ``EPOCH_END task restart epoch`` (fault tests trigger on it).
    """
    import os
    import time

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    from tfdist import keras

    keras.utils.set_random_seed(1)
    task, restart = os.environ["TFDIST_TASK"], os.environ["TFDIST_RESTART"]
    dataset = _regression_dataset()
    with strategy.scope():
        model = _small_model(keras)

    def _epoch_end(epoch: int, logs: Any) -> None:
        with open(f"{log_path}.{task.replace(':', '-')}", "a") as f:
            f.write(f"{restart} {epoch}\n")
        print(f"EPOCH_END {task} {restart} {epoch}", flush=True)
        if crash_marker and task == "worker:1" and epoch == 1 and not os.path.exists(crash_marker):
            open(crash_marker, "w").close()
            os._exit(3)
        time.sleep(epoch_sleep)

    callbacks = [keras.callbacks.BackupAndRestore(backup_dir), keras.callbacks.LambdaCallback(on_epoch_end=_epoch_end)]
    history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=callbacks)
    return {"epochs_run": len(history.history["loss"]), "restart": int(restart)}


def ready_then_fit(seconds: float) -> dict[str, Any]:
    """Builds the strategy, prints READY, waits (ports can be probed from outside), then trains."""
    import sys
    import time

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    time.sleep(seconds)
    from tfdist import keras

    with strategy.scope():
        model = _small_model(keras)
    history = model.fit(_regression_dataset(), epochs=2, verbose=0)
    return {"replicas": strategy.num_replicas_in_sync, "loss": [float(v) for v in history.history["loss"]]}


def mwms_pipeline(prefix: str) -> dict[str, Any]:
    """Reads this worker's share (from TF_CONFIG) for one epoch, then fits and evaluates on it under MWMS.

    The global batch (24) divides neither the data nor a worker's share, so the last batches are partial
    and the workers' step counts may differ: ``examples`` counts what fit and evaluate really consumed.
    """
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    import tensorflow as tf

    from tfdist import keras
    from tfdist.data import TFRecordPipeline

    class Examples(keras.metrics.Metric):  # Summed over replicas and workers, like every Keras metric.
        def __init__(self) -> None:
            super().__init__(name="examples")
            self.count = self.add_weight(name="count", initializer="zeros", dtype=tf.float32)

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            self.count.assign_add(tf.cast(tf.shape(y_true)[0], tf.float32))

        def result(self) -> Any:
            return self.count

    features = {
        "x": tf.io.FixedLenFeature([8], tf.float32),
        "id": tf.io.FixedLenFeature([], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*", features=features, batch_size=24, label_key="label", shuffle_buffer=100, seed=1
    )
    ids = [int(v) for batch in pipeline.dataset() for v in batch["id"].numpy()]
    import dataclasses

    supervised = dataclasses.replace(cast(Any, pipeline), as_supervised=True)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Lambda(lambda f: f["x"]), keras.layers.Dense(3)])
        model.compile(
            optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[Examples()]
        )
    history = model.fit(supervised.dataset(), epochs=1, verbose=0)
    evaluated = model.evaluate(supervised.dataset(), verbose=0, return_dict=True)
    return {
        "ids": ids,
        "plan": pipeline.plan(2).policy,
        "loss": history.history["loss"][-1],
        "fit_examples": history.history["examples"][-1],
        "evaluated": evaluated["examples"],
    }


def service_consumer(prefix: str) -> dict[str, Any]:
    """Reads a pipeline through the launcher's tf.data service; returns the ids this worker got."""
    import os

    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    features = {"id": tf.io.FixedLenFeature([], tf.int64)}
    pipeline = TFRecordPipeline(
        files=f"{prefix}-*",
        features=features,
        batch_size=10,
        drop_remainder=False,
        data_service=os.environ["TFDIST_DATA_SERVICE"],
    )
    return {"ids": [int(v) for batch in pipeline.dataset() for v in batch["id"].numpy()]}


def _equivalence_fn(global_batch: int) -> Any:
    """A dataset function whose global batch k is records k*B..(k+1)*B-1 whatever the replica layout."""
    import tensorflow as tf

    x, y = _regression_data(n=1024)

    def dataset_fn(context: Any) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        return dataset.batch(context.get_per_replica_batch_size(global_batch), drop_remainder=True)

    return dataset_fn


def _equivalence_model(keras: Any) -> Any:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _equivalence_fit(strategy: Any, global_batch: int, epochs: int) -> dict[str, Any]:
    from tfdist import keras

    keras.enable_determinism(5)
    with strategy.scope():
        model = _equivalence_model(keras)
    steps = 1024 // global_batch
    model.fit(
        keras.fit_input(_equivalence_fn(global_batch), strategy=strategy, steps_per_epoch=steps),
        epochs=epochs,
        steps_per_epoch=steps,
        verbose=0,
    )
    return {"weights": _flat_weights(model).tolist(), "replicas": strategy.num_replicas_in_sync}


def equivalence_mwms(global_batch: int, epochs: int) -> dict[str, Any]:
    """2-worker MWMS fit through fit_input; returns the final weights."""
    import tfdist

    return _equivalence_fit(tfdist.build_strategy("auto", communication="ring"), global_batch, epochs)


def equivalence_mirrored(global_batch: int, epochs: int) -> dict[str, Any]:
    """One process, MirroredStrategy over 2 logical CPUs, the same global batch."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tfdist

    strategy = tfdist.build_strategy("mirrored", cluster=None, devices=["/cpu:0", "/cpu:1"])
    return _equivalence_fit(strategy, global_batch, epochs)


def mwms_with_cluster_callbacks(root: str, epochs: int) -> dict[str, Any]:
    """MWMS fit with tfdist's cluster callbacks; reports what each task saw."""
    import os

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    from tfdist import keras

    dirs = {name: os.path.join(root, name) for name in ("backup", "ckpt", "tb", "throughput")}
    with strategy.scope():
        model = _small_model(keras)
    callbacks = keras.cluster_callbacks(
        backup_dir=dirs["backup"],
        checkpoint_dir=dirs["ckpt"],
        tensorboard_dir=dirs["tb"],
        global_batch_size=64,
        report_dir=dirs["throughput"],
    )
    model.fit(_regression_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    logger = next(c for c in callbacks if isinstance(c, keras.ThroughputLogger))
    return {
        "callbacks": sorted(type(c).__name__ for c in callbacks),
        "throughput": logger.history,
        "stragglers": logger.stragglers,
    }


def ps_full(root: str, epochs: int, steps: int, kill_marker: str = "") -> dict[str, Any]:
    """PS fit through fit_input + cluster callbacks on the chief; the evaluator runs the side-car."""
    import os

    import numpy as np
    import tensorflow as tf

    import tfdist
    from tfdist import keras

    spec = tfdist.ClusterSpec.from_tf_config()
    dirs = {name: os.path.join(root, name) for name in ("backup", "ckpt", "tb")}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")

    def build() -> Any:
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss="binary_crossentropy",
            metrics=["accuracy"],
            steps_per_execution=5,
        )
        return model

    if spec.task_type == "evaluator":
        model = build()
        data = tf.data.Dataset.from_tensor_slices((x[:512], y[:512])).batch(128)
        keras.sidecar_evaluate(
            model, data, checkpoint_dir=dirs["ckpt"], epochs=epochs, log_dir=os.path.join(dirs["tb"], "eval")
        )
        return {"evaluated": True}
    strategy = tfdist.build_strategy("auto")

    def dataset_fn(context: Any) -> Any:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines, context.input_pipeline_id
        )
        return (
            dataset.shuffle(2048, seed=context.input_pipeline_id).repeat().batch(context.get_per_replica_batch_size(64))
        )

    with strategy.scope():
        model = build()
    epochs_seen: list[int] = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: epochs_seen.append(epoch),
        # After the backup callback: the backup of `epoch` exists.
        on_epoch_end=lambda epoch, logs: print(f"EPOCH_END {epoch}", flush=True),
    )
    callbacks = keras.cluster_callbacks(
        backup_dir=dirs["backup"], checkpoint_dir=dirs["ckpt"], tensorboard_dir=dirs["tb"]
    ) + [record]
    errors = {}
    for name, source, given_steps in (
        ("missing_steps_error", dataset_fn, None),
        ("dataset_not_function_error", tf.data.Dataset.range(3), steps),
    ):
        try:
            keras.fit_input(source, strategy=strategy, steps_per_epoch=given_steps)
        except tfdist.StrategyError as err:
            errors[name] = str(err)
    history = model.fit(
        keras.fit_input(dataset_fn, strategy=strategy, steps_per_epoch=steps),
        epochs=epochs,
        steps_per_epoch=steps,
        verbose=0,
        callbacks=callbacks,
    )
    return {
        "loss": history.history["loss"],
        "epochs_seen": epochs_seen,
        "restart": int(os.environ["TFDIST_RESTART"]),
        **errors,
    }


def preemptible_fit(backup_dir: str, log_path: str, epochs: int, epoch_sleep: float) -> dict[str, Any]:
    """MWMS fit whose only backups are preemption saves; logs 'begin EPOCH ITERATIONS' per epoch."""
    import os
    import time

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    from tfdist import keras

    task = os.environ["TFDIST_TASK"]
    with strategy.scope():
        model = _small_model(keras)

    def _log(kind: str, epoch: int) -> None:
        with open(f"{log_path}.{task.replace(':', '-')}", "a") as f:
            f.write(f"{kind} {epoch} {int(model.optimizer.iterations.numpy())}\n")

    callbacks = [
        keras.PreemptionSafeBackup(backup_dir, save_freq=False),
        keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda e, logs: _log("begin", e), on_epoch_end=lambda e, logs: time.sleep(epoch_sleep)
        ),
    ]
    model.fit(_regression_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    _log("done", epochs)
    return {"done": True}


def _comm_fit(
    keras: Any,
    strategy: Any,
    *,
    batch: int,
    epochs: int,
    compression: str = "",
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
    from tfdist.comm.autotune import CollectiveTuning, autotune_collectives

    out: dict[str, Any] = {
        name: _comm_fit(keras, strategy, batch=64, epochs=4, compression=name) for name in ("none", "fp16", "bf16")
    }
    state_dir = os.path.dirname(tuning_path)
    for name, compressor in (("powersgd", {"rank": 2}), ("topk", {"density": 0.25})):
        out[name] = _comm_fit(
            keras, strategy, batch=64, epochs=4, compression=name, state_dir=os.path.join(state_dir, name), **compressor
        )
    out["local1"] = _comm_fit(keras, strategy, batch=64, epochs=4, local=1)
    out["local4"] = _comm_fit(keras, strategy, batch=64, epochs=4, local=4)
    out["accumulate4_powersgd"] = _comm_fit(
        keras, strategy, batch=128, epochs=3, accumulate=4, compression="powersgd", rank=2
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
    """PowerSGD, top-k and local SGD fits on whatever number of workers the cluster has (3 in the test)."""
    import tfdist

    strategy = tfdist.build_strategy("multi_worker_mirrored", communication="ring", timeout_seconds=120)
    from tfdist import keras

    fits: dict[str, dict[str, Any]] = {
        "plain": {},
        "powersgd": {"compression": "powersgd", "rank": 2},
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


def _write_result(root: str, value: dict[str, Any]) -> None:
    """Writes ``value`` (plus this task's identity) to ``root/result-TASK-RESTART.json``."""
    import json
    import os
    import time

    task, restart = os.environ["TFDIST_TASK"], os.environ.get("TFDIST_RESTART", "0")
    env = {
        k: os.environ.get(k)
        for k in (
            "TF_CONFIG",
            "TF_CPP_MIN_LOG_LEVEL",
            "TF_USE_LEGACY_KERAS",
            "SLURM_PROCID",
            "SLURM_STEP_ID",
            "SLURM_JOB_ID",
        )
    }
    path = os.path.join(root, f"result-{task.replace(':', '-')}-{restart}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(value, task=task, restart=int(restart), env=env, end=time.time()), f)
    os.replace(path + ".tmp", path)


def slurm_mwms(root: str, epochs: int, crash_epoch: int = -1) -> dict[str, Any]:
    """MWMS fit under Slurm: BackupAndRestore + ckpt-{epoch} in ``root``; worker:1 may crash once.

    The evaluator task runs the side-car on the checkpoints instead. Results go to files in ``root``.
    """
    import os

    import tfdist
    from tfdist import keras

    spec = tfdist.ClusterSpec.from_tf_config()
    if spec.task_type == "evaluator":
        keras.utils.set_random_seed(1)
        model = _small_model(keras)
        keras.sidecar_evaluate(model, _regression_dataset(), checkpoint_dir=os.path.join(root, "ckpt"), epochs=epochs)
        _write_result(root, {"evaluated": True})
        return {}
    strategy = tfdist.build_strategy("auto", communication="ring")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = _small_model(keras)
    begun: list[int] = []
    marker = os.path.join(root, "crashed")

    def _epoch_end(epoch: int, logs: Any) -> None:
        if spec.task_type == "worker" and spec.task_id == 1 and epoch == crash_epoch and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)

    callbacks = keras.cluster_callbacks(
        backup_dir=os.path.join(root, "backup"), checkpoint_dir=os.path.join(root, "ckpt")
    )
    callbacks.append(
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: begun.append(epoch), on_epoch_end=_epoch_end)
    )
    model.fit(_regression_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    _write_result(
        root,
        {"epochs_begun": begun, "weights": _flat_weights(model).tolist(), "replicas": strategy.num_replicas_in_sync},
    )
    return {}


def slurm_ps(root: str) -> dict[str, Any]:
    """The parameter-server fit on the chief; records when the coordinator finished."""
    result = ps_fit(epochs=2, steps=5)
    _write_result(root, {"is_ps": result["is_ps"], "loss": result["loss"]})
    return {}


def slurm_elastic(root: str, epochs: int, pause_epoch: int, pause_batch: int) -> dict[str, Any]:
    """Elastic MWMS fit under Slurm, counted: records what each membership saw in ``root``.

    The fit is tests/support/exact_tasks.py's: 480 records in ``root/data/part-*`` (the test writes them),
    global batch 24, a ``counts`` weight the backup restores with the model, ``BackupAndRestore`` every 4
    batches with ``ResumeInput``. In membership 0 (before any requeue) every task stops after batch
    ``pause_batch`` of epoch ``pause_epoch`` (mid-epoch, after a backup): worker 0 writes ``root/paused`` (the
    test's trigger to fail the node) and all wait there to be killed by Slurm.
    """
    import importlib.util
    import json
    import logging
    import os
    import time

    import tensorflow as tf

    import tfdist
    from tfdist import keras
    from tfdist.keras import elastic

    spec = importlib.util.spec_from_file_location(
        "_exact_tasks", os.path.join(os.path.dirname(__file__), "exact_tasks.py")
    )
    assert spec is not None and spec.loader is not None
    exact = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exact)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)  # "Input resumes at ..." is what the test looks for.
    task, generation = os.environ["TFDIST_TASK"], elastic.membership()
    strategy = tfdist.build_strategy("auto", communication="ring")
    keras.utils.set_random_seed(1)
    tf.config.experimental.enable_op_determinism()
    with strategy.scope():
        model = exact.counted_model()
    record: dict[str, Any] = {
        "task": task,
        "generation": generation,
        "world_size": elastic.world_size(),
        "replicas": strategy.num_replicas_in_sync,
        "slurm_restart": os.environ.get("SLURM_RESTART_COUNT"),
        "per_replica_batch": keras.per_replica_batch(exact.GLOBAL_BATCH, strategy.num_replicas_in_sync),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "epochs_begun": [],
        "steps": {},
        "logged_world_size": [],
    }
    path = os.path.join(root, f"elastic-{task.replace(':', '-')}-g{generation}.json")

    def _save() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    def _epoch_end(epoch: int, logs: Any) -> None:
        record["logged_world_size"].append(logs.get("world_size"))
        _save()

    def _batch_end(batch: int, logs: Any) -> None:
        epoch = record["epochs_begun"][-1]
        record["steps"][str(epoch)] = record["steps"].get(str(epoch), 0) + 1
        if generation == 0 and (epoch, batch) == (pause_epoch, pause_batch):
            _save()
            if task == "worker:0":
                open(os.path.join(root, "paused"), "w").close()
            time.sleep(300)  # Slurm kills this task when the test fails the node; never reached in a passing run.
            os._exit(4)

    pipeline = exact.pipeline(os.path.join(root, "data", "part-*"))
    backup_dir = os.path.join(root, "backup")
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir, save_freq=4),
        keras.ResumeInput(pipeline, backup_dir=backup_dir),
        keras.ElasticEpochs(),
        keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: record["epochs_begun"].append(epoch),
            on_train_batch_end=_batch_end,
            on_epoch_end=_epoch_end,
        ),
    ]
    _save()
    history = model.fit(pipeline.dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    record.update(
        done=True,
        loss=history.history["loss"],
        weights=[float(v) for w in model.dense.weights for v in w.numpy().ravel()],
        counts=[int(c) for c in model.counts.numpy()],
    )
    _save()
    return {}
