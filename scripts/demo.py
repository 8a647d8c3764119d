"""The tfdist demo's training job: a small CNN on sharded, stratified image TFRecords (run under tfdist-launch).

    tfdist-launch --chief --workers 2 --ps 1 -- python scripts/demo.py --data demo-out/data --out demo-out/stratified
    tfdist-launch --workers 2 -- python scripts/demo.py --data demo-out/data --out demo-out/natural --sampling natural

Every task builds its strategy from TF_CONFIG and trains one fresh model per seed (``--seeds 3``: seeds 0, 1
and 2 each set the weight initialisation and the input's shuffle and class draws). The chief (or the first
worker) prints a progress line per epoch, keeps TensorBoard logs and backups under OUT/seed-N/, evaluates
per-class accuracy on the validation set after each seed, and writes OUT/summary.json: each seed's
results, their mean and spread, and what ran - among it the records each worker trained on in each epoch,
counted in the train step (``records_w0``, ``records_w1`` in the progress line), the distinct records each
epoch trained (counted in the train step by record id, ``--id-key``), and the input pipeline that the
chief built (tfdist's own log line).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from typing import Any

import tfdist


class _InputLog(logging.Handler):
    """Keeps tfdist.data's "Input pipeline i/n: ..." lines: which share of the data a pipeline was built for."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Input pipeline "):
            self.lines.append(message)


def _records_metrics(keras: Any, tf: Any, workers: int, on_ps: bool) -> list[Any]:
    """One metric per worker: the records that worker trained on this epoch (Keras resets metrics per epoch).

    The count is taken where the records are used, in the train step: under ParameterServerStrategy the
    step runs on whichever worker the coordinator gives it to (its index from
    ``experimental_get_current_worker_index``); under MultiWorkerMirroredStrategy every worker runs every
    step on its own replica's batch.
    """

    class WorkerRecords(keras.metrics.Metric):
        def __init__(self, worker: int) -> None:
            super().__init__(name=f"records_w{worker}")
            self.worker = worker
            self.total = self.add_weight(name="total", initializer="zeros")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            if on_ps:
                index = tf.distribute.coordinator.experimental_get_current_worker_index()
            else:
                index = tf.distribute.get_replica_context().replica_id_in_sync_group
            mine = tf.cast(tf.equal(tf.cast(index, tf.int64), self.worker), self.dtype)
            self.total.assign_add(mine * tf.cast(tf.shape(y_true)[0], self.dtype))

        def result(self) -> Any:
            return tf.identity(self.total)

        def reset_state(self) -> None:
            self.total.assign(0.0)

    return [WorkerRecords(w) for w in range(workers)]


def _id_space(pipeline: Any, id_key: str, tf: Any) -> int:
    """One more than the largest record id in the files of ``pipeline`` (a TFRecordPipeline): the size of the
    per-record counts. Reads the ids once (the demo's data is small)."""
    from tfdist.data.records.files import compression_of

    spec = {id_key: tf.io.FixedLenFeature([], tf.int64, default_value=-1)}
    largest = -1
    for info in pipeline.listing().files:
        kind = compression_of(info.path, pipeline.compression) or ""
        for batch in tf.data.TFRecordDataset(info.path, compression_type=kind).batch(4096):
            largest = max(largest, int(tf.reduce_max(tf.io.parse_example(batch, spec)[id_key])))
    return largest + 1


