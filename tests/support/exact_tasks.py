"""Training tasks that count every record they train on, in a weight the backup restores with the model.

``counted_fit`` runs ``model.fit`` over a real ``TFRecordPipeline`` under MultiWorkerMirroredStrategy. The
model's ``counts`` weight (aggregation SUM) adds a bincount of the record ids of every step over all
replicas, so after a restore it holds exactly what the restored model was trained on: after E epochs of
exactly-once delivery every count is E. The leader prints ``STEP epoch batch`` after each step (the
progress fault triggers wait for).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

RECORDS = 480
FILES = 12
GLOBAL_BATCH = 24
FEATURES_DIM = 4


LABEL_EDGES = (240, 360, 440)  # With labels: ids below 240 are class 0, then 1, 2 and 3 (240, 120, 80, 40).


def write_data(prefix: str, *, compression: str | None = None, labels: bool = False) -> None:
    """480 records ``id``, ``x`` (4 floats) and ``y`` in 12 files; ``labels``: a skewed ``label`` too,
    written per class (``partition_by``: 3 files per class)."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS, FEATURES_DIM)).astype("float32")
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], "float32") + 0.25

    def example(i: int) -> tf.train.Example:
        return tf.train.Example(
            features=tf.train.Features(
                feature={
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].tolist())),
                    "y": tf.train.Feature(float_list=tf.train.FloatList(value=[float(y[i])])),
                    **(
                        {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label_of(i)]))}
                        if labels
                        else {}
                    ),
                }
            )
        )

    write_tfrecords(
        (example(i) for i in range(RECORDS)),
        prefix,
        num_shards=FILES // 4 if labels else FILES,
        compression=compression,
        partition_by="label" if labels else None,
    )


def label_of(record: int) -> int:
    """The class of record ``record`` in data written with ``labels=True``."""
    return sum(record >= edge for edge in LABEL_EDGES)


def pipeline(files: str, **options: Any) -> Any:
    """The counted fits' ``TFRecordPipeline`` over ``files`` (id, x, y; global batch 24, shuffle_buffer 64,
    seed 3); ``options`` add or override pipeline options."""
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    features = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "x": tf.io.FixedLenFeature([FEATURES_DIM], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.float32),
    }
    return TFRecordPipeline(
        files=files,
        **{"features": features, "batch_size": GLOBAL_BATCH, "shuffle_buffer": 64, "seed": 3, **options},
    )


def ideal_weights(prefix: str, *, epochs: int, learning_rate: float = 0.05) -> list[float]:
    """The weights ``counted_fit`` should end with: SGD in float64 over the steps of the epoch order.

    One process reads the pipeline's global batches (the order a step trains on does not depend on the
    number of workers), and numpy takes each mean-squared-error step: no TensorFlow training, so a fit
    on any world size can be compared with it to float32 rounding.
    """
    import numpy as np

    from tfdist.data import DataPosition

    rng = np.random.default_rng(0)
    x = rng.normal(size=(RECORDS, FEATURES_DIM)).astype("float32").astype("float64")
    y = x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25
    w, b = np.zeros(FEATURES_DIM), 0.0
    for epoch in range(epochs):
        reader = pipeline(prefix + "-*")
        reader.start_at(DataPosition(epoch=epoch, step=0))
        for batch in reader.dataset(cluster=None):
            ids = batch["id"].numpy()
            residual = x[ids] @ w + b - y[ids]
            w = w - learning_rate * 2 * x[ids].T @ residual / len(ids)
            b -= learning_rate * 2 * residual.mean()
    return [*w.tolist(), float(b)]


