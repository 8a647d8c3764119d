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


def elastic_until_grown(backup: str, grown: int, max_epochs: int) -> dict[str, Any]:
    """A TensorFlow-free elastic trainer: 0.3 s epochs until two epochs ran in membership ``grown`` or later.

    Prints its task, generation, world size and TF_CONFIG address at start; the leader (TF_CONFIG worker 0)
    keeps the last finished epoch in ``backup`` (as BackupAndRestore) and records each epoch boundary for the
    launcher, printing 'epoch E end'. A restarted group resumes after the backed-up epoch.
    """
    import json
    import os
    import time

    from tfdist.cluster import elastic as membership

    tf_config = json.loads(os.environ["TF_CONFIG"])
    index = tf_config["task"]["index"]
    address = tf_config["cluster"]["worker"][index]
    generation, size = int(os.environ["TFDIST_MEMBERSHIP"]), int(os.environ["TFDIST_WORLD_SIZE"])
    sys.stdout.write(f"start {os.environ['TFDIST_TASK']} generation {generation} world {size} at {address}\n")
    sys.stdout.flush()
    epoch = int(open(backup).read()) + 1 if os.path.exists(backup) else 0
    ran = 0
    while epoch < max_epochs and not (generation >= grown and ran >= 2):
        time.sleep(0.3)
        if index == 0:
            with open(backup + ".tmp", "w") as f:
                f.write(str(epoch))
            os.replace(backup + ".tmp", backup)
            membership.write_boundary(
                os.environ["TFDIST_ELASTIC_DIR"], generation=generation, epoch=epoch, world_size=size
            )
            sys.stdout.write(f"epoch {epoch} end\n")
            sys.stdout.flush()
        epoch, ran = epoch + 1, ran + 1
    return {"generation": generation, "world": size, "address": address, "epoch": epoch}