def _counted(keras: Any, tf: Any, core: Any, *, id_key: str, image_key: str, ids: int) -> Any:
    """``core`` in a model whose train step adds each record it trains on to ``seen`` (a count per record id,
    summed over workers and replicas): how many distinct records an epoch trained, counted where they are used.
    """

    class Counted(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.core = core
            self.seen = self.add_weight(
                name="seen", shape=(ids,), initializer="zeros", trainable=False, aggregation=tf.VariableAggregation.SUM
            )

        def call(self, inputs: Any, training: bool = False) -> Any:
            return self.core(inputs[image_key], training=training)

        def train_step(self, data: Any) -> Any:
            ids_ = tf.cast(data[0][id_key], tf.int32)
            self.seen.assign_add(tf.math.bincount(ids_, minlength=ids, maxlength=ids, dtype=tf.float32))
            return super().train_step(data)

    return Counted()


class _Distinct:
    """A callback's hooks: ``seen`` zeroed as each epoch begins, its distinct records kept as it ends."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.per_epoch: list[list[int]] = []

    def begin(self, epoch: int, logs: Any = None) -> None:
        self.model.seen.assign(self.model.seen * 0)

    def end(self, epoch: int, logs: Any = None) -> None:
        seen = self.model.seen.numpy()
        self.per_epoch.append([int((seen > 0).sum()), int(seen.sum())])


def _build(keras: Any, classes: int, size: int, image_key: str, metrics: list[Any], counted: Any = None) -> Any:
    """The small CNN, compiled; ``counted(core)`` wraps it (the train model that counts its records)."""
    core = keras.Sequential(
        [
            keras.Input((size, size, 3), name=image_key),  # Matches the feature name in the input dict.
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )
    model = counted(core) if counted is not None else core
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy", *metrics],
    )
    return model


def _spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation (0 for one value), min and max, rounded."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {
        "mean": round(statistics.fmean(values), 3),
        "std": round(std, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="directory with train-* (per-class shards) and val-*")
    parser.add_argument("--out", required=True, help="where logs, backups and summary.json go")
    parser.add_argument("--sampling", choices=("stratified", "natural"), default="stratified")
    parser.add_argument(
        "--class-weights", choices=("sqrt", "balanced"), default="sqrt", help="the stratified class mix"
    )
    parser.add_argument("--label-key", default="label")
    parser.add_argument("--image-key", default="image")
    parser.add_argument(
        "--id-key", default="id", help="the record id feature: distinct records per epoch are counted by it"
    )
    parser.add_argument("--image-size", type=int, default=8, help="images are resized to this square size")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="global batch size")
    parser.add_argument("--seeds", type=int, default=1, help="train this many models, with seeds 0, 1, ...")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    inputs = _InputLog()
    logging.getLogger("tfdist.data").addHandler(inputs)
    spec = tfdist.current_cluster()
    strategy = tfdist.build_strategy("auto", communication="ring")  # Before any other TF op.
    import numpy as np
    import tensorflow as tf

    from tfdist import keras
    from tfdist.data import TFRecordPipeline, read_manifest

    on_ps = isinstance(strategy, tf.distribute.ParameterServerStrategy)
    # The workers that run train steps: PS workers (not the chief, which coordinates), else every replica.
    workers = len(spec.jobs.get("worker", ())) if on_ps and spec is not None else strategy.num_replicas_in_sync
    chief = spec is None or spec.is_chief
    manifest = read_manifest(os.path.join(args.data, "train")) or {}
    records = manifest.get("records") or 0
    steps = max(1, records // args.batch)
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
    )
    # The train input carries each record's id: the train step counts the records it trains on by it.
    ids = _id_space(TFRecordPipeline(files=os.path.join(args.data, "train-*"), **common), args.id_key, tf)
    train_common = {**common, "features": {**features, args.id_key: tf.io.FixedLenFeature([], tf.int64)}}
    runs = []
    for seed in range(args.seeds):
        keras.utils.set_random_seed(seed)  # The weights' initialisation.
        inputs.lines.clear()
        train = TFRecordPipeline(
            files=os.path.join(args.data, "train-*"),
            shuffle_buffer=2048,
            num_epochs=None,
            class_weights=args.class_weights if args.sampling == "stratified" else "natural",
            seed=seed,  # The shuffle and the stratified draws.
            **train_common,
        )
        with strategy.scope():
            model = _build(
                keras,
                args.classes,
                args.image_size,
                args.image_key,
                _records_metrics(keras, tf, workers, on_ps),
                lambda core: _counted(keras, tf, core, id_key=args.id_key, image_key=args.image_key, ids=ids),
            )
        distinct = _Distinct(model)
        where = os.path.join(args.out, f"seed-{seed}")
        callbacks = keras.cluster_callbacks(
            backup_dir=os.path.join(where, "backup"),
            tensorboard_dir=os.path.join(where, "tensorboard"),
            global_batch_size=args.batch,
        ) + [keras.callbacks.LambdaCallback(on_epoch_begin=distinct.begin, on_epoch_end=distinct.end)]
        if chief:
            sys.stdout.write(f"-- seed {seed}\n")
            sys.stdout.flush()
        start = time.perf_counter()
        history = model.fit(
            keras.fit_input(train, strategy=strategy, steps_per_epoch=steps),
            epochs=args.epochs,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=2 if chief else 0,
        )
        seconds = time.perf_counter() - start
        built = list(inputs.lines)  # The train input's pipelines (the validation set's line comes next).
        if not chief:
            continue
        # Per-class accuracy on the (balanced) validation set, with a local copy of the trained weights.
        local = _build(keras, args.classes, args.image_size, args.image_key, [])
        local.set_weights(model.core.get_weights())
        val = TFRecordPipeline(files=os.path.join(args.data, "val-*"), drop_remainder=False, seed=seed, **common)
        labels, predictions = [], []
        # A default InputContext: one pipeline over every file (TF_CONFIG would give MWMS's chief its share only).
        for x, y in val.dataset(tf.distribute.InputContext()):
            labels.append(y.numpy())
            predictions.append(local.predict_on_batch(x).argmax(axis=1))
        labels, predictions = np.concatenate(labels), np.concatenate(predictions)
        per_class = {
            str(c): round(float((predictions[labels == c] == c).mean()), 3)
            for c in range(args.classes)
            if (labels == c).any()
        }
        counted = [history.history[f"records_w{w}"] for w in range(workers)]
        runs.append(
            {
                "seed": seed,
                "seconds": round(seconds, 1),
                "examples_per_s": round(args.epochs * steps * args.batch / seconds),
                "final_loss": round(float(history.history["loss"][-1]), 4),
                "val_records": len(labels),
                "val_accuracy": round(float((predictions == labels).mean()), 3),
                "per_class_accuracy": per_class,
                # records_per_worker[epoch][worker], as counted in the train steps.
                "records_per_worker": [[int(counted[w][e]) for w in range(workers)] for e in range(args.epochs)],
                # distinct_records[epoch]: [records trained at least once, draws], counted in the train steps.
                "distinct_records": distinct.per_epoch,
                "input_pipelines": built,
            }
        )
    if not chief:
        return 0
    classes = runs[0]["per_class_accuracy"]
    per_epoch = [epoch for run in runs for epoch in run["records_per_worker"]]
    summary = {
        "sampling": args.sampling,
        "class_weights": args.class_weights if args.sampling == "stratified" else "natural",
        "strategy": type(strategy).__name__,
        "workers": workers,
        "replicas": strategy.num_replicas_in_sync,
        "seeds": [run["seed"] for run in runs],
        "epochs": args.epochs,
        "steps_per_epoch": steps,
        "global_batch": args.batch,
        "train_records": records,
        "train_class_counts": manifest.get("classes") or {},
        "val_records": runs[0]["val_records"],
        "examples_per_s": round(statistics.fmean(run["examples_per_s"] for run in runs)),
        "val_accuracy": _spread([run["val_accuracy"] for run in runs]),
        "per_class_accuracy": {c: _spread([run["per_class_accuracy"][c] for run in runs]) for c in classes},
        "worst_class_accuracy": _spread([min(run["per_class_accuracy"].values()) for run in runs]),
        # Per worker, over every epoch of every seed: the fewest and most records it trained on in an epoch.
        "records_per_worker_epoch": {
            "min": [min(epoch[w] for epoch in per_epoch) for w in range(workers)],
            "max": [max(epoch[w] for epoch in per_epoch) for w in range(workers)],
            "mean": [round(statistics.fmean(epoch[w] for epoch in per_epoch)) for w in range(workers)],
        },
        "input_pipelines": runs[0]["input_pipelines"],
        # Over every epoch of every seed: the distinct records trained in an epoch (of steps x batch draws).
        "distinct_records_per_epoch": _spread([float(e[0]) for run in runs for e in run["distinct_records"]]),
        "runs": runs,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    sys.stdout.write("SUMMARY " + json.dumps({k: v for k, v in summary.items() if k != "runs"}) + "\n")
    return 0


if __name__ == "__main__":
    tfdist.exit_cleanly(main)
