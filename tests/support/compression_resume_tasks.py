"""A compressed fit that a fault test kills and resumes: PowerSGD, then top-k, on MultiWorkerMirroredStrategy.

Each fit trains one step per epoch (so each epoch's logged loss is that step's own) over an endless
``TFRecordPipeline``, with ``BackupAndRestore`` and ``ResumeInput``: weights, momentum, the compressor's
errors, Q factors and warm-up steps and the input position all come back. Worker 0, whose save is the
backup, prints ``<NAME> STEP k`` once that save of step k is written (the fault tests' trigger: worker 1
saves only a copy of its own and may print first, before the backup exists); every worker writes the
losses of the steps its attempt trained.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.support import exact_tasks
from tfdist.comm import Compressor, PowerSGD, TopK

STEPS = 24
# PowerSGD sums plainly for its first WARMUP steps, then compresses the 32x32 kernel (the 4x32 one, 1.8x
# smaller as factors, goes whole at its default rate of 2).
WARMUP = 9
COMPRESSORS: dict[str, Compressor] = {"powersgd": PowerSGD(rank=2, warmup_steps=WARMUP), "topk": TopK(density=0.1)}


def _parse(record: Any) -> Any:
    import tensorflow as tf

    example = tf.io.parse_single_example(
        record,
        {
            "x": tf.io.FixedLenFeature([exact_tasks.FEATURES_DIM], tf.float32),
            "y": tf.io.FixedLenFeature([1], tf.float32),
        },
    )
    return example["x"], example["y"]


def compressed_resume_fit(workdir: str, prefix: str) -> dict[str, Any]:
    """PowerSGD's fit, then top-k's, each resumed from its backup if an earlier attempt was killed in it."""
    import tensorflow as tf
    import tf_keras

    from tfdist import keras as tk
    from tfdist.keras.inputs import enable_determinism

    enable_determinism(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = os.environ.get("TFDIST_TASK", "worker:0").replace(":", "")
    restart = int(os.environ.get("TFDIST_RESTART", "0"))
    for name, compressor in COMPRESSORS.items():
        done = os.path.join(workdir, f"{name}-{task}.json")
        if os.path.exists(done):  # Finished before a later fault: not trained again.
            continue
        tf_keras.utils.set_random_seed(1)
        with strategy.scope():
            model = tf_keras.Sequential(
                [
                    tf_keras.Input((exact_tasks.FEATURES_DIM,)),
                    tf_keras.layers.Dense(32, activation="tanh"),
                    tf_keras.layers.Dense(32, activation="tanh"),
                    tf_keras.layers.Dense(1),
                ]
            )
            optimizer = tk.with_communication(tf_keras.optimizers.SGD(0.02, momentum=0.5), compression=compressor)
            model.compile(optimizer=optimizer, loss="mse")
        data = exact_tasks.pipeline(prefix + "-*", features=None, parse_fn=_parse, num_epochs=None)
        losses: dict[int, float] = {}

        class Steps(tf_keras.callbacks.Callback):
            def __init__(self, name: str, losses: dict[int, float]) -> None:
                super().__init__()
                self.name, self.losses = name, losses

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.losses[epoch] = float(logs["loss"])
                if task == "worker0":  # After BackupAndRestore's save: the backup of this step is written.
                    print(f"{self.name.upper()} STEP {epoch + 1}", flush=True)

        backup = os.path.join(workdir, f"backup-{name}")
        callbacks = [
            tf_keras.callbacks.BackupAndRestore(backup),
            tk.ResumeInput(data, backup_dir=backup),
            Steps(name, losses),
        ]
        model.fit(data.dataset(), epochs=STEPS, steps_per_epoch=1, verbose=0, callbacks=callbacks)
        weights = [float(v) for w in model.weights for v in w.numpy().ravel()]
        with open(done, "w") as f:
            json.dump({"losses": losses, "weights": weights, "restart": restart}, f)
    return {}
