"""A 2-worker MultiWorkerMirroredStrategy model.fit on synthetic data (run under tfdist-launch).

    tfdist-launch --workers 2 -- python scripts/demo_train.py --epochs 3

Every task builds its strategy from TF_CONFIG (tfdist.build_strategy("auto")), trains the same model
on its shard of the data, and prints one RESULT line; both workers must report the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time

import tfdist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--examples", type=int, default=4096)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    strategy = tfdist.build_strategy("auto", communication="ring")  # Before any other TF op.
    import numpy as np
    import tensorflow as tf

    from tfdist import keras

    spec = tfdist.current_cluster()
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, 32)).astype("float32")
    labels = (x @ rng.normal(size=(32, 4))).argmax(axis=1)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, labels))
        .shuffle(args.examples, seed=1)
        .batch(args.global_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    start = time.perf_counter()
    history = model.fit(dataset, epochs=args.epochs, verbose=2 if (spec is None or spec.is_chief) else 0)
    seconds = time.perf_counter() - start
    weights = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    result = {
        "task": spec.task.name if spec and spec.task else "local",
        "replicas": strategy.num_replicas_in_sync,
        "strategy": type(strategy).__name__,
        "fingerprint": spec.fingerprint if spec else None,
        "loss": round(float(history.history["loss"][-1]), 5),
        "accuracy": round(float(history.history["accuracy"][-1]), 4),
        "examples_per_s": round(args.examples * args.epochs / seconds),
        "weights_sha1": hashlib.sha1(np.round(weights, 5).tobytes()).hexdigest()[:12],
    }
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    tfdist.exit_cleanly(main)
