"""The tfdist demo's training job: a small CNN on sharded, stratified JPEG TFRecords (run under tfdist-launch).

    tfdist-launch --chief --workers 2 --ps 1 -- python scripts/demo.py --data demo-out/data --out demo-out/stratified
    tfdist-launch --workers 2 -- python scripts/demo.py --data demo-out/data --out demo-out/natural --sampling natural

Every task builds its strategy from TF_CONFIG. The chief (or the first worker) trains with a progress line per
epoch, TensorBoard logs and backups, evaluates per-class accuracy on the validation set, and writes
OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import tfdist


def _build(keras: Any, classes: int, size: int, image_key: str) -> Any:
    model = keras.Sequential(
        [
            keras.Input((size, size, 3), name=image_key),  # Matches the feature name in the input dict.
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="directory with train-* (per-class shards) and val-*")
    parser.add_argument("--out", required=True, help="where logs, backups and summary.json go")
    parser.add_argument("--sampling", choices=("stratified", "natural"), default="stratified")
    parser.add_argument("--label-key", default="label")
    parser.add_argument("--image-key", default="image")
    parser.add_argument("--image-size", type=int, default=48, help="images are resized to this square size")
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    spec = tfdist.current_cluster()
    strategy = tfdist.build_strategy("auto", communication="ring")  # Before any other TF op.
    import numpy as np
    import tensorflow as tf

    from tfdist import keras
    from tfdist.data import TFRecordPipeline, read_manifest

    keras.utils.set_random_seed(1)
    size = (args.image_size, args.image_size)
    features = {
        args.image_key: tf.io.FixedLenFeature([], tf.string),
        args.label_key: tf.io.FixedLenFeature([], tf.int64),
    }
    common = dict(
        features=features,
        batch_size=args.batch,
        image_key=args.image_key,
        image_size=size,
        label_key=args.label_key,
        as_supervised=True,
        seed=1,
    )
    train = TFRecordPipeline(
        files=os.path.join(args.data, "train-*"),
        shuffle_buffer=2048,
        num_epochs=None,
        class_weights="sqrt" if args.sampling == "stratified" else "natural",
        **common,
    )
    manifest = read_manifest(os.path.join(args.data, "train")) or {}
    records = manifest.get("records") or 8000
    steps = records // args.batch
    is_ps = isinstance(strategy, tf.distribute.ParameterServerStrategy)
    with strategy.scope():
        model = _build(keras, args.classes, args.image_size, args.image_key)
    callbacks = keras.cluster_callbacks(
        backup_dir=os.path.join(args.out, "backup"),
        tensorboard_dir=os.path.join(args.out, "tensorboard"),
        global_batch_size=args.batch,
    )
    chief = spec is None or spec.is_chief
    start = time.perf_counter()
    history = model.fit(
        keras.fit_input(train, strategy=strategy, steps_per_epoch=steps),
        epochs=args.epochs,
        steps_per_epoch=steps,
        callbacks=callbacks,
        verbose=2 if chief else 0,
    )
    seconds = time.perf_counter() - start
    if not chief:
        return 0
    # Per-class accuracy on the (uniform) validation set, with a local copy of the trained weights.
    local = _build(keras, args.classes, args.image_size, args.image_key)
    local.set_weights(model.get_weights())
    val = TFRecordPipeline(files=os.path.join(args.data, "val-*"), drop_remainder=False, **common)
    labels, predictions = [], []
    for x, y in val.dataset():
        labels.append(y.numpy())
        predictions.append(local.predict_on_batch(x).argmax(axis=1))
    labels, predictions = np.concatenate(labels), np.concatenate(predictions)
    per_class = {
        str(c): round(float((predictions[labels == c] == c).mean()), 3)
        for c in range(args.classes)
        if (labels == c).any()
    }
    input_workers = 1 if spec is None else len(spec.jobs.get("worker", ())) if is_ps else spec.num_workers
    plan = train.plan(input_workers)
    files = manifest.get("files", {})
    shares = [sum(files.get(p, {}).get("records", 0) for p in plan.files_for(w)) for w in range(plan.num_workers)]
    summary = {
        "sampling": args.sampling,
        "strategy": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "epochs": args.epochs,
        "steps_per_epoch": steps,
        "examples_per_s": round(args.epochs * steps * args.batch / seconds),
        "final_loss": round(float(history.history["loss"][-1]), 4),
        "val_accuracy": round(float((predictions == labels).mean()), 3),
        "per_class_accuracy": per_class,
        "worker_records": shares,
        "sharding": f"{plan.policy}: {plan.reason}",
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    sys.stdout.write("SUMMARY " + json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    tfdist.exit_cleanly(main)
