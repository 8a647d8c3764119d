"""Benchmark: what one worker's input costs at 10k to 5M files of 2,000 records (up to 10^10 records).

    .venv/bin/python scripts/bench_scale.py [--sizes 10000,100000,1000000,5000000] [--workdir DIR]
                                            [--tree DIR] [--mode after|before] [--build-max 100000]

Each size runs in a fresh Python process (its resident memory is its own), which reports:

  order_s, order_rss_mb   ``EpochOrder(counts=(2000,) * N, block=256, streams=64, window=1024, seed=3)``
                          then the first 10 records of stream 37 of epoch 1: the order's planning, no bytes
                          read (the measurement of issue 48); RSS growth over the process after imports.
  --mode after (this tree), from a record index of N files (no record bytes: every entry names one of 16
  real files of 2,000 small records, at their real byte offsets, so what is read is real):
  build_s                 ``TFRecordPipeline(files="data.tfindex", batch_size=128, shuffle_buffer=1024,
                          order_streams=64, seed=3).dataset()``: one worker's pipeline build (MWMS).
  first_batch_s           its first batch in hand (the 64 streams' first windows planned and read).
  ps_build_s, ps_step_s   the same pipeline's ``claimed_dataset_fn`` (parameter servers; the counter is
                          local here) and the first claimed step read and parsed, up to ``--ps-max``
                          files (past 4M blocks the offsets are read from the index by range: slow).
  rss_mb, rss_anon_mb     resident memory after all that, and its anonymous part (not file pages that
                          the kernel can drop): the growth over the process after imports.
  --mode before (``--tree`` a checkout of main): order_s and order_rss_mb as above, and build_s of a
  ``TFRecordPipeline(files=pattern, ...)`` over N hard links to the 16 files, up to ``--build-max`` files
  (listing and walking headers cost per file: past that it is extrapolated, not measured).

Prints a table and ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

RECORDS = 2000  # Per file.
REAL = 16  # Real files the index's entries name.
BATCH, STREAMS, WINDOW, BLOCK = 128, 64, 1024, 256


def _rss() -> tuple[float, float]:
    """(VmRSS, RssAnon) of this process, in MB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value.split()
    return int(fields["VmRSS"][0]) / 1024, int(fields["RssAnon"][0]) / 1024


def _real_files(workdir: str) -> list[str]:
    """16 copies of one file of 2,000 records (an id and 64 bytes), written once: alike byte for byte."""
    import shutil

    import tensorflow as tf

    folder = os.path.join(workdir, "real")
    paths = [os.path.join(folder, f"real-{i:02d}.tfrecord") for i in range(REAL)]
    if all(os.path.exists(p) for p in paths):
        return paths
    os.makedirs(folder, exist_ok=True)
    with tf.io.TFRecordWriter(paths[0]) as writer:
        for r in range(RECORDS):
            feature = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[r])),
                "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[os.urandom(64)])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for path in paths[1:]:
        shutil.copyfile(paths[0], path)
    return paths


def _index(workdir: str, files: int) -> str:
    """A record index of ``files`` entries of 2,000 records, each naming one of the 16 real files."""
    import numpy as np

    from tfdist.data.records import _framing
    from tfdist.data.records.index import write_index

    path = os.path.join(workdir, f"scale-{files}.tfindex")
    if os.path.exists(path):
        return path
    real = _real_files(workdir)
    walked = _framing.block_offsets(real[0], 1)[1]  # Every record's offset (the files are alike).
    which = np.arange(files) % REAL
    records = files * RECORDS
    grid = np.arange(0, records, BLOCK, dtype=np.int64)
    offsets = np.asarray(walked, np.int64)[grid % RECORDS]
    write_index(
        path,
        names=np.asarray([os.path.relpath(p, workdir).encode() for p in real])[which],
        counts=np.full(files, RECORDS, np.int64),
        sizes=np.full(files, os.path.getsize(real[0]), np.int64),
        offsets=offsets,
        grid=BLOCK,
        compression="",
        relative=True,
    )
    return path


def _links(workdir: str, files: int) -> str:
    """``files`` hard links to the 16 real files, in a folder of their own: a listing of that size."""
    folder = os.path.join(workdir, f"links-{files}")
    if not os.path.isdir(folder):
        real = _real_files(workdir)
        os.makedirs(folder + ".tmp", exist_ok=True)
        for i in range(files):
            os.link(real[i % REAL], os.path.join(folder + ".tmp", f"part-{i:07d}.tfrecord"))
        os.rename(folder + ".tmp", folder)
    return os.path.join(folder, "part-*")


