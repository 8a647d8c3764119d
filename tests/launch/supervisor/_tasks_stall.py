"""What the tasks of tests/launch/supervisor/test_stall.py run (each task imports this file by path).

Two workers train under MultiWorkerMirroredStrategy; worker:1 prints ``STUCK python <time>`` and sleeps an hour
in its fourth step: inside a ``tf.py_function`` of ``fit``'s train step, or in the Python of a custom loop.
worker:0 then waits in the step's all-reduce. Neither returns: the stall inspector ends the run.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tests.support.cluster_tasks import _regression_dataset, _small_model

_ASLEEP_AT_STEP = 3  # steps completed before worker:1 sleeps


def _sleep(seconds: float) -> None:
    """The function the stall report and the stacks name."""
    time.sleep(seconds)


def _asleep_now() -> None:
    print(f"STUCK python {time.time():.3f}", flush=True)
    _sleep(3600)


def fit_then_sleep() -> dict[str, Any]:
    """tf-keras fit whose model passes its input through a tf.py_function, which sleeps on worker:1."""
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    import tensorflow as tf

    from tfdist import keras

    calls = [0]

    def through_python(x: Any) -> Any:
        calls[0] += 1
        if os.environ["TFDIST_TASK"] == "worker:1" and calls[0] > _ASLEEP_AT_STEP:
            _asleep_now()
        return x

    def py_layer(x: Any) -> Any:
        y = tf.py_function(through_python, [x], tf.float32)
        y.set_shape(x.shape)
        return y

    with strategy.scope():
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Lambda(py_layer)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.fit(_regression_dataset(), epochs=3, verbose=0)
    return {"steps": calls[0]}


def custom_loop_then_sleep() -> dict[str, Any]:
    """A custom loop (a tf.function around strategy.run); worker:1 sleeps in Python between two steps."""
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    import tensorflow as tf

    from tfdist import keras

    with strategy.scope():
        model = _small_model(keras)
        optimizer = keras.optimizers.SGD(0.05)
    batches = iter(strategy.experimental_distribute_dataset(_regression_dataset().repeat()))

    @tf.function
    def step(batches: Any) -> Any:
        def replica_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica_step, args=next(batches))

    for done in range(100):
        if os.environ["TFDIST_TASK"] == "worker:1" and done == _ASLEEP_AT_STEP:
            _asleep_now()
        step(batches)
    return {"steps": 100}
