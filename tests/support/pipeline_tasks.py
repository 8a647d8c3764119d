"""Pipeline stages on worker tasks, driven by the chief, against the same training in the chief alone."""

from __future__ import annotations

import time
from typing import Any

FEATURES, WIDTH, BATCH, RECORDS = 16, 64, 64, 512


def make_layers() -> Any:
    import tf_keras

    return tf_keras.Sequential(
        [
            tf_keras.layers.Dense(WIDTH, activation="tanh", name="pp_a"),
            tf_keras.layers.Dense(WIDTH, activation="tanh", name="pp_b"),
            tf_keras.layers.Dense(WIDTH, activation="tanh", name="pp_c"),
            tf_keras.layers.Dense(1, name="pp_out"),
        ]
    )


def _data() -> Any:
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    x = rng.randn(RECORDS, FEATURES).astype("float32")
    y = (np.sin(x[:, :1]) + 0.1 * x[:, 1:2] ** 2).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


def pipeline_fit(steps: int, micro_batches: list[int]) -> dict[str, Any]:
    """For each M: ``steps`` steps on the stages, then the same steps in this process alone (plain tf-keras)."""
    import numpy as np
    import tf_keras

    from tfdist import keras as tk
    from tfdist.parallel import connect_stages

    stages = connect_stages()
    out: dict[str, Any] = {"stages": stages}
    for count in micro_batches:
        tf_keras.utils.set_random_seed(0)
        model = tk.pipeline_model(make_layers, stages, input_shape=(FEATURES,), micro_batches=count)
        init = [w.numpy() for w in model.weights]
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
        start = time.perf_counter()
        history = model.fit(_data(), epochs=steps, steps_per_epoch=1, verbose=0)
        seconds = time.perf_counter() - start
        local = make_layers()
        local.build((None, FEATURES))
        local.set_weights(init)
        local.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
        reference = local.fit(_data(), epochs=steps, steps_per_epoch=1, verbose=0)
        out[str(count)] = {
            "losses": [float(v) for v in history.history["loss"]],
            "reference": [float(v) for v in reference.history["loss"]],
            "weights_diff": float(
                max(np.abs(a.numpy() - b.numpy()).max() for a, b in zip(model.weights, local.weights))
            ),
            "devices": sorted({v.device for v in model.weights}),
            "stage_of": dict(model.stage_of),
            "seconds": seconds,
        }
    return out
