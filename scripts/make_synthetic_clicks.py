"""Synthetic click logs for the recommendation workload: Zipf users and items, a hot/cold split, hidden truth.

    .venv/bin/python scripts/make_synthetic_clicks.py --out /tmp/clicks [--users 20000] [--items 2000]

* Users: the first ``--hot-fraction`` (30%) of users are hot and make about ``--hot-share`` (85%) of the
  clicks, with Zipf-distributed activity among them; the other 70% are cold, with a few events each.
* Items: Zipf popularity (exponent ``--item-zipf``).
* Labels come from a hidden model, so learning is measurable: each user and item has a latent vector
  (dimension 8) and each item a bias; P(click) = sigmoid(2 u.v / sqrt(8) + bias - 0.5). A popularity
  baseline (item click rate) can learn the bias; only a personalised model can learn u.v.
* Each user's last event goes to the evaluation set (so every user, cold ones included, is evaluated); the
  rest is training data.

Written with tfdist.data.write_tfrecords: ``OUT/train-*.tfrecord`` and ``OUT/eval-*.tfrecord`` (int64 features
``user_id``, ``item_id``, ``label``, ``hot``), each with its manifest, plus ``OUT/clicks.json`` (sizes, counts).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

DIM = 8


def generate(
    *, users: int, items: int, events: int, hot_fraction: float, hot_share: float, item_zipf: float, seed: int
) -> dict[str, Any]:
    """The events as numpy arrays (user, item, label, hot), ordered by user."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_hot = max(1, round(users * hot_fraction))
    # Activity: Zipf among hot users, holding hot_share of all events; cold users share the rest evenly.
    hot_weights = 1.0 / np.arange(1, n_hot + 1) ** 0.8
    hot_weights = hot_share * hot_weights / hot_weights.sum()
    cold_weights = np.full(users - n_hot, (1.0 - hot_share) / max(1, users - n_hot))
    activity = np.concatenate([hot_weights, cold_weights])
    # Two events per user at least (one to train on, one to evaluate), the rest by activity.
    counts = 2 + rng.multinomial(max(0, events - 2 * users), activity)
    user = np.repeat(np.arange(users), counts)
    popularity = 1.0 / np.arange(1, items + 1) ** item_zipf
    item = rng.choice(items, size=user.size, p=popularity / popularity.sum())
    user_vec = rng.normal(size=(users, DIM))
    item_vec = rng.normal(size=(items, DIM))
    item_bias = rng.normal(scale=0.7, size=items)
    logit = 2.0 * np.einsum("ij,ij->i", user_vec[user], item_vec[item]) / math.sqrt(DIM) + item_bias[item] - 0.5
    label = (rng.random(user.size) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    hot = (user < n_hot).astype(np.int64)
    last = np.r_[user[1:] != user[:-1], True]  # Each user's last event.
    return {"user": user, "item": item, "label": label, "hot": hot, "is_eval": last, "n_hot": n_hot}


def _examples(data: dict[str, Any], mask: Any, seed: int) -> Iterator[Any]:
    import numpy as np
    import tensorflow as tf

    order = np.flatnonzero(mask)
    np.random.default_rng(seed).shuffle(order)  # Files hold users mixed, as logs would.
    for i in order:
        feature = {
            key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(data[src][i])]))
            for key, src in (("user_id", "user"), ("item_id", "item"), ("label", "label"), ("hot", "hot"))
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature))


def write_dataset(
    out: str,
    *,
    users: int = 20000,
    items: int = 2000,
    events: int = 300000,
    hot_fraction: float = 0.3,
    hot_share: float = 0.85,
    item_zipf: float = 1.0,
    shards: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Writes train-*/eval-* TFRecords and clicks.json under ``out``; returns the summary it wrote."""
    from tfdist.data import write_tfrecords

    data = generate(
        users=users,
        items=items,
        events=events,
        hot_fraction=hot_fraction,
        hot_share=hot_share,
        item_zipf=item_zipf,
        seed=seed,
    )
    os.makedirs(out, exist_ok=True)
    write_tfrecords(_examples(data, ~data["is_eval"], seed), os.path.join(out, "train"), num_shards=shards)
    write_tfrecords(_examples(data, data["is_eval"], seed + 1), os.path.join(out, "eval"), num_shards=2)
    train = ~data["is_eval"]
    summary = {
        "users": users,
        "items": items,
        "hot_users": int(data["n_hot"]),
        "train_records": int(train.sum()),
        "eval_records": int(data["is_eval"].sum()),
        "train_hot_share": round(float(data["hot"][train].mean()), 4),
        "train_click_rate": round(float(data["label"][train].mean()), 4),
        "seed": seed,
    }
    with open(os.path.join(out, "clicks.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    logging.getLogger("make_synthetic_clicks").info("Wrote %s", summary)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--users", type=int, default=20000)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--events", type=int, default=300000)
    parser.add_argument("--hot-fraction", type=float, default=0.3)
    parser.add_argument("--hot-share", type=float, default=0.85)
    parser.add_argument("--item-zipf", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    write_dataset(
        args.out,
        users=args.users,
        items=args.items,
        events=args.events,
        hot_fraction=args.hot_fraction,
        hot_share=args.hot_share,
        item_zipf=args.item_zipf,
        shards=args.shards,
        seed=args.seed,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
