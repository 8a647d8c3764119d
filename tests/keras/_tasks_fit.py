"""What the tasks of tests/keras/test_fit.py run (each task imports this file by path).

The regression data and model come from tests/support/cluster_tasks.py, which other tests share.
"""

from __future__ import annotations

from typing import Any

from tests.support.cluster_tasks import (
    _flat_weights,
    _regression_data,
    _regression_dataset,
    _small_model,
    wait_for_file,
)


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


def _keras3_refusal(strategy: Any) -> dict[str, str]:
    """A Keras 3 model's fit under the parameter-server strategy: refused (tfdist._compat.keras3)."""
    import keras as keras3  # Keras 3, imported after build_strategy: guarded as it is imported.
    import numpy as np

    import tfdist

    with strategy.scope():
        model = keras3.Sequential([keras3.Input((8,)), keras3.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    try:
        model.fit(np.zeros((8, 8)), np.zeros((8, 1)), verbose=0)
    except tfdist.StrategyError as err:
        return {"keras3_error": str(err)}
    return {}


def ps_full(root: str, epochs: int, steps: int, kill_marker: str = "", keras3: bool = False) -> dict[str, Any]:
    """PS fit through fit_input + cluster callbacks on the chief; the evaluator runs the side-car.

    With ``keras3``, the chief also tries a Keras 3 model's fit first (refused).
    """
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
    errors = _keras3_refusal(strategy) if keras3 else {}
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
    """MWMS fit whose only backups are preemption saves; logs 'begin EPOCH ITERATIONS' per epoch.

    Until the file ``log_path + '.sigterm'`` exists (the test writes it once it sent SIGTERM), each epoch
    from the fourth on waits for it at its end (at most a minute): the run is still training when the
    signal comes, however late that is.
    """
    import os
    import time

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    from tfdist import keras

    task = os.environ["TFDIST_TASK"]
    with strategy.scope():
        model = _small_model(keras)

    def _end_of_epoch(epoch: int) -> None:
        time.sleep(epoch_sleep)
        if epoch >= 3:
            wait_for_file(log_path + ".sigterm", 60)

    def _log(kind: str, epoch: int) -> None:
        with open(f"{log_path}.{task.replace(':', '-')}", "a") as f:
            f.write(f"{kind} {epoch} {int(model.optimizer.iterations.numpy())}\n")

    callbacks = [
        keras.PreemptionSafeBackup(backup_dir, save_freq=False),
        keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda e, logs: _log("begin", e), on_epoch_end=lambda e, logs: _end_of_epoch(e)
        ),
    ]
    model.fit(_regression_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    _log("done", epochs)
    return {"done": True}
