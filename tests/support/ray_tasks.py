"""Functions that run inside the tasks of the Ray engine tests (imported by file in each task)."""

from __future__ import annotations

import sys
from typing import Any


def ps_fit_progress(epochs: int, steps: int) -> dict[str, Any]:
    """ParameterServerStrategy fit on the chief; prints 'progress epoch N' after each epoch (kill triggers)."""
    import tfdist

    strategy = tfdist.build_strategy("auto")
    import numpy as np
    import tensorflow as tf

    from tfdist import keras

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines, context.input_pipeline_id
        )
        return (
            dataset.shuffle(2048, seed=context.input_pipeline_id).repeat().batch(context.get_per_replica_batch_size(64))
        )

    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", steps_per_execution=5)

    def _report(epoch: int, logs: Any) -> None:
        sys.stdout.write(f"progress epoch {epoch}\n")
        sys.stdout.flush()

    history = model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=epochs,
        steps_per_epoch=steps,
        verbose=0,
        callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=_report)],
    )
    return {
        "is_ps": isinstance(strategy, tf.distribute.ParameterServerStrategy),
        "workers": len(tfdist.ClusterSpec.from_tf_config().jobs["worker"]),
        "loss": [float(v) for v in history.history["loss"]],
    }
