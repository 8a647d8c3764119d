"""A ParameterServerStrategy fit for the elastic PS test: which worker ran each step, seen from the outside.

Usage (the chief's command under tfdist-launch; workers and ps run tfdist's TF server):
    _tasks_elastic_ps.py EPOCHS STEPS WAIT_EPOCH MARKER

Every training step prints ``STEP n`` (n = the optimizer's iteration count) with ``tf.print`` on the worker
that runs it, so the line shows up in that worker's output. Each element of the per-worker input waits
50 ms (tf.data's ``SleepDataset``, no CPU), so one worker cannot race through an epoch. At the end of
epoch WAIT_EPOCH the chief waits (at most 120 s) until MARKER exists: the test creates it when a returned
worker's server is up, so the epochs after it have work for that worker. The chief prints
``EPOCH_END e`` per epoch and ``DONE epochs E`` at the end.
"""

import os
import sys
import time

import tensorflow as tf

import tfdist
from tfdist import keras

epochs, steps, wait_epoch, marker = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
strategy = tfdist.build_strategy("auto")
assert isinstance(strategy, tf.distribute.ParameterServerStrategy), type(strategy)


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    x = tf.random.stateless_normal((256, 4), seed=(1, context.input_pipeline_id))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    flat = tf.nest.flatten(dataset.element_spec)  # each batch 50 ms late (tf.data's SleepDataset, on the worker)
    slow = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=50_000,
        output_types=[s.dtype for s in flat],
        output_shapes=[s.shape for s in flat],
    )
    return tf.data.experimental.from_variant(slow, dataset.element_spec)


class Traced(keras.Model):
    """A linear model whose train step prints, on the worker that runs it, the step it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        tf.print("STEP", self.optimizer.iterations)
        return super().train_step(data)


def _epoch_end(epoch: int, logs: object) -> None:
    print(f"EPOCH_END {epoch}", flush=True)
    if epoch == wait_epoch:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.1)


with strategy.scope():
    model = Traced()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=1)
history = model.fit(
    keras.utils.experimental.DatasetCreator(dataset_fn),
    epochs=epochs,
    steps_per_epoch=steps,
    verbose=0,
    callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=_epoch_end)],
)
print(
    f"DONE epochs {len(history.history['loss'])} loss {history.history['loss'][0]:.4f} "
    f"{history.history['loss'][-1]:.4f}",
    flush=True,
)
