"""Benchmark: input pipeline records/s, tfdist vs the seed-style chain vs the JPEG decode limit.

    .venv/bin/python scripts/bench_input.py [--sizes 64,128,224] [--num 8000] [--batch 128] [--repeats 5]
                                            [--shuffle-buffer 1024] [--epochs 1]
                                            [--scale 0.75] [--workdir DIR] [--s3]

For each image size it writes 8,000 synthetic JPEGs (8 classes whose frequencies halve from one class to the
next; scripts/make_synthetic_images.py) twice: in 16 files, and with
``write_tfrecords(..., num_shards=16, partition_by="label")`` (16 files per class). Images are decoded and
resized to ``scale`` x size. Then, ``--repeats`` times, it runs every variant of every size once, one after
the other, each goal's two variants back to back, in an order that rotates and reverses by repeat (so
drift and slow spells hit both sides of a ratio alike; see ``_order``):

  seed_style          TFRecordDataset(files) read sequentially, then separate AUTOTUNE maps: parse, decode,
                      resize, scale; batch; prefetch (the pipeline the project's seeds show), with TF's
                      default options; seed_style_no_model: the same with tf.data's autotuning model off;
  decode_limit        the same JPEG bytes already in memory, batched, decoded and resized by one map_fn per
                      batch on all cores: no reading and no parsing (decode_limit_per_element: one map per
                      image); decode_only (decode_jpeg to uint8, no resize) and decode_resize (no /255) split
                      the limit into the ops any pipeline with this output must run. These in-memory limits
                      run with tf.data's autotuning model off: with it, deleting the iterator at the end of
                      the epoch waits out the model's optimization period in about half the runs (up to
                      2.5 s here), which is not decoding;
  tfdist              TFRecordPipeline(image_key=..., image_size=...) with its defaults, on the 16 files
                      (the resumable epoch order, issue #24); tfdist_buffer: the same in order='buffer'
                      (TF's readers over each worker's own files, the order before issue #24);
  shuffled            the same with ``shuffle_buffer=--shuffle-buffer`` and seed 0 (shuffled windows of the
                      resumable order); shuffled_buffer: the same in order='buffer' (TF's shuffle buffer);
  partitioned_plain   the same, on the partitioned files;
  balanced, sqrt      the same partitioned files, stratified: class_weights="balanced" / "sqrt";
                      balanced_resumable: "balanced" with order="resumable" (draws a resume replays).

A run's time covers building the dataset (file listing, framing checks), reading every record of one
epoch and deleting the iterator (as every epoch of ``fit`` does); with ``--epochs N`` a run builds once
and reads N epochs, a new iterator each, as ``fit`` does over a training run. The CPU time of the process (all
threads) per 1,000 records is reported beside it, the CPU milliseconds of the build alone, and how many
iterator deletions took over 50 ms (all parts of the run). The report
gives, per size, the median records/s of every variant with its spread (min-max), and the median of
the per-repeat ratios (each ratio pairs two variants of the same repeat). With --s3 it also starts moto
on 127.0.0.1 and compares sequential vs parallel reads of the same files there.
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
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_RATIOS = {  # name -> (numerator, denominator, goal)
    "tfdist_vs_seed_style": ("tfdist", "seed_style", 1.3),
    "tfdist_vs_decode_limit": ("tfdist", "decode_limit", 0.9),
    "tfdist_vs_seed_style_no_model": ("tfdist", "seed_style_no_model", None),  # How much is the stall.
    "balanced_vs_plain": ("balanced", "partitioned_plain", 0.9),
    "sqrt_vs_plain": ("sqrt", "partitioned_plain", 0.9),
    "balanced_resumable_vs_balanced": ("balanced_resumable", "balanced", None),  # Issue #24: replayable draws.
    "resumable_vs_buffer_order": ("tfdist", "tfdist_buffer", 0.97),  # Issue #24: the resumable order's price.
    "shuffled_resumable_vs_buffer": ("shuffled", "shuffled_buffer", 0.97),  # The same, shuffled.
}


# Each goal's two variants run back to back: in each group, the variant a goal is about sits next to both
# of its partners (seed_style_no_model, shown without a goal, and seed_style run one and two places from tfdist).
_GROUPS = (
    ("seed_style_no_model", "seed_style", "tfdist_buffer", "tfdist", "decode_limit"),
    ("balanced_resumable", "balanced", "partitioned_plain", "sqrt"),
    ("decode_limit_per_element", "decode_only", "decode_resize"),
    ("shuffled_buffer", "shuffled"),
)
_STALL_MS = 50  # An iterator deletion slower than this waited on tf.data's autotuning model.


def _order(names: list[str], repeat: int) -> list[str]:
    """The run order of one repeat: the groups, rotated by repeat, each reversed on odd repeats.

    What slows one run down (warm-up, another guest on the host, a stalled iterator deletion) mostly hits
    its neighbours too, so a ratio of two variants run next to each other survives it; a rotating order
    over all variants let one side of a pair run slow and the other fast.
    """
    others = [n for n in names if not any(n in group for group in _GROUPS)]
    groups = [g for g in ([n for n in group if n in names] for group in _GROUPS) if g]
    groups += [others] if others else []
    shift = repeat % len(groups)
    ordered = groups[shift:] + groups[:shift]
    return [n for group in ordered for n in (group[::-1] if repeat % 2 else group)]


def _records_per_s(make: Callable[[], Any], epochs: int = 1) -> tuple[float, float, float, float]:
    """Builds the dataset, reads ``epochs`` epochs (a new iterator each, deleted at its end, as ``fit`` does):
    records/s over the whole run (the one build and the deletions included), the CPU time of this process
    (all threads) per 1,000 records, which other load on the machine moves less, the CPU milliseconds of
    the build alone (``make()``: listing, checks, tracing), and the longest wall milliseconds of deleting
    an iterator (part of the run)."""
    start, cpu, seen, deleting = time.perf_counter(), time.process_time(), 0, 0.0
    dataset = make()
    built = time.process_time()
    for _ in range(epochs):
        iterator = iter(dataset)
        for _, labels in iterator:
            seen += int(labels.shape[0])
        read = time.perf_counter()
        del iterator
        deleting = max(deleting, time.perf_counter() - read)
    end = time.perf_counter()
    return (seen / (end - start), 1000 * (time.process_time() - cpu) / seen, 1000 * (built - cpu), 1000 * deleting)


def _write(work: str, num: int, size: int) -> tuple[list[str], str]:
    """The 16 plain files and the partitioned prefix for ``size`` px images (written once per workdir)."""
    import tensorflow as tf
    from make_synthetic_images import examples

    from tfdist.data import write_tfrecords

    plain, part = os.path.join(work, f"plain{size}"), os.path.join(work, f"part{size}")
    if not tf.io.gfile.glob(plain + "-0*"):
        data = list(examples(num, 8, size, "long-tail", 0))
        write_tfrecords(data, plain, num_shards=16)
        write_tfrecords(data, part, num_shards=16, partition_by="label")
    return sorted(tf.io.gfile.glob(plain + "-0*")), part + "-*"


def _variants(files: list[str], part: str, out: int, batch: int, shuffle: int) -> dict[str, Callable[[], Any]]:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    size = (out, out)
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    autotune = tf.data.AUTOTUNE

    def decode_one(jpeg: Any) -> Any:
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), size) / 255.0

    def seed_style() -> Any:
        ds = tf.data.TFRecordDataset(files)
        ds = ds.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=autotune)
        ds = ds.map(lambda f: (tf.io.decode_jpeg(f["image"], channels=3), f["label"]), num_parallel_calls=autotune)
        ds = ds.map(lambda i, y: (tf.image.resize(i, size), y), num_parallel_calls=autotune)
        ds = ds.map(lambda i, y: (i / 255.0, y), num_parallel_calls=autotune)
        return ds.batch(batch).prefetch(autotune)

    def no_model(make: Callable[[], Any]) -> Callable[[], Any]:
        options = tf.data.Options()
        options.autotune.enabled = False
        return lambda: make().with_options(options)

    parsed = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
    pairs = list(parsed.map(lambda f: (f["image"], f["label"])))
    images, labels = tf.stack([p[0] for p in pairs]), tf.stack([p[1] for p in pairs])

    def in_memory(one: Callable[[Any], Any], dtype: Any) -> Callable[[], Any]:
        return no_model(
            lambda: (
                tf.data.Dataset.from_tensor_slices((images, labels))
                .batch(batch)
                .map(lambda b, y: (tf.map_fn(one, b, fn_output_signature=dtype), y), num_parallel_calls=autotune)
                .prefetch(autotune)
            )
        )

    @no_model
    def decode_limit_per_element() -> Any:
        return (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .map(lambda i, y: (decode_one(i), y), num_parallel_calls=autotune)
            .batch(batch)
            .prefetch(autotune)
        )

    def pipeline(paths: Any, **kwargs: Any) -> Callable[[], Any]:
        return lambda: TFRecordPipeline(
            files=paths,
            features=spec,
            batch_size=batch,
            image_key="image",
            image_size=size,
            label_key="label",
            as_supervised=True,
            **kwargs,
        ).dataset()

    return {
        "seed_style": seed_style,
        "seed_style_no_model": no_model(seed_style),
        "decode_limit": in_memory(decode_one, tf.float32),
        "decode_limit_per_element": decode_limit_per_element,
        "decode_only": in_memory(lambda jpeg: tf.io.decode_jpeg(jpeg, channels=3), tf.uint8),
        "decode_resize": in_memory(lambda jpeg: tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), size), tf.float32),
        "tfdist": pipeline(files),
        "tfdist_buffer": pipeline(files, order="buffer"),
        "shuffled": pipeline(files, shuffle_buffer=shuffle, seed=0),
        "shuffled_buffer": pipeline(files, shuffle_buffer=shuffle, seed=0, order="buffer"),
        "partitioned_plain": pipeline(part),
        "balanced": pipeline(part, class_weights="balanced", seed=0),
        "sqrt": pipeline(part, class_weights="sqrt", seed=0),
        "balanced_resumable": pipeline(part, class_weights="balanced", seed=0, order="resumable"),
    }


def _raw(
    runs: dict[str, list[float]],
    cpu: dict[str, list[float]],
    build: dict[str, list[float]],
    deletes: dict[str, list[float]],
) -> dict[str, Any]:
    """Every run of every variant (with ``--variants``): records/s, CPU s per 1,000 records, build CPU ms, and
    the wall ms of deleting the iterator."""
    return {
        k: {
            "records_per_s": [round(x) for x in v],
            "cpu_s_per_1k_records": [round(x, 4) for x in cpu[k]],
            "build_cpu_ms": [round(x) for x in build[k]],
            "delete_ms": [round(x) for x in deletes[k]],
        }
        for k, v in runs.items()
    }


def _summary(
    runs: dict[str, list[float]],
    cpu: dict[str, list[float]],
    build: dict[str, list[float]],
    deletes: dict[str, list[float]],
) -> dict[str, Any]:
    rates = {
        name: {
            "median": round(statistics.median(v)),
            "min": round(min(v)),
            "max": round(max(v)),
            "runs": [round(x) for x in v],
            "cpu_s_per_1k_records": round(statistics.median(cpu[name]), 3),
            "build_cpu_ms": round(statistics.median(build[name])),
            "stalls": sum(ms > _STALL_MS for ms in deletes[name]),
            "delete_ms_max": round(max(deletes[name])),
        }
        for name, v in runs.items()
    }
    ratios = {}
    pairs = {name: pair for name, pair in _RATIOS.items() if pair[0] in runs and pair[1] in runs}  # Run here.
    for name, (top, bottom, goal) in pairs.items():
        paired = [a / b for a, b in zip(runs[top], runs[bottom])]
        median = statistics.median(paired)
        ratios[name] = {
            "median": round(median, 3),
            "min": round(min(paired), 2),
            "max": round(max(paired), 2),
            "goal": goal,
            "met": goal is not None and median >= goal,
        }
    for name, (top, bottom, _goal) in pairs.items():  # The same ratios in CPU per record (inverse).
        paired = [b / a for a, b in zip(cpu[top], cpu[bottom])]
        ratios[name]["cpu_median"] = round(statistics.median(paired), 3)
    return {"records_per_s": rates, "ratios": ratios}


def _table(report: dict[str, Any]) -> str:
    """Markdown tables of the medians (and spreads), one row per variant or ratio, one column per size."""
    sizes = report["sizes"]
    if any("ratios" not in s for s in sizes.values()):
        return ""
    head = "| | " + " | ".join(f"{k} px" for k in sizes) + " |\n|---|" + "---|" * len(sizes) + "\n"
    names = list(next(iter(sizes.values()))["records_per_s"])
    rows = [
        f"| {n} | "
        + " | ".join(
            f"{s['records_per_s'][n]['median']:,} ({s['records_per_s'][n]['min']:,}–"
            f"{s['records_per_s'][n]['max']:,}); "
            f"{s['records_per_s'][n]['cpu_s_per_1k_records']:.3f} s; "
            f"{s['records_per_s'][n]['build_cpu_ms']} ms; "
            f"{s['records_per_s'][n]['stalls']} "
            f"({s['records_per_s'][n]['delete_ms_max']} ms)"
            for s in sizes.values()
        )
        + " |"
        for n in names
    ]
    ratios = [
        f"| {n} ({'no goal' if _RATIOS[n][2] is None else f'goal ≥ {_RATIOS[n][2]}'}) | "
        + " | ".join(
            ("**{:.3f}×**" if s["ratios"][n]["met"] else "{:.3f}×").format(s["ratios"][n]["median"])
            + f" ({s['ratios'][n]['min']:.2f}–{s['ratios'][n]['max']:.2f}); "
            f"CPU {s['ratios'][n]['cpu_median']:.3f}×"
            for s in sizes.values()
        )
        + " |"
        for n in next(iter(sizes.values()))["ratios"]
    ]
    return (
        "records/s, median (min–max); CPU s per 1,000 records (median); build CPU ms (median); "
        f"iterator deletions over {_STALL_MS} ms (the slowest)\n\n"
        + head
        + "\n".join(rows)
        + "\n\nratios, median of paired runs (min–max; bold: the goal is met); "
        "CPU: median of the paired CPU-per-record ratios\n\n" + head + "\n".join(ratios) + "\n\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,128,224", help="image sizes (px), comma-separated")
    parser.add_argument("--num", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=128, help="global batch")
    parser.add_argument("--scale", type=float, default=0.75, help="resize to this fraction of the size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1, help="epochs per run, one build (fit's way)")
    parser.add_argument("--shuffle-buffer", type=int, default=1024, help="shuffle_buffer of the shuffled variants")
    parser.add_argument("--variants", default="", help="only these variants (comma-separated; default all)")
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--workdir", default=None, help="keep the written files here (reused when present)")
    args = parser.parse_args(argv)
    import tensorflow as tf

    work = args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-")
    sizes = [int(s) for s in args.sizes.split(",")]
    variants: dict[int, Any] = {}
    runs: dict[int, Any] = {}
    cpu: dict[int, Any] = {}
    build: dict[int, Any] = {}
    deletes: dict[int, Any] = {}
    for size in sizes:
        files, part = _write(work, args.num, size)
        made = _variants(files, part, round(size * args.scale), args.batch, args.shuffle_buffer)
        if args.variants:
            made = {k: v for k, v in made.items() if k in args.variants.split(",")}
        variants[size] = made
        runs[size], cpu[size], build[size], deletes[size] = ({name: [] for name in made} for _ in range(4))
    for repeat in range(args.repeats):
        for size in sizes:
            for name in _order(list(variants[size]), repeat):
                rate, seconds, built, deleted = _records_per_s(variants[size][name], args.epochs)
                deletes[size][name].append(deleted)
                runs[size][name].append(rate)
                cpu[size][name].append(seconds)
                build[size][name].append(built)
    report: dict[str, Any] = {
        "records": args.num,
        "files": "16 plain; 16 per class partitioned (8 classes, halving)",
        "batch": args.batch,
        "repeats": args.repeats,
        "epochs_per_run": args.epochs,
        "tensorflow": tf.__version__,
        "cpus": os.cpu_count(),
        "goals": "tfdist >= 1.3x seed-style, >= 0.9x decode limit; stratified >= 0.9x plain (medians)",
        "sizes": {
            f"{size}->{round(size * args.scale)}": {
                **_summary(runs[size], cpu[size], build[size], deletes[size]),
                # With --variants (a few pairs, many repeats), every run too, to pool runs or pair them anew.
                **({"runs": _raw(runs[size], cpu[size], build[size], deletes[size])} if args.variants else {}),
            }
            for size in sizes
        },
    }
    if args.s3:
        report["s3"] = _bench_s3(_write(work, args.num, sizes[0])[0], args.batch, args.repeats)
    sys.stdout.write(_table(report) + json.dumps(report) + "\n")
    return 0


def _bench_s3(files: list[str], batch: int, repeats: int) -> dict[str, Any]:
    import boto3
    import tensorflow as tf

    from tfdist.cluster import can_connect, free_ports
    from tfdist.data.storage.remote import ensure_filesystem  # Internal: registers tensorflow-io's s3 for raw tf.data.

    port = free_ports(1)[0]
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = f"http://127.0.0.1:{port}"
        assert can_connect(f"127.0.0.1:{port}", 30)
        os.environ.update(
            S3_ENDPOINT=endpoint,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_REGION="us-east-1",
            S3_USE_HTTPS="0",
            S3_VERIFY_SSL="0",
        )
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        for path in files:
            client.upload_file(path, "bench", "data/" + os.path.basename(path))
        remote = [f"s3://bench/data/{os.path.basename(p)}" for p in files]
        ensure_filesystem(remote[0])
        out: dict[str, list[float]] = {"sequential": [], "parallel_interleave": []}
        for _ in range(repeats):
            for name, reads in (("sequential", None), ("parallel_interleave", 16)):
                start, seen = time.perf_counter(), 0
                for records in tf.data.TFRecordDataset(remote, num_parallel_reads=reads).batch(batch):
                    seen += int(records.shape[0])
                out[name].append(seen / (time.perf_counter() - start))
        med = {k: round(statistics.median(v)) for k, v in out.items()}
        return {
            "records_per_s_median": med,
            "parallel_vs_sequential": round(med["parallel_interleave"] / med["sequential"], 2),
        }
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
