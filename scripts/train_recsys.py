"""Recommendation workload on ParameterServerStrategy: sharded embeddings, hash-sharded users, cold-user weights.

    tfdist-launch --chief --workers 2 --ps 2 -- python scripts/train_recsys.py
    .venv/bin/python scripts/make_synthetic_clicks.py --out /tmp/clicks     # or your own logs, then:
    tfdist-launch --chief --workers 2 --ps 2 -- python scripts/train_recsys.py --data /tmp/clicks \\
        --compare --summary /tmp/recsys.json

Without ``--data`` the chief writes the synthetic click logs (make_synthetic_clicks.py's defaults) to
``recsys-out/clicks`` first, or reuses them when they are already there.

The chief (the coordinator) builds the strategy with one embedding shard per ps (``partition="fixed"``),
trains a matrix-factorisation click model (user and item embeddings, item bias) with ``model.fit``, and reads
each worker's share of the click logs with ``TFRecordPipeline(shard_policy="hash", shard_key="user_id")``,
so each user's events go to exactly one worker. Cold users' examples get ``--cold-weight`` (default 'auto':
cold examples together weigh as much as hot ones). ``--compare`` first trains the same model unweighted.

It prints AUC overall, for hot and for cold users, next to a popularity baseline (each item's click rate
in the training data); ``--summary`` writes them as JSON, with the embedding layout, steps/s, and the
planner's bytes per step for moving embedding rows (PS) vs all-reducing whole tables.
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

FEATURES = ("user_id", "item_id", "label", "hot")
DEFAULT_DATA = os.path.join("recsys-out", "clicks")


def _default_data() -> str:
    """The synthetic click logs in DEFAULT_DATA, written first when they are missing (only the chief runs this)."""
    if not os.path.exists(os.path.join(DEFAULT_DATA, "clicks.json")):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from make_synthetic_clicks import write_dataset

        write_dataset(DEFAULT_DATA)
    return DEFAULT_DATA


def auc(labels: Any, scores: Any) -> float:
    """Area under the ROC curve: the Mann-Whitney statistic, ties counted half."""
    import numpy as np

    labels = np.asarray(labels).astype(bool)
    scores = np.asarray(scores, dtype=np.float64)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], len(scores)]
    group_rank = (starts + ends + 1) / 2.0  # Average 1-based rank of each tie group.
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(group_rank, ends - starts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _read_all(pattern: str) -> dict[str, Any]:
    """Every record of the files as numpy columns (evaluation and the baseline; small files)."""
    import numpy as np

    from tfdist.data import TFRecordPipeline

    pipeline = TFRecordPipeline(files=pattern, batch_size=8192, features=_spec(), drop_remainder=False)
    columns: dict[str, list[Any]] = {k: [] for k in FEATURES}
    for batch in pipeline.dataset():
        for key in FEATURES:
            columns[key].append(batch[key].numpy().reshape(-1))
    return {k: np.concatenate(v) for k, v in columns.items()}


def _spec() -> dict[str, Any]:
    import tensorflow as tf

    return {key: tf.io.FixedLenFeature([], tf.int64) for key in FEATURES}


OPTIMIZERS = {"adam": "Adam", "adagrad": "Adagrad", "sgd": "SGD"}


def _model(keras: Any, users: int, items: int, dim: int, learning_rate: float, optimizer: str = "adam") -> Any:
    """logit = <user, item> + item bias + bias, from embedding tables (sharded over the ps when built in scope)."""
    user_id = keras.Input((), dtype="int64", name="user_id")
    item_id = keras.Input((), dtype="int64", name="item_id")
    user = keras.layers.Embedding(
        users, dim, name="user_embedding", embeddings_initializer=keras.initializers.RandomNormal(stddev=0.05)
    )(user_id)
    item = keras.layers.Embedding(
        items, dim, name="item_embedding", embeddings_initializer=keras.initializers.RandomNormal(stddev=0.05)
    )(item_id)
    bias = keras.layers.Embedding(items, 1, name="item_bias", embeddings_initializer="zeros")(item_id)
    logit = keras.layers.Add()([keras.layers.Dot(axes=1)([user, item]), keras.layers.Flatten()(bias)])
    output = keras.layers.Dense(1, activation="sigmoid", name="click")(logit)
    model = keras.Model({"user_id": user_id, "item_id": item_id}, output)
    model.compile(
        optimizer=getattr(keras.optimizers, OPTIMIZERS[optimizer])(learning_rate),
        loss="binary_crossentropy",
        steps_per_execution=10,
    )
    return model


def _evaluate(keras: Any, model: Any, eval_data: dict[str, Any], meta: dict[str, Any], args: Any) -> dict[str, float]:
    """AUC overall, hot and cold, with a local copy of the trained weights (the chief reads them from the ps)."""
    from tfdist.keras import local_weights

    local = _model(keras, meta["users"], meta["items"], args.dim, args.learning_rate)
    local.set_weights(local_weights(model))
    scores = local.predict(
        {"user_id": eval_data["user_id"], "item_id": eval_data["item_id"]}, batch_size=8192, verbose=0
    ).reshape(-1)
    hot = eval_data["hot"].astype(bool)
    labels = eval_data["label"]
    return {
        "auc": auc(labels, scores),
        "auc_hot": auc(labels[hot], scores[hot]),
        "auc_cold": auc(labels[~hot], scores[~hot]),
    }


def _baseline(train: dict[str, Any], eval_data: dict[str, Any], items: int) -> dict[str, float]:
    """Popularity baseline: each item's smoothed click rate in the training data."""
    import numpy as np

    clicks = np.bincount(train["item_id"], weights=train["label"], minlength=items)
    views = np.bincount(train["item_id"], minlength=items)
    prior = train["label"].mean()
    rate = (clicks + 10 * prior) / (views + 10)
    scores = rate[eval_data["item_id"]]
    hot = eval_data["hot"].astype(bool)
    labels = eval_data["label"]
    return {
        "baseline_auc": auc(labels, scores),
        "baseline_auc_hot": auc(labels[hot], scores[hot]),
        "baseline_auc_cold": auc(labels[~hot], scores[~hot]),
    }


