"""Benchmark: what tf.data's autotuning model costs at the epoch ends of ``model.fit``.

    .venv/bin/python scripts/bench_epoch_end.py [--epochs 5] [--repeats 3] [--num 8000] [--size 128]
                                                [--workdir DIR]

``fit`` runs a small tf-keras model (global average pooling and one dense layer, so that reading and
decoding dominate) on ``TFRecordPipeline`` over ``--num`` synthetic JPEGs in 16 files, decoded and resized
to 3/4 of ``--size``, batch 128, for ``--epochs`` epochs. tf-keras makes a new iterator for every epoch
of a finite dataset and deletes the old one. Two settings alternate, ``--repeats`` times each:

  model_on    ``autotune_model=True``: tf.data's autotuning model runs (TF's default for any dataset);
  model_off   tfdist's default: the model off, every "autotune" parallelism at min(16, cores).

Per run: the wall time of ``fit``, and per epoch boundary the gap from the end of one epoch to the first
batch of the next (deleting the old iterator, making the new one, reading its first batch). The report
gives the medians, the gaps over 50 ms (~0.02 s without a stall here) and the largest gap of each
setting, and the median epoch time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_SLOW_GAP_S = 0.05  # Without a stall, deleting one iterator and making the next took ~0.02 s here.


def _fit_once(files: list[str], size: int, epochs: int, model_on: bool) -> dict[str, Any]:
    import tensorflow as tf

    from tfdist import keras
    from tfdist.data import TFRecordPipeline

    out = round(size * 0.75)
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    pipeline = TFRecordPipeline(
        files=files,
        features=spec,
        batch_size=128,
        image_key="image",
        image_size=(out, out),
        label_key="label",
        as_supervised=True,
        autotune_model=True if model_on else None,
    )
    image = keras.Input((out, out, 3), name="image")
    model = keras.Model(image, keras.layers.Dense(8)(keras.layers.GlobalAveragePooling2D()(image)))
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    marks: list[tuple[str, float]] = []

    class _Marks(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            marks.append(("end", time.perf_counter()))

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if batch == 0:
                marks.append(("first", time.perf_counter()))

    dataset = pipeline.dataset()
    start = time.perf_counter()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[_Marks()])
    done = time.perf_counter()
    ends = [t for kind, t in marks if kind == "end"]
    firsts = [t for kind, t in marks if kind == "first"]
    # tf-keras calls on_train_batch_begin before fetching the batch, so the gap runs to the next epoch's
    # first batch begin: deleting the old iterator and making the new one.
    gaps = [first - end for end, first in zip(ends, firsts[1:])]
    return {
        "fit_s": done - start,
        "gaps_s": gaps,
        "epochs_s": [e - f for f, e in zip(firsts, ends)],
        "tail_s": done - ends[-1],
    }


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=_at_least(2), default=5, help="at least 2: a gap needs two epochs")
    parser.add_argument("--repeats", type=_at_least(1), default=3)
    parser.add_argument("--num", type=_at_least(128), default=8000)
    parser.add_argument("--size", type=_at_least(8), default=128)
    parser.add_argument("--workdir", default=None, help="keep the written files here (reused when present)")
    args = parser.parse_args(argv)
    import tensorflow as tf
    from bench_input import _write  # The same files as the input benchmark (reused in a shared --workdir).

    files, _ = _write(args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-"), args.num, args.size)
    _fit_once(files, args.size, 2, False)  # Warm-up: the first fit of a process pays one-time costs.
    runs: dict[str, list[dict[str, Any]]] = {"model_on": [], "model_off": []}
    for repeat in range(args.repeats):
        order = ("model_on", "model_off") if repeat % 2 == 0 else ("model_off", "model_on")
        for name in order:
            runs[name].append(_fit_once(files, args.size, args.epochs, name == "model_on"))
    report: dict[str, Any] = {
        "tensorflow": tf.__version__,
        "cpus": os.cpu_count(),
        "records": args.num,
        "size": args.size,
        "epochs": args.epochs,
        "repeats": args.repeats,
    }
    for name, done in runs.items():
        gaps = [g for run in done for g in run["gaps_s"]]
        report[name] = {
            "fit_s_median": round(statistics.median(r["fit_s"] for r in done), 2),
            "fit_s": [round(r["fit_s"], 2) for r in done],
            "epoch_s_median": round(statistics.median(e for run in done for e in run["epochs_s"]), 2),
            "gap_s_median": round(statistics.median(gaps), 3),
            "gap_s_max": round(max(gaps), 3),
            "slow_gaps": f"{sum(g > _SLOW_GAP_S for g in gaps)}/{len(gaps)}",
            "tail_s_median": round(statistics.median(r["tail_s"] for r in done), 3),
            "tail_s_max": round(max(r["tail_s"] for r in done), 3),
        }
    report["fit_off_vs_on"] = round(report["model_on"]["fit_s_median"] / report["model_off"]["fit_s_median"], 2)
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
