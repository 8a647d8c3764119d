"""Benchmark: the step time of one model under Keras 3 and under tf-keras, 2 workers, MultiWorkerMirroredStrategy.

    .venv/bin/python scripts/bench_keras3.py [--repeats 3] [--steps 60] [--width 256] [--batch 64]

One 2-worker cluster (``tfdist.launch.run_function``, the local engine). Each worker builds the strategy with
``tfdist.build_strategy("auto")`` (which fixes Keras 3's multi-worker fit), then fits the same model, in the
same processes, under Keras 3 (``import keras``) and under tf-keras (``from tfdist import keras``),
alternating which goes first in each repeat (``--repeats`` fits of each): an MLP on 32 features (two dense
layers of ``--width`` with ReLU, 10 logits), softmax cross-entropy, SGD, ``--steps`` steps of global batch
``--batch`` from an in-memory dataset (split over the workers by record). A fit's step time is the time from
the end of its 10th step to the end of its last, over the steps in between (tracing and the first steps out).
Prints the median step time of each Keras and their ratio, and every sample, as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

_WARMUP = 10


def _worker(repeats: int, steps: int, width: int, batch: int) -> dict[str, list[float]]:
    """Runs in each worker: the fits, alternating Keras 3 and tf-keras; the step times in ms."""
    import time

    import numpy as np
    import tensorflow as tf

    import tfdist

    strategy = tfdist.build_strategy("auto")
    import keras as keras3  # Fixed as it is imported.

    from tfdist import keras as tf_keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 32)).astype("float32")
    y = rng.integers(0, 10, size=(steps * batch,)).astype("int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)

    def fit(keras: Any) -> float:
        with strategy.scope():
            model = keras.Sequential(
                [
                    keras.Input((32,)),
                    keras.layers.Dense(width, activation="relu"),
                    keras.layers.Dense(width, activation="relu"),
                    keras.layers.Dense(10),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        ends: list[float] = []
        record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: ends.append(time.perf_counter()))
        model.fit(dataset, epochs=1, verbose=0, callbacks=[record])
        return (ends[-1] - ends[_WARMUP - 1]) / (len(ends) - _WARMUP) * 1e3

    samples: dict[str, list[float]] = {"keras3": [], "tf_keras": []}
    for repeat in range(repeats):
        order = ("keras3", "tf_keras") if repeat % 2 == 0 else ("tf_keras", "keras3")
        for name in order:
            samples[name].append(round(fit(keras3 if name == "keras3" else tf_keras), 3))
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    if args.steps <= _WARMUP + 1 or min(args.repeats, args.width, args.batch) < 1:
        parser.error(f"--steps must exceed {_WARMUP + 1}; --repeats, --width and --batch must be positive")
    from tfdist.launch import run_function

    run = run_function(_worker, workers=2, timeout=600, args=[args.repeats, args.steps, args.width, args.batch])
    if not run.ok:
        sys.stderr.write(run.result.summary() + "\n")
        return 1
    samples = run.values["worker:0"]  # The workers step together: worker 0's times are the cluster's.
    medians = {name: statistics.median(times) for name, times in samples.items()}
    report = {
        "median_step_ms": {name: round(value, 2) for name, value in medians.items()},
        "keras3_over_tf_keras": round(medians["keras3"] / medians["tf_keras"], 3),
        "samples_ms": samples,
        "settings": vars(args),
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
