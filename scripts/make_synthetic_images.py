"""Writes a synthetic JPEG image dataset as sharded TFRecords (the data every demo and benchmark uses).

    python scripts/make_synthetic_images.py --out data/images --num 8000 --classes 8 --size 64 \\
        --skew long-tail --shards 4 [--partition] [--compression GZIP]

Each example has `image` (JPEG bytes), `label` (int64) and `id` (int64, unique). Images are coloured noise
with a class-specific pattern, so a small CNN can learn them. Skews: uniform, long-tail (geometric, each
class half the previous), zipf (frequency ~ 1/rank).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np


def class_counts(num: int, classes: int, skew: str) -> list[int]:
    """How many images each class gets (sums to ``num``; every class at least 1)."""
    if skew == "uniform":
        shares = np.ones(classes)
    elif skew == "long-tail":
        shares = 0.5 ** np.arange(classes)
    else:  # zipf
        shares = 1.0 / np.arange(1, classes + 1)
    counts = np.maximum(1, np.floor(shares / shares.sum() * num)).astype(int)
    counts[0] += num - counts.sum()
    return counts.tolist()


def examples(num: int, classes: int, size: int, skew: str, seed: int) -> Iterator[Any]:
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), class_counts(num, classes, skew))
    rng.shuffle(labels)
    # Class appearance is fixed (not seeded), so train and validation sets of different seeds agree.
    palette = np.random.default_rng(12345).uniform(40, 215, size=(classes, 3))
    yy, xx = np.mgrid[0:size, 0:size]
    for i, label in enumerate(labels):
        stripes = np.sin((xx * np.cos(label) + yy * np.sin(label)) * (0.2 + 0.05 * label))[..., None]
        pixels = palette[label] + 40 * stripes + rng.normal(0, 25, size=(size, size, 3))
        jpeg = tf.io.encode_jpeg(np.clip(pixels, 0, 255).astype(np.uint8), quality=90).numpy()
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="path prefix of the shards (local or s3://...)")
    parser.add_argument("--num", type=int, default=8000)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--skew", choices=("uniform", "long-tail", "zipf"), default="long-tail")
    parser.add_argument("--shards", type=int, default=4, help="files (per class with --partition)")
    parser.add_argument("--partition", action="store_true", help="one shard group per class (for stratified reads)")
    parser.add_argument("--compression", choices=("GZIP", "ZLIB"), default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tfdist.data import write_tfrecords

    paths = write_tfrecords(
        examples(args.num, args.classes, args.size, args.skew, args.seed),
        args.out,
        num_shards=args.shards,
        compression=args.compression,
        partition_by="label" if args.partition else None,
    )
    summary = {
        "files": len(paths),
        "records": args.num,
        "class_counts": class_counts(args.num, args.classes, args.skew),
        "prefix": args.out,
    }
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
