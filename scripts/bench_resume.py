"""Benchmark: time from restart to the first batch when resuming mid-epoch, seek against fast-forward.

    .venv/bin/python scripts/bench_resume.py [--gb 1.0] [--record-kb 4] [--files 64] [--batch 256]
                                             [--repeats 3] [--workdir DIR]

Writes ``--gb`` GB of TFRecords (``--record-kb`` KB records: an id and random bytes, in ``--files`` files),
then, ``--repeats`` times, in an order that rotates by repeat, starts a fresh Python process per variant and
times, from the moment TensorFlow and tfdist are imported to the first batch in hand:

  fresh               ``TFRecordPipeline(..., shuffle_buffer=1024)`` from the start of the epoch (what a new
                      job or a resume at 0% costs);
  seek_10/50/90       the same pipeline started at 10%, 50% and 90% of the epoch
                      (``pipeline.start_at(DataPosition(step=...))``: the resumable order opens the block the
                      position falls in at its byte offset and re-reads at most one shuffle window per stream);
  skip_10/50/90       the fast-forward a plain tf.data user writes: the same files in the 'buffer' order and
                      ``dataset.skip(steps)`` (every record before the position is read and parsed again).

Each includes building the dataset (listing, the framing walk that finds the block offsets, tracing).
Then it reads one whole epoch (records/s, ids parsed) in the 'resumable' and the 'buffer' order and as the
claimed steps of parameter-server input (``claimed_dataset_fn``: each step claimed from a counter, then read
and parsed inside the step; here the counter is local, a ps adds one round trip per step), in an order
that rotates by repeat, ``--repeats`` times each: the price of each order on an uninterrupted run.
The physical limit is the first variant (fresh): a resume cannot start faster than a start.
Prints a table and ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

_SHUFFLE = 1024
_FRACTIONS = (0.1, 0.5, 0.9)


def _write(work: str, gb: float, record_kb: int, files: int) -> tuple[str, int]:
    import numpy as np
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    prefix = os.path.join(work, f"resume-{gb:g}gb-{record_kb}kb-{files}")
    num = int(gb * (1 << 30) // (record_kb << 10))
    marker = prefix + ".done"
    if not os.path.exists(marker):
        payload = np.random.default_rng(0).bytes(record_kb << 10)

        def examples() -> Any:
            for i in range(num):
                yield tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                            "data": tf.train.Feature(bytes_list=tf.train.BytesList(value=[payload])),
                        }
                    )
                )

        write_tfrecords(examples(), prefix, num_shards=files)
        with open(marker, "w") as f:
            f.write(str(num))
    return prefix, num


def _pipeline(prefix: str, batch: int, order: str) -> Any:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    return TFRecordPipeline(
        files=prefix + "-*",
        features={"id": tf.io.FixedLenFeature([], tf.int64)},
        batch_size=batch,
        shuffle_buffer=_SHUFFLE,
        seed=1,
        order=order,
    )


def _one(prefix: str, batch: int, variant: str, num: int) -> dict[str, float]:
    """Runs one variant in this (fresh) process."""
    import tensorflow as tf

    from tfdist.data import DataPosition

    ready = time.perf_counter()
    if variant in ("epoch_resumable", "epoch_buffer", "epoch_claimed"):
        order = variant.split("_")[1]
        pipeline = _pipeline(prefix, batch, "auto" if order == "claimed" else order)
        if order == "claimed":
            dataset = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())(None)
        else:
            dataset = pipeline.dataset()
        count = sum(int(b["id"].shape[0]) for b in dataset)
        seconds = time.perf_counter() - ready
        return {"seconds": seconds, "records_per_s": count / seconds, "records": count}
    kind, _, percent = variant.partition("_")
    steps = int(num // batch * int(percent or 0) / 100)
    if kind == "skip":
        dataset = _pipeline(prefix, batch, "buffer").dataset().skip(steps)
    else:
        pipeline = _pipeline(prefix, batch, "resumable")
        pipeline.start_at(DataPosition(epoch=0, step=steps))
        dataset = pipeline.dataset()
    first = next(iter(dataset))
    tf.debugging.assert_positive(tf.shape(first["id"])[0])
    return {"seconds": time.perf_counter() - ready}


def _run(prefix: str, batch: int, variant: str, num: int) -> dict[str, float]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, __file__, "--one", variant, "--prefix", prefix, "--batch", str(batch), "--num", str(num)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{variant} failed:\n{done.stderr[-3000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("ONE "))
    return json.loads(line[4:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--record-kb", type=int, default=4)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--num", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("ONE " + json.dumps(_one(args.prefix, args.batch, args.one, args.num)), flush=True)
        return 0
    work = args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-resume-")
    os.makedirs(work, exist_ok=True)
    prefix, num = _write(work, args.gb, args.record_kb, args.files)
    starts = ["fresh"] + [f"{k}_{int(f * 100)}" for f in _FRACTIONS for k in ("seek", "skip")]
    times: dict[str, list[float]] = {v: [] for v in starts}
    epochs: dict[str, list[float]] = {"epoch_resumable": [], "epoch_buffer": [], "epoch_claimed": []}
    for repeat in range(args.repeats):
        shift = repeat % len(starts)
        for variant in starts[shift:] + starts[:shift]:
            times[variant].append(_run(prefix, args.batch, variant, num)["seconds"])
        turn = list(epochs)[repeat % 3 :] + list(epochs)[: repeat % 3]
        for variant in turn:
            epochs[variant].append(_run(prefix, args.batch, variant, num)["records_per_s"])
    median = {v: statistics.median(t) for v, t in times.items()}
    rates = {v: statistics.median(r) for v, r in epochs.items()}
    ratios = [r / b for r, b in zip(epochs["epoch_resumable"], epochs["epoch_buffer"])]
    claimed = [c / b for c, b in zip(epochs["epoch_claimed"], epochs["epoch_buffer"])]
    result = {
        "records": num,
        "gb": args.gb,
        "record_kb": args.record_kb,
        "files": args.files,
        "batch": args.batch,
        "repeats": args.repeats,
        "first_batch_s": median,
        "first_batch_spread_s": {v: [min(t), max(t)] for v, t in times.items()},
        "seek_90_vs_fresh": median["seek_90"] / median["fresh"],
        "skip_90_vs_fresh": median["skip_90"] / median["fresh"],
        "epoch_records_per_s": rates,
        "resumable_vs_buffer_epoch": statistics.median(ratios),
        "claimed_vs_buffer_epoch": statistics.median(claimed),
    }
    print(f"{'variant':<10}{'first batch (s), median':>26}{'min-max':>18}")
    for variant in starts:
        low, high = result["first_batch_spread_s"][variant]
        print(f"{variant:<10}{median[variant]:>26.2f}{f'{low:.2f}-{high:.2f}':>18}")
    print(
        f"one epoch: resumable {rates['epoch_resumable']:.0f} records/s, buffer {rates['epoch_buffer']:.0f} "
        f"records/s, ratio (median of pairs) {result['resumable_vs_buffer_epoch']:.3f}; claimed steps "
        f"{rates['epoch_claimed']:.0f} records/s, ratio {result['claimed_vs_buffer_epoch']:.3f}"
    )
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
