"""Benchmark of shuffle quality: the resumable order's block and window shuffle against TF's shuffle buffer.

    .venv/bin/python scripts/bench_shuffle.py [--classes 8] [--files-per-class 8] [--per-file 1024]
                                              [--batch 256] [--buffers 1024,8192] [--order-block 256] [--seeds 3]
                                              [--workdir DIR]

The hard case for any shuffle that reads files a piece at a time: the data is written one group of files per
class (``write_tfrecords(..., partition_by="label")``), so the listing order is sorted by class, and records of
a file are in id order. Every variant reads two real epochs of one worker's ``TFRecordPipeline`` (ids parsed)
with each seed, and the order is scored against what a shuffle should give:

  none               ``shuffle_buffer=0``: the naive way (listing order, files interleaved);
  buffer_B           ``order="buffer"``: TF's shuffle buffer of B records over the interleaved files
                     (the best peer: what every tf.data pipeline does);
  resumable_B        ``order="resumable"`` with ``shuffle_buffer=B``: blocks of ``order_block`` records permuted
                     per epoch, cut into streams, each shuffled within windows of B records (tfdist's default;
                     ``--order-block`` sets the block);
  uniform            a uniformly random permutation of the epoch (numpy): the physical limit.

Scores (each the median over seeds; lower is better for all but ``classes_per_batch``):

  batch_tv           mean over batches of the total variation distance between the batch's class histogram
                     and the data's (uniform is not 0: a batch is a sample);
  classes_per_batch  mean number of distinct classes in a batch;
  same_file_pairs    fraction of consecutive records that come from the same file (uniform: about 1/files);
  position_rho       |Spearman correlation| between a record's place in the listing and in the epoch;
  epoch_rho          |Spearman correlation| between a record's place in epoch 0 and in epoch 1 (reshuffling).

Prints a table and ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

_SCORES = ("batch_tv", "classes_per_batch", "same_file_pairs", "position_rho", "epoch_rho")


def _write(work: str, classes: int, files_per_class: int, per_file: int) -> tuple[str, Any, Any]:
    """Writes the class-sorted data; returns its prefix and, per id, its listing place and its file."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    per_class = files_per_class * per_file
    prefix = os.path.join(work, f"shuffle-{classes}x{files_per_class}x{per_file}")

    def example(i: int) -> Any:
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i // per_class])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    marker = prefix + ".done"
    if not os.path.exists(marker):
        write_tfrecords(
            (example(i) for i in range(classes * per_class)), prefix, num_shards=files_per_class, partition_by="label"
        )
        open(marker, "w").close()
    # write_tfrecords deals a class's records round-robin over its files: record j of class k is record
    # j // files_per_class of file (k, j % files_per_class), and the listing is sorted by class, then file.
    ids = np.arange(classes * per_class)
    klass, j = ids // per_class, ids % per_class
    file = klass * files_per_class + j % files_per_class
    return prefix, file * per_file + j // files_per_class, file


def _read(prefix: str, batch: int, variant: str, seed: int, block: int) -> Any:
    """Two epochs of ids, as one worker's pipeline delivers them (int64 array, epoch after epoch)."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    order, _, buffer = variant.partition("_")
    pipeline = TFRecordPipeline(
        files=prefix + "-*",
        features={"id": tf.io.FixedLenFeature([], tf.int64)},
        batch_size=batch,
        shuffle_buffer=int(buffer or 0),
        seed=seed,
        num_epochs=2,
        order="buffer" if order == "none" else order,
        order_block=block,
    )
    return np.concatenate([b["id"].numpy() for b in pipeline.dataset()])


def _rho(a: Any, b: Any) -> float:
    """|Spearman correlation| of two permutations of the same ranks."""
    import numpy as np

    return float(abs(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1]))


def _scores(epochs: Any, place: Any, file: Any, classes: int, batch: int) -> dict[str, float]:
    """The scores of two epochs of ids (see the module docstring)."""
    import numpy as np

    num = len(place)
    first, second = epochs[:num], epochs[num:]
    if sorted(first.tolist()) != list(range(num)) or sorted(second.tolist()) != list(range(num)):
        raise RuntimeError("an epoch did not deliver every record exactly once")
    per_class = num // classes
    full = num // batch * batch
    labels = (first[:full] // per_class).reshape(-1, batch)
    hist = np.stack([np.bincount(row, minlength=classes) for row in labels]) / batch
    position = np.empty(num, dtype=np.int64)
    position[first] = np.arange(num)
    position_next = np.empty(num, dtype=np.int64)
    position_next[second] = np.arange(num)
    return {
        "batch_tv": float(np.abs(hist - 1.0 / classes).sum(axis=1).mean() / 2),
        "classes_per_batch": float((hist > 0).sum(axis=1).mean()),
        "same_file_pairs": float(np.mean(file[first[1:]] == file[first[:-1]])),
        "position_rho": _rho(place, position),
        "epoch_rho": _rho(position, position_next),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=8)
    parser.add_argument("--files-per-class", type=int, default=8)
    parser.add_argument("--per-file", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--buffers", default="1024,8192")
    parser.add_argument("--order-block", type=int, default=256, help="records per block of the resumable order")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    work = args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-shuffle-")
    os.makedirs(work, exist_ok=True)
    prefix, place, file = _write(work, args.classes, args.files_per_class, args.per_file)
    buffers = [int(b) for b in args.buffers.split(",")]
    variants = ["none"] + [f"{o}_{b}" for b in buffers for o in ("buffer", "resumable")] + ["uniform"]
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for seed in range(1, args.seeds + 1):
        for variant in variants:
            if variant == "uniform":
                rng = np.random.default_rng(seed)
                epochs = np.concatenate([rng.permutation(len(place)), rng.permutation(len(place))])
            else:
                epochs = _read(prefix, args.batch, variant, seed, args.order_block)
            runs[variant].append(_scores(epochs, place, file, args.classes, args.batch))
    result = {v: {s: statistics.median(r[s] for r in runs[v]) for s in _SCORES} for v in variants}
    print(f"{'variant':<16}" + "".join(f"{s:>19}" for s in _SCORES))
    for variant in variants:
        print(f"{variant:<16}" + "".join(f"{result[variant][s]:>19.4f}" for s in _SCORES))
    setup = {k: getattr(args, k) for k in ("classes", "files_per_class", "per_file", "batch", "order_block", "seeds")}
    print("RESULT " + json.dumps({"setup": setup, "scores": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
