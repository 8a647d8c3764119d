"""What the tasks of tests/keras/test_keras3.py run (each task imports this file by path).

Each worker trains a Keras 3 model twice on the same global batches (8 records per worker): alone (no
strategy), then under the MultiWorkerMirroredStrategy that ``tfdist.build_strategy`` built before Keras 3 was imported.
"""

from __future__ import annotations

from typing import Any

PER_WORKER = 8  # Records per worker in a global batch: 16 on 2 workers, 24 on 3.


def _global_batch() -> int:
    """8 records per worker of TF_CONFIG's cluster; 8 in one process (no TF_CONFIG)."""
    import os

    import tfdist

    return PER_WORKER * (tfdist.ClusterSpec.from_tf_config().num_workers if "TF_CONFIG" in os.environ else 1)


def _data() -> tuple[Any, Any, Any, Any]:
    """8 training and 2 validation global batches."""
    import numpy as np

    batch = _global_batch()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(10 * batch, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(10 * batch, 1))).astype("float32")
    return x[: 8 * batch], y[: 8 * batch], x[8 * batch :], y[8 * batch :]


def _dataset(*arrays: Any) -> Any:
    """Global batches split record-wise over the workers (DATA sharding: 8 records each, in order)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices(arrays).batch(_global_batch()).with_options(options)


def _model(keras: Any, steps_per_execution: int = 1) -> Any:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution
    )
    return model


def _train(keras: Any, model: Any, initial: list[Any], epochs: int) -> dict[str, Any]:
    """fit with validation, evaluate and predict; every number a list of floats."""
    import numpy as np

    x, y, x_val, y_val = _data()
    model.set_weights(initial)
    losses: list[float] = []

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            losses.append(float(logs["loss"]))

    history = model.fit(
        _dataset(x, y), validation_data=_dataset(x_val, y_val), epochs=epochs, verbose=0, callbacks=[Steps()]
    )
    evaluated = model.evaluate(_dataset(x_val, y_val), verbose=0, return_dict=True)
    predicted = model.predict(_dataset(x_val), verbose=0)
    return {
        "losses": losses,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "evaluate": {k: float(v) for k, v in evaluated.items()},
        "predict": np.asarray(predicted).ravel().tolist(),
        "weights": np.concatenate([w.ravel() for w in model.get_weights()]).tolist(),
    }


def _counted_model(keras: Any, records: int) -> Any:
    """A linear model on ``x`` whose ``counts`` weight counts the record ids it trained on."""
    import tensorflow as tf

    class Counted(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1, kernel_initializer="zeros")
            # Each replica counts its own and a read sums them (Keras 3's assign_add is an assign, which a
            # mirrored variable of aggregation sum would double); add_weight takes no synchronization.
            self.counts = keras.Variable(
                "zeros", shape=(records,), trainable=False, aggregation="sum", synchronization="on_read", name="counts"
            )

        def call(self, inputs: Any, training: bool = False) -> Any:
            if training:
                ids = tf.cast(inputs["id"], tf.int32)
                self.counts.assign_add(tf.math.bincount(ids, minlength=records, maxlength=records, dtype=tf.float32))
            return self.dense(inputs["x"])

    model = Counted()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def _pipeline_fit(keras: Any, strategy: Any, prefix: str, epochs: int) -> dict[str, Any]:
    """``fit_input(pipeline)`` for a Keras 3 model across workers, and one process over the pipeline's global batches."""
    import numpy as np

    import tfdist
    from tests.support import exact_tasks
    from tfdist.keras import fit_input

    def pipeline() -> Any:
        return exact_tasks.pipeline(prefix + "-*", num_epochs=1, label_key="y", as_supervised=True)

    reference = _counted_model(keras, exact_tasks.RECORDS)
    alone = tfdist.ClusterSpec.local(workers=1)  # cluster=None would mean this worker's share, from TF_CONFIG.
    reference.fit(pipeline().dataset(cluster=alone), epochs=epochs, verbose=0)
    with strategy.scope():
        model = _counted_model(keras, exact_tasks.RECORDS)
    model.fit(fit_input(pipeline(), strategy=strategy), epochs=epochs, verbose=0)

    with strategy.scope():
        counts = model.counts.numpy()  # The sum over every replica of every worker.

    def weights(trained: Any) -> list[float]:
        return np.concatenate([w.ravel() for w in trained.dense.get_weights()]).tolist()

    return {
        "reference": weights(reference),
        "distributed": weights(model),
        "counts": sorted(set(counts.tolist())),
    }


