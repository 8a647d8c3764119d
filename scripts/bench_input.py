"""Benchmark: input pipeline records/s, tfdist vs the seed-style pipeline vs the decode-bound limit.

    .venv/bin/python scripts/bench_input.py [--num 8000] [--size 128] [--out-size 96] [--repeats 3] [--s3]

Writes synthetic JPEG TFRecords (16 files, and the same data partitioned by class) with
scripts/make_synthetic_images.py's generator, then measures in one run, interleaved, median of repeats:
  raw read       records/s of TFRecordDataset alone (sequential and parallel reads);
  seed-style     TFRecordDataset(files) read sequentially, then separate AUTOTUNE maps: parse, decode, resize,
                 convert; batch; prefetch (the pipeline the project's seeds show);
  decode limit   decode+resize of the same JPEG bytes already in memory on all cores, the better of
                 per-element and batched decoding (what no reader can beat);
  tfdist         TFRecordPipeline(image_key=..., image_size=...), plain and stratified (class_weights).
With --s3 it also starts moto on 127.0.0.1 and compares sequential vs parallel reads of the same files there.
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
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _rate(make: Callable[[], Any], records: int, batch: int) -> float:
    dataset = make()
    iterator = iter(dataset)
    next(iterator)  # Warm-up: builds the pipeline and fills the first buffers.
    start, seen = time.perf_counter(), batch
    for element in iterator:
        seen += batch
        del element
    return (seen - batch) / (time.perf_counter() - start) if seen > batch else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num", type=int, default=8000)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--out-size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--s3", action="store_true")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    import tensorflow as tf

    from make_synthetic_images import examples
    from tfdist.data import TFRecordPipeline, write_tfrecords

    work = args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-")
    plain_prefix, part_prefix = os.path.join(work, "plain"), os.path.join(work, "part")
    if not tf.io.gfile.glob(plain_prefix + "-0*"):
        data = list(examples(args.num, 8, args.size, "long-tail", 0))
        write_tfrecords(data, plain_prefix, num_shards=16)
        write_tfrecords(data, part_prefix, num_shards=2, partition_by="label")
    files = sorted(tf.io.gfile.glob(plain_prefix + "-0*"))
    size, batch, n = (args.out_size, args.out_size), args.batch, args.num
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    steps = n // batch

    def decode_one(jpeg: Any) -> Any:
        return tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), size) / 255.0

    def raw(parallel: bool) -> Any:
        return tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE if parallel else None).batch(batch)

    def seed_style() -> Any:
        ds = tf.data.TFRecordDataset(files)
        ds = ds.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(lambda f: (tf.io.decode_jpeg(f["image"], channels=3), f["label"]), num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(lambda i, y: (tf.image.resize(i, size), y), num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(lambda i, y: (i / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(batch).prefetch(tf.data.AUTOTUNE)

    images = [f["image"] for f in tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))]
    in_memory = tf.stack(images)

    def limit_per_element() -> Any:
        return (tf.data.Dataset.from_tensor_slices(in_memory).map(decode_one, num_parallel_calls=tf.data.AUTOTUNE)
                .batch(batch).prefetch(tf.data.AUTOTUNE))

    def limit_batched() -> Any:
        return (tf.data.Dataset.from_tensor_slices(in_memory).batch(batch)
                .map(lambda b: tf.map_fn(decode_one, b, fn_output_signature=tf.float32),
                     num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))

    def tfdist_plain() -> Any:
        return TFRecordPipeline(files=files, features=spec, batch_size=batch, image_key="image", image_size=size,
                                label_key="label", as_supervised=True).dataset()

    def tfdist_part_plain() -> Any:
        return TFRecordPipeline(files=part_prefix + "-*", features=spec, batch_size=batch, image_key="image",
                                image_size=size, label_key="label", as_supervised=True).dataset()

    def tfdist_stratified() -> Any:
        return TFRecordPipeline(files=part_prefix + "-*", features=spec, batch_size=batch, image_key="image",
                                image_size=size, label_key="label", as_supervised=True, class_weights="sqrt",
                                seed=0).dataset()

    def tfdist_stratified_block1() -> Any:
        return TFRecordPipeline(files=part_prefix + "-*", features=spec, batch_size=batch, image_key="image",
                                image_size=size, label_key="label", as_supervised=True, class_weights="sqrt",
                                seed=0, sample_block=1).dataset()

    variants = {"raw_read_sequential": lambda: raw(False), "raw_read_parallel": lambda: raw(True),
                "seed_style": seed_style, "decode_limit_per_element": limit_per_element,
                "decode_limit_batched": limit_batched, "tfdist": tfdist_plain,
                "tfdist_partitioned_plain": tfdist_part_plain, "tfdist_stratified": tfdist_stratified,
                "tfdist_stratified_per_record": tfdist_stratified_block1}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, make in variants.items():
            rates[name].append(_rate(make, steps, batch))
    med = {k: round(statistics.median(v)) for k, v in rates.items()}
    limit = max(med["decode_limit_per_element"], med["decode_limit_batched"])
    report: dict[str, Any] = {
        "records": n, "image": f"{args.size}x{args.size} JPEG -> {args.out_size}x{args.out_size}", "files": 16,
        "batch": batch, "repeats": args.repeats, "records_per_s_median": med,
        "records_per_s_all": {k: [round(x) for x in v] for k, v in rates.items()},
        "ratios": {"tfdist_vs_seed_style": round(med["tfdist"] / med["seed_style"], 2),
                   "tfdist_vs_decode_limit": round(med["tfdist"] / limit, 2),
                   "stratified_vs_plain_same_files": round(med["tfdist_stratified"] / med["tfdist_partitioned_plain"], 2),
                   "stratified_per_record_vs_plain": round(med["tfdist_stratified_per_record"] /
                                                           med["tfdist_partitioned_plain"], 2),
                   "goals": "tfdist >= 1.3x seed-style, >= 0.9x decode limit; stratified >= 0.9x plain"}}
    if args.s3:
        report["s3"] = _bench_s3(files, batch, args.repeats)
    sys.stdout.write(json.dumps(report, indent=1) + "\n")
    return 0


def _bench_s3(files: list[str], batch: int, repeats: int) -> dict[str, Any]:
    import boto3
    import tensorflow as tf

    from tfdist import _address
    from tfdist.data.remote import ensure_filesystem
    from tfdist.probe import can_connect

    port = _address.free_ports(1)[0]
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        assert can_connect(f"127.0.0.1:{port}", 30)
        os.environ.update(S3_ENDPOINT=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",  # noqa
                          AWS_REGION="us-east-1", S3_USE_HTTPS="0", S3_VERIFY_SSL="0")
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        for path in files:
            client.upload_file(path, "bench", "data/" + os.path.basename(path))
        remote = [f"s3://bench/data/{os.path.basename(p)}" for p in files]
        ensure_filesystem(remote[0])
        out: dict[str, list[float]] = {"sequential": [], "parallel_interleave": []}
        for _ in range(repeats):
            for name, reads in (("sequential", None), ("parallel_interleave", 16)):
                make = lambda r=reads: tf.data.TFRecordDataset(remote, num_parallel_reads=r).batch(batch)  # noqa
                out[name].append(_rate(make, 0, batch))
        med = {k: round(statistics.median(v)) for k, v in out.items()}
        return {"records_per_s_median": med, "parallel_vs_sequential": round(med["parallel_interleave"] /
                                                                             med["sequential"], 2)}
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
