"""Benchmark: reading TFRecords from s3:// with tfdist's boto3 reader vs tensorflow-io's file system.

    .venv/bin/python scripts/bench_s3.py [--files 16] [--mb-per-file 8] [--repeats 5]

Starts the moto S3 server on 127.0.0.1, writes FILES TFRecord files of 1 KiB records once, then times one
full pass of `TFRecordPipeline(files="s3://...", batch_size=256, verify="none")` (16 parallel reads) in a
fresh process per run, alternating the readers (TFDIST_S3_READER=tensorflow, i.e. tensorflow-io, and
TFDIST_S3_READER=boto3), so each boto3 run starts with an empty cache. Reports the median MB/s of each
and the ratio boto3/tensorflow-io (goal: >= 1). tensorflow-io needs the pinned stack (TF 2.17).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

KEYS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_REGION": "us-east-1",
    "S3_USE_HTTPS": "0",
    "S3_VERIFY_SSL": "0",
}
PATTERN = "s3://bench/data/part-*"


def child(mode: str, files: int, mb_per_file: int) -> None:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline, write_tfrecords

    if mode == "write":
        import boto3

        boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
        record = os.urandom(1024)
        count = files * mb_per_file * 1024
        write_tfrecords((record for _ in range(count)), "s3://bench/data/part", num_shards=files)
        print(json.dumps({"records": count}), flush=True)
        return
    pipeline = TFRecordPipeline(
        files=PATTERN, batch_size=256, verify="none", drop_remainder=False, parse_fn=lambda records: records
    )
    start = time.perf_counter()
    count = 0
    for batch in pipeline.dataset():
        count += int(tf.shape(batch)[0])
    print(json.dumps({"records": count, "seconds": time.perf_counter() - start}), flush=True)


def _run(args: argparse.Namespace, mode: str, env: dict[str, str]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--files", str(args.files), "--mb-per-file", str(args.mb_per_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--mb-per-file", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import tfdist

        tfdist.exit_cleanly(child, args.child, args.files, args.mb_per_file)  # tensorflow-io#2039

    from tfdist.cluster import can_connect, free_ports

    port = free_ports(1)[0]
    server = shutil.which("moto_server") or os.path.join(os.path.dirname(sys.executable), "moto_server")
    moto = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert can_connect(f"127.0.0.1:{port}", timeout=30), "moto_server did not start"
        env = dict(
            os.environ,
            **KEYS,
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            S3_ENDPOINT=f"http://127.0.0.1:{port}",
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
        )
        total = _run(args, "write", dict(env, TFDIST_S3_READER="boto3"))["records"]
        mb = total / 1024
        runs: dict[str, list[float]] = {"tensorflow": [], "boto3": []}
        for _ in range(args.repeats):
            for reader in runs:
                result = _run(args, "read", dict(env, TFDIST_S3_READER=reader))
                assert result["records"] == total, result
                runs[reader].append(mb / result["seconds"])
        medians = {reader: statistics.median(rates) for reader, rates in runs.items()}
        print(f"{args.files} files x {args.mb_per_file} MB ({total} records of 1 KiB) on moto, one pass each")
        print("| reader | MB/s per run | median MB/s |\n|---|---|---|")
        for reader, rates in runs.items():
            name = "tensorflow-io" if reader == "tensorflow" else "tfdist boto3"
            print(f"| {name} | {' '.join(f'{r:.0f}' for r in rates)} | {medians[reader]:.0f} |")
        print(f"ratio boto3 / tensorflow-io: {medians['boto3'] / medians['tensorflow']:.2f}x")
    finally:
        os.killpg(moto.pid, signal.SIGTERM)
        moto.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
