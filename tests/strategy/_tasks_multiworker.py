"""What the tasks of tests/strategy/test_multiworker.py run (each task imports this file by path).

The regression data and model come from tests/support/cluster_tasks.py, which other tests share.
"""

from __future__ import annotations

from typing import Any, cast

from tests.support.cluster_tasks import _flat_weights, _regression_dataset, _small_model


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


def mwms_backup_fit(
    backup_dir: str, log_path: str, epochs: int, crash_marker: str = "", hold_epoch: int = -1
) -> dict[str, Any]:
    """MWMS fit with BackupAndRestore; logs 'restart epoch' per finished epoch; may crash once.

    After each epoch's backup it prints ``EPOCH_END task restart epoch`` (fault tests trigger on it).
    ``hold_epoch``: worker 0 waits after that line for that epoch in its first attempt (the group stalls
    with it) until the kill the line triggers lands, however slow the machine.
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
        if task == "worker:0" and restart == "0" and epoch == hold_epoch:
            time.sleep(120)  # Killed (with its group) before this ends.

    callbacks = [keras.callbacks.BackupAndRestore(backup_dir), keras.callbacks.LambdaCallback(on_epoch_end=_epoch_end)]
    history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=callbacks)
    return {"epochs_run": len(history.history["loss"]), "restart": int(restart)}


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