def mwms_equals_one_process(root: str, epochs: int, prefix: str = "") -> dict[str, Any]:
    """The one-process run, the run across workers, and what is refused there, on one worker; with ``prefix``
    (records of tests/support/exact_tasks.py), ``fit_input(pipeline)`` too."""
    import os

    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    import keras  # Keras 3, imported after build_strategy: fixed as it is imported.

    both, initial = trained_both_ways(keras, strategy, epochs)
    x, y, _, _ = _data()
    refused = {}
    with strategy.scope():
        several, model = _model(keras, steps_per_execution=2), _model(keras)
    for name, target, callbacks in (
        ("steps_per_execution", several, []),
        ("save_freq", model, [keras.callbacks.BackupAndRestore(os.path.join(root, "refused"), save_freq=4)]),
    ):
        try:
            target.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=callbacks)
        except tfdist.StrategyError as err:
            refused[name] = str(err)
    return {
        **both,
        "keras": keras.__version__,
        "resumed": _resumed(keras, strategy, root, initial, epochs),
        "refused": refused,
        "pipeline": _pipeline_fit(keras, strategy, prefix, epochs) if prefix else None,
    }


def trained_both_ways(keras: Any, strategy: Any, epochs: int) -> tuple[dict[str, Any], list[Any]]:
    """The same model from the same initial weights, trained (fit with validation, evaluate, predict) in one
    process without a strategy and under ``strategy``, on the same global batches; and those initial weights."""
    keras.utils.set_random_seed(5)
    initial = _model(keras).get_weights()
    reference = _train(keras, _model(keras), initial, epochs)  # No strategy: one process, global batches.
    with strategy.scope():
        model = _model(keras)
    distributed = _train(keras, model, initial, epochs)
    return {"replicas": strategy.num_replicas_in_sync, "reference": reference, "distributed": distributed}, initial


def _recording_writes(model: Any, root: str) -> list[str]:
    """Wraps ``model.save`` and ``model.save_weights`` (what ModelCheckpoint and BackupAndRestore write with) to
    record each path they write: relative to ``root`` under it, else ``aside:`` and the file's name."""
    import os

    writes: list[str] = []

    def recording(save: Any) -> Any:
        def recorded(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            path = os.path.abspath(str(filepath))
            inside = path.startswith(os.path.abspath(root) + os.sep)
            writes.append(os.path.relpath(path, root) if inside else f"aside:{os.path.basename(path)}")
            return save(filepath, *args, **kwargs)

        return recorded

    for name in ("save", "save_weights"):  # This model only, out of Keras' attribute tracking.
        object.__setattr__(model, name, recording(getattr(model, name)))
    return writes


def _resumed(keras: Any, strategy: Any, root: str, initial: list[Any], epochs: int) -> dict[str, Any]:
    """A fit of one epoch that keeps its backup (recording the paths this worker wrote), then a fresh model that
    resumes from the chief's backup."""
    import os

    import numpy as np

    x, y, _, _ = _data()
    backup, saved = os.path.join(root, "backup"), os.path.join(root, "ckpt", "epoch{epoch}.keras")
    with strategy.scope():
        first = _model(keras)
    first.set_weights(initial)
    writes = _recording_writes(first, root)
    writers = [
        keras.callbacks.BackupAndRestore(backup, delete_checkpoint=False),
        keras.callbacks.ModelCheckpoint(saved),
        keras.callbacks.TensorBoard(os.path.join(root, "tb")),
    ]
    first.fit(_dataset(x, y), epochs=1, verbose=0, callbacks=writers)
    after_first = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    with strategy.scope():
        resumed = _model(keras)  # Other initial weights: the backup must replace them.
    seen: list[int] = []
    epochs_seen = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(epoch))
    resumed.fit(
        _dataset(x, y), epochs=epochs, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup), epochs_seen]
    )
    return {
        "epochs_seen": seen,
        "weights": np.concatenate([w.ravel() for w in resumed.get_weights()]).tolist(),
        "files_after_first": after_first,
        "writes": writes,
        "backup_left": os.path.exists(backup),
    }
