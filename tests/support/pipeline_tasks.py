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


def make_embedding_layers() -> Any:
    """Token ids through an embedding (its gradient is sparse) on stage 1, then a Dense pair on stage 2.

    An Embedding first makes the Sequential build at once (it declares its input): stage_model remakes
    the layers from their configs, so a built Sequential works too.
    """
    import tf_keras

    return tf_keras.Sequential(
        [
            tf_keras.layers.Embedding(64, 16, input_length=8, name="pe_embed"),
            tf_keras.layers.Flatten(name="pe_flat"),
            tf_keras.layers.Dense(WIDTH, activation="tanh", name="pe_hidden"),
            tf_keras.layers.Dense(1, name="pe_out"),
        ]
    )


def _token_data() -> Any:
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(1)
    x = rng.randint(0, 64, size=(RECORDS, 8)).astype("int64")
    y = np.sin(x[:, :1] / 10.0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()


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
    runs = [(str(count), count, make_layers, _data, (FEATURES,), "float32") for count in micro_batches]
    runs.append(("embedding", micro_batches[-1], make_embedding_layers, _token_data, (8,), "int64"))
    for key, count, layers, data, shape, dtype in runs:
        tf_keras.utils.set_random_seed(0)
        model = tk.stage_model(layers, stages, input_shape=shape, input_dtype=dtype, micro_batches=count)
        init = [w.numpy() for w in model.weights]
        model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
        start = time.perf_counter()
        history = model.fit(data(), epochs=steps, steps_per_epoch=1, verbose=0)
        seconds = time.perf_counter() - start
        local = layers()
        local.build((None, *shape))
        local.set_weights(init)
        local.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
        reference = local.fit(data(), epochs=steps, steps_per_epoch=1, verbose=0)
        out[key] = {
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


def pipeline_backup_fit(steps: int, workdir: str, micro_batches: int) -> dict[str, Any]:
    """``steps`` steps with BackupAndRestore, printing ``PIPE STEP k`` after step k's backup; losses by step."""
    import json
    import os
    import sys

    import numpy as np
    import tf_keras

    from tfdist import keras as tk
    from tfdist.parallel import connect_stages

    stages = connect_stages()
    tf_keras.utils.set_random_seed(0)
    model = tk.stage_model(make_layers, stages, input_shape=(FEATURES,), micro_batches=micro_batches)
    init = os.path.join(workdir, "init.npz")
    if not os.path.exists(init):
        np.savez(init, *[w.numpy() for w in model.weights])
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
    losses: dict[int, float] = {}

    class Steps(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            losses[epoch] = float(logs["loss"])
            sys.stdout.write(f"PIPE STEP {epoch + 1}\n")
            sys.stdout.flush()

    backup = tf_keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"))
    # One step per epoch over a dataset that starts again each epoch: every step trains the first batch,
    # so the data needs no position to resume and the losses compare step by step.
    data = _data().take(1)
    model.fit(data, epochs=steps, verbose=0, callbacks=[backup, Steps()])
    return {"losses": json.loads(json.dumps(losses)), "restart": int(os.environ.get("TFDIST_RESTART", "0"))}


def reference_losses(steps: int, workdir: str) -> list[float]:
    """The same training as ``pipeline_backup_fit`` uninterrupted, in one process: the loss of each step."""
    import numpy as np
    import tf_keras

    model = make_layers()
    model.build((None, FEATURES))
    saved = np.load(f"{workdir}/init.npz")
    model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
    model.compile(optimizer=tf_keras.optimizers.Adam(1e-2), loss="mse")
    return [float(v) for v in model.fit(_data().take(1), epochs=steps, verbose=0).history["loss"]]