def counted_model(
    *, log_ids: bool = False, print_steps: bool = False, step_tag: str = "", before_step: Any = None
) -> Any:
    """A compiled linear model on ``x`` whose ``counts`` weight (aggregation SUM) counts the ids it trained on;
    ``print_steps``: each step prints ``STEP n`` (``STEP TAG n`` with a ``step_tag``); ``before_step(model)``:
    an op each step runs before anything else of it (a fault's hold, a straggler's sleep)."""
    import tensorflow as tf

    from tfdist import keras

    class Counted(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1, kernel_initializer="zeros")
            self.counts = self.add_weight(
                name="counts",
                shape=(RECORDS,),
                initializer="zeros",
                trainable=False,
                aggregation=tf.VariableAggregation.SUM,
            )

        def call(self, inputs: Any) -> Any:
            return self.dense(inputs)

        def train_step(self, data: Any) -> Any:
            with tf.control_dependencies([before_step(self)] if before_step is not None else []):
                return self._step(data)

        def _step(self, data: Any) -> Any:
            if print_steps:
                tf.print("STEP", *([step_tag] if step_tag else []), self.optimizer.iterations, output_stream=sys.stdout)
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(data["y"][:, None], self(data["x"], training=True))
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            ids = tf.cast(data["id"], tf.int32)
            if log_ids:
                tf.print(
                    "IDS", tf.strings.reduce_join(tf.strings.as_string(ids), separator=","), output_stream=sys.stdout
                )
            self.counts.assign_add(tf.math.bincount(ids, minlength=RECORDS, maxlength=RECORDS, dtype=tf.float32))
            return {"loss": loss}

    model = Counted()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def counted_fit(workdir: str, prefix: str, options: dict[str, Any]) -> dict[str, Any]:
    """One fit; ``options``: epochs, num_epochs, steps_per_epoch, shuffle_buffer, shard_policy, order_streams,
    class_weights (data written with ``labels=True``),
    save_freq, backup ('safe': PreemptionSafeBackup(data=), 'plain': BackupAndRestore + ResumeInput,
    'unlinked': BackupAndRestore alone), preempt ([epoch, batch]: worker:1 sends itself SIGTERM there, first
    attempt only), stale_temp ([epoch, batch]: worker:1 copies the chief's backup there in its first attempt
    and, restarted, puts the copy in its own temporary write directory, as a kill between a save and that
    directory's removal leaves it), hold_at ([epoch, batch]: the leader waits there, first attempt only, for
    the kill its STEP line triggers; with engines whose kill travels, a fast epoch may end before it lands)."""
    import logging
    import shutil

    import tensorflow as tf

    from tfdist import keras
    from tfdist.keras.inputs import enable_determinism

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)  # "Input resumes at ..." is what the tests look for.
    enable_determinism(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = os.environ.get("TFDIST_TASK", "worker:0")
    leader = task == "worker:0"
    restart = int(os.environ.get("TFDIST_RESTART", "0"))
    stratified: dict[str, Any] = {}
    if options.get("class_weights"):  # Data written with labels=True: stratified draws a resume replays.
        features = {
            "id": tf.io.FixedLenFeature([], tf.int64),
            "x": tf.io.FixedLenFeature([FEATURES_DIM], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
        stratified = dict(
            features=features, label_key="label", class_weights=options["class_weights"], order="resumable"
        )
    data = pipeline(
        prefix + "-*",
        num_epochs=options.get("num_epochs", 1),
        shuffle_buffer=options.get("shuffle_buffer", 64),
        shard_policy=options.get("shard_policy", "auto"),
        order_streams=options.get("order_streams"),
        **stratified,
    )

    with strategy.scope():
        model = counted_model(log_ids=bool(options.get("log_ids")))

    preempt = options.get("preempt")
    hold = options.get("hold_at")  # [epoch, batch]: the leader waits there for a kill triggered by its STEP line

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if leader:
                print(f"STEP {self.epoch} {batch}", flush=True)
                if hold and restart == 0 and [self.epoch, batch] == list(hold):
                    time.sleep(120)  # Held here (the group stalls with it) until the kill this line triggers lands.
            if preempt and restart == 0 and task == "worker:1" and [self.epoch, batch] == list(preempt):
                os.kill(os.getpid(), signal.SIGTERM)
            if stale and restart == 0 and task == "worker:1" and [self.epoch, batch] == list(stale):
                shutil.copytree(os.path.join(backup_dir, "chief"), stale_copy)

    backup_dir = os.path.join(workdir, "backup")
    stale = options.get("stale_temp")
    stale_copy = os.path.join(workdir, "stale-chief-backup")
    if stale and task == "worker:1" and restart > 0 and os.path.isdir(stale_copy):
        temporary = os.path.join(backup_dir, "workertemp_1")  # tf-keras' name for worker 1's
        shutil.rmtree(temporary, ignore_errors=True)  # TF 2.21's kill may have left its own there already
        shutil.copytree(stale_copy, temporary)
        print("STALE PLANTED", flush=True)
    save_freq = options.get("save_freq", 4)
    kind = options.get("backup", "safe")
    if kind == "safe":
        callbacks = [keras.PreemptionSafeBackup(backup_dir, save_freq=save_freq, data=data)]
    elif kind == "plain":
        callbacks = [
            keras.callbacks.BackupAndRestore(backup_dir, save_freq=save_freq),
            keras.ResumeInput(data, backup_dir=backup_dir),
        ]
    else:
        callbacks = [keras.callbacks.BackupAndRestore(backup_dir, save_freq=save_freq)]
    callbacks += [keras.ElasticEpochs(), Progress()]
    model.fit(
        data.dataset(),
        epochs=options.get("epochs", 3),
        steps_per_epoch=options.get("steps_per_epoch"),
        verbose=0,
        callbacks=callbacks,
    )
    weights = [float(v) for w in model.dense.weights for v in w.numpy().ravel()]
    return {
        "counts": [int(c) for c in model.counts.numpy()],
        "weights": weights,
        "restart": restart,
        "world": strategy.num_replicas_in_sync,
    }


def counted_ps_fit(workdir: str, prefix: str, options: dict[str, Any]) -> dict[str, Any]:
    """The chief of a ParameterServerStrategy fit over ``fit_input(pipeline)`` (claimed steps), counted.

    ``options``: epochs, steps_per_epoch, num_epochs (None: endless), backup ('plain': BackupAndRestore +
    ResumeInput at epoch ends, 'unlinked': BackupAndRestore alone, or None). Each step prints ``STEP n`` (the optimizer's iterations before it)
    on the worker that runs it (PS fit takes no batch-level callbacks); the chief prints ``EPOCH e`` at each
    epoch's end and returns the counts, the steps claimed and the optimizer's iterations.
    """
    import logging

    import tensorflow as tf

    import tfdist
    from tfdist import keras
    from tfdist.keras.inputs import fit_input

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    strategy = tfdist.build_strategy("auto")
    assert isinstance(strategy, tf.distribute.ParameterServerStrategy), type(strategy)
    data = pipeline(prefix + "-*", num_epochs=options.get("num_epochs"))
    steps = options.get("steps_per_epoch", RECORDS // GLOBAL_BATCH)
    with strategy.scope():
        model = counted_model(print_steps=True)

    class Progress(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            print(f"EPOCH {epoch}", flush=True)

    callbacks: list[Any] = [Progress()]
    if options.get("backup") == "plain":
        backup_dir = os.path.join(workdir, "backup")
        callbacks = [keras.callbacks.BackupAndRestore(backup_dir), keras.ResumeInput(data), *callbacks]
    elif options.get("backup") == "unlinked":
        callbacks = [keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup")), *callbacks]
    x = fit_input(data, strategy=strategy, steps_per_epoch=steps)
    model.fit(x, epochs=options.get("epochs", 3), steps_per_epoch=steps, verbose=0, callbacks=callbacks)
    return {
        "counts": [int(c) for c in model.counts.numpy()],
        "claimed": data.claimed_steps(),
        "iterations": int(model.optimizer.iterations.numpy()),
        "restart": int(os.environ.get("TFDIST_RESTART", "0")),
    }