def _traffic(train: dict[str, Any], meta: dict[str, Any], args: Any, workers: int) -> dict[str, Any]:
    """Bytes per worker step: embedding rows pulled and pushed (PS) vs all-reducing every table (planner)."""
    import numpy as np

    from tfdist.plan import embedding_traffic

    per_worker = args.batch // max(1, workers)
    rows = []
    for start in range(0, min(len(train["user_id"]), 50 * per_worker), per_worker):
        users = np.unique(train["user_id"][start : start + per_worker]).size
        items = np.unique(train["item_id"][start : start + per_worker]).size
        rows.append(users * args.dim + items * (args.dim + 1))
    traffic = embedding_traffic(
        table_values=meta["users"] * args.dim + meta["items"] * (args.dim + 1),
        values_touched_per_step=float(np.mean(rows)),
        workers=max(2, workers),
    )
    return traffic.to_dict()


def _train(keras: Any, strategy: Any, meta: dict[str, Any], args: Any, cold_weight: float) -> tuple[Any, float]:
    """One model.fit; returns the model and steps/s after the first epoch."""
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    pipeline = TFRecordPipeline(
        files=os.path.join(args.data, "train-*"),
        batch_size=args.batch,
        features=_spec(),
        shard_policy="hash",
        shard_key="user_id",
        num_epochs=None,
        shuffle_buffer=20000,
        seed=args.seed,
        drop_remainder=True,
    )

    def dataset_fn(context: Any) -> Any:
        def split(batch: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
            weight = tf.where(batch["hot"] > 0, 1.0, cold_weight)
            x = {"user_id": batch["user_id"], "item_id": batch["item_id"]}
            return x, tf.cast(batch["label"], tf.float32), weight

        return pipeline.dataset_fn(context).map(split, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = _model(keras, meta["users"], meta["items"], args.dim, args.learning_rate, args.optimizer)
    steps = args.steps_per_epoch or max(10, meta["train_records"] // args.batch)
    marks: list[float] = []
    timer = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: marks.append(time.perf_counter()))
    model.fit(
        keras.fit_input(dataset_fn, strategy=strategy, steps_per_epoch=steps),
        epochs=args.epochs,
        steps_per_epoch=steps,
        callbacks=[timer],
        verbose=2,
    )
    rate = steps * (len(marks) - 1) / (marks[-1] - marks[0]) if len(marks) > 1 else float("nan")
    return model, rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data",
        help="directory written by make_synthetic_clicks.py (default: generate the "
        f"synthetic click logs into {DEFAULT_DATA} unless they are there)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="default: one pass over the training data")
    parser.add_argument("--batch", type=int, default=1024, help="global batch")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZERS),
        default="adam",
        help="adam updates its moments for whole tables each step; adagrad and sgd only touched rows",
    )
    parser.add_argument("--cold-weight", default="auto", help="sample weight of cold users' examples, or 'auto'")
    parser.add_argument("--compare", action="store_true", help="also train without cold-user weights first")
    parser.add_argument("--partition", default="fixed", help="tfdist partition: fixed (one shard per ps), min_size")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--summary", help="write the results here as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    strategy = tfdist.build_strategy("parameter_server", partition=args.partition)  # Before any other TF op.
    from tfdist import keras
    from tfdist.keras import embedding_layout

    if args.data is None:
        args.data = _default_data()
    with open(os.path.join(args.data, "clicks.json"), encoding="utf-8") as f:
        meta = json.load(f)
    train = _read_all(os.path.join(args.data, "train-*"))
    eval_data = _read_all(os.path.join(args.data, "eval-*"))
    hot_share = float(train["hot"].mean())
    cold_weight = hot_share / (1 - hot_share) if args.cold_weight == "auto" else float(args.cold_weight)
    spec = tfdist.current_cluster()
    workers = len(spec.jobs.get("worker", ())) if spec else 1
    summary: dict[str, Any] = {
        **_baseline(train, eval_data, meta["items"]),
        "cold_weight": round(cold_weight, 3),
        "workers": workers,
        "ps": spec.num_ps if spec else 0,
    }
    fit_start = time.time()
    if args.compare:
        model, rate = _train(keras, strategy, meta, args, cold_weight=1.0)
        summary["unweighted"] = {**_evaluate(keras, model, eval_data, meta, args), "steps_per_s": rate}
    model, rate = _train(keras, strategy, meta, args, cold_weight=cold_weight)
    summary["fit_seconds"] = [fit_start, time.time()]  # Wall clock (Unix s) around every fit.
    summary.update(_evaluate(keras, model, eval_data, meta, args))
    summary["steps_per_s"] = rate
    summary["embedding_shards"] = {t.name: t.to_dict() for t in embedding_layout(model)}
    summary["bytes_per_step"] = _traffic(train, meta, args, workers)
    rounded = json.loads(json.dumps(summary), parse_float=lambda v: round(float(v), 4))
    for name, values in [("weighted", rounded)] + ([("unweighted", rounded["unweighted"])] if args.compare else []):
        sys.stdout.write(
            f"{name}: AUC {values['auc']:.4f} (hot {values['auc_hot']:.4f}, cold {values['auc_cold']:.4f})"
            f", {values['steps_per_s']:.1f} steps/s\n"
        )
    sys.stdout.write(
        f"popularity baseline: AUC {rounded['baseline_auc']:.4f} (hot {rounded['baseline_auc_hot']:.4f},"
        f" cold {rounded['baseline_auc_cold']:.4f})\n"
    )
    sys.stdout.write("RESULT " + json.dumps(rounded) + "\n")
    if args.summary:
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(rounded, f, indent=1)
    return 0


if __name__ == "__main__":
    tfdist.exit_cleanly(main)
