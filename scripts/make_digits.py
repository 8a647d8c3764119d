"""Writes scikit-learn's handwritten digits as a long-tailed train set and a balanced validation set (the demo's data).

    python scripts/make_digits.py --out demo-out/data [--val-per-class 30] [--head 140] [--tail 10] [--seed 0]

The images are ``sklearn.datasets.load_digits``: 1,797 scans of handwritten digits, 8x8 pixels in 17 grey
levels, about 180 of each digit. They ship inside scikit-learn's wheel: nothing is downloaded (the ``demo``
extra installs scikit-learn). Every digit first gives ``--val-per-class`` images to the validation set
(balanced); of the rest, digit k keeps ``head * (tail / head) ** (k / 9)`` for training (a geometric long
tail: 140 zeros down to 10 nines by default). The two sets are disjoint. Which images each set gets
depends on ``--seed``.

Writes OUT/train-label=K-* (one shard group per digit, as stratified reading needs) and OUT/val-*, each
example with ``image`` (PNG bytes, 8x8 grey), ``label`` (int64, the digit) and ``id`` (int64, the index
in load_digits), and prints one JSON line with the class counts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


def train_counts(classes: int, head: int, tail: int) -> list[int]:
    """Training images per class: ``head`` for class 0 down to ``tail`` for the last, geometrically."""
    if classes == 1:
        return [head]
    ratio = tail / head
    return [round(head * ratio ** (k / (classes - 1))) for k in range(classes)]


def split(labels: np.ndarray, *, val_per_class: int, counts: Sequence[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the train and validation images: per class, ``val_per_class`` to validation, then ``counts[k]``.

    Raises:
      DataError: A class has fewer images than it is asked to give (a ValueError).
    """
    from tfdist.errors import DataError, invalid

    rng = np.random.default_rng(seed)
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    for label, count in enumerate(counts):
        mine = rng.permutation(np.flatnonzero(labels == label))
        if len(mine) < val_per_class + count:
            raise invalid(
                DataError,
                f"counts[{label}]",
                count,
                f"at most {len(mine) - val_per_class} training images of class {label} ({len(mine)} images, "
                f"{val_per_class} of them for validation)",
                "Lower --head or --val-per-class.",
            )
        val.append(mine[:val_per_class])
        train.append(mine[val_per_class : val_per_class + count])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(val))


def examples(images: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> Iterator[Any]:
    """``tf.train.Example`` protos of the images at ``indices`` (grey levels 0-16 scaled to 0-255, as PNG)."""
    import tensorflow as tf

    for i in indices:
        pixels = np.round(images[i] * (255 / 16)).astype(np.uint8)[..., None]
        png = tf.io.encode_png(pixels).numpy()
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[i])])),
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(i)])),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for train-* and val-*")
    parser.add_argument("--val-per-class", type=int, default=30, help="validation images of each digit")
    parser.add_argument("--head", type=int, default=140, help="training images of digit 0 (the largest class)")
    parser.add_argument("--tail", type=int, default=10, help="training images of digit 9 (the smallest class)")
    parser.add_argument("--shards", type=int, default=2, help="files per digit (train) and in all (validation)")
    parser.add_argument("--seed", type=int, default=0, help="which images go to which set")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from sklearn.datasets import load_digits

    from tfdist.data import write_tfrecords

    digits = load_digits()
    images, labels = digits.images, digits.target
    counts = train_counts(10, args.head, args.tail)
    train, val = split(labels, val_per_class=args.val_per_class, counts=counts, seed=args.seed)
    prefix = os.path.join(args.out, "train")
    write_tfrecords(examples(images, labels, train), prefix, num_shards=args.shards, partition_by="label")
    write_tfrecords(examples(images, labels, val), os.path.join(args.out, "val"), num_shards=args.shards)
    summary = {
        "source": "sklearn.datasets.load_digits",
        "train_records": len(train),
        "train_class_counts": counts,
        "val_records": len(val),
        "val_per_class": args.val_per_class,
        "out": args.out,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