def child(mode: str, files: int, workdir: str, build_max: int, ps_max: int) -> dict[str, Any]:
    """One size, in this (fresh) process: the order first, before TensorFlow is imported."""
    import numpy  # noqa: F401 (imported before the baseline)

    from tfdist.data.order.epoch import EpochOrder

    base, base_anon = _rss()
    out: dict[str, Any] = {"files": files, "records": files * RECORDS}
    started = time.perf_counter()
    order = EpochOrder(counts=(RECORDS,) * files, block=BLOCK, streams=STREAMS, window=WINDOW, seed=3)
    first = [r for _, r in zip(range(10), order.stream_records(epoch=1, stream=37))]
    out["order_s"] = time.perf_counter() - started
    out["order_rss_mb"] = _rss()[0] - base
    assert len(first) == 10
    del order, first
    if mode == "before" and files > build_max:
        return out
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    features = {"id": tf.io.FixedLenFeature([], tf.int64)}
    if mode == "before":
        pattern = _links(workdir, files)
        base, base_anon = _rss()
        started = time.perf_counter()
        TFRecordPipeline(
            files=pattern, batch_size=BATCH, features=features, shuffle_buffer=WINDOW, order_streams=STREAMS, seed=3
        ).dataset()
        out["build_s"] = time.perf_counter() - started
        rss, anon = _rss()
        out["rss_mb"], out["rss_anon_mb"] = rss - base, anon - base_anon
        return out
    index = _index(workdir, files)
    pipeline = TFRecordPipeline(
        files=index, batch_size=BATCH, features=features, shuffle_buffer=WINDOW, order_streams=STREAMS, seed=3
    )
    base, base_anon = _rss()
    started = time.perf_counter()
    dataset = pipeline.dataset()
    out["build_s"] = time.perf_counter() - started
    started = time.perf_counter()
    batch = next(iter(dataset))
    out["first_batch_s"] = time.perf_counter() - started
    assert int(tf.shape(batch["id"])[0]) == BATCH
    if files > ps_max:  # Past 4M blocks the workers read offsets from the index by range: slow (docs/data.md).
        rss, anon = _rss()
        out["rss_mb"], out["rss_anon_mb"] = rss - base, anon - base_anon
        return out
    started = time.perf_counter()
    dataset_fn = pipeline.claimed_dataset_fn(tf.distribute.get_strategy())
    assert dataset_fn is not None
    steps = dataset_fn(None)
    out["ps_build_s"] = time.perf_counter() - started
    started = time.perf_counter()
    step = next(iter(steps))
    out["ps_step_s"] = time.perf_counter() - started
    assert int(tf.shape(step["id"])[0]) == BATCH
    rss, anon = _rss()
    out["rss_mb"], out["rss_anon_mb"] = rss - base, anon - base_anon
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000,5000000")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "tfdist-bench-scale"))
    parser.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--mode", choices=("after", "before"), default="after")
    parser.add_argument("--build-max", type=int, default=100_000)
    parser.add_argument("--ps-max", type=int, default=100_000)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(
            "RESULT " + json.dumps(child(args.mode, args.child, args.workdir, args.build_max, args.ps_max)), flush=True
        )
        return
    os.makedirs(args.workdir, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": args.tree, "TF_CPP_MIN_LOG_LEVEL": "2"}
    rows = []
    sys.path.insert(0, args.tree)
    for size in (int(s) for s in args.sizes.split(",")):
        if args.mode == "after":
            _index(args.workdir, size)  # Here, not in the measured process.
        command = [sys.executable, os.path.abspath(__file__), "--child", str(size), "--mode", args.mode]
        command += ["--workdir", args.workdir, "--build-max", str(args.build_max), "--ps-max", str(args.ps_max)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            rows.append({"files": size, "error": (done.stderr.strip().splitlines() or ["?"])[-1]})
        else:
            rows.append(json.loads(lines[-1][len("RESULT ") :]))
        print(json.dumps(rows[-1]), flush=True)
    columns = ["files", "order_s", "order_rss_mb", "build_s", "first_batch_s", "ps_build_s", "ps_step_s", "rss_mb"]
    columns += ["rss_anon_mb"]
    print(" ".join(f"{c:>13}" for c in columns))
    for row in rows:
        print(
            " ".join(
                f"{row.get(c, '-'):>13.3f}" if isinstance(row.get(c), float) else f"{row.get(c, '-'):>13}"
                for c in columns
            )
        )
    print("RESULT " + json.dumps({"mode": args.mode, "tree": args.tree, "rows": rows}))


if __name__ == "__main__":
    main()
