"""Benchmark: time from launch to the first completed training step, 2 workers vs one plain process.

    .venv/bin/python scripts/bench_launch.py [--repeats 3]

Runs, alternating in one session so machine noise hits both alike:
  * tfdist:  `tfdist-launch --workers 2 -- python bench_launch.py --child` (MultiWorkerMirroredStrategy);
  * plain:   `python bench_launch.py --child` with no TF_CONFIG (TF's default strategy, one process);
  * tfdist without the peer wait (build_strategy(peer_wait_seconds=0)), to show what the wait buys.
The child records the wall-clock time at which its first training step ended; the launch time counts until
the slower worker's first step. Reports medians and the ratio tfdist/plain (goal: under 1.5x).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

MARK = "FIRST_STEP_AT"


def child(peer_wait: bool) -> int:
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring", peer_wait_seconds=300 if peer_wait else 0)
    import numpy as np
    import tensorflow as tf

    from tfdist import keras

    x = np.random.default_rng(0).normal(size=(2048, 32)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).with_options(options)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    marked: list[float] = []

    def _mark(batch: int, logs: object) -> None:
        if not marked:
            marked.append(time.time())
            sys.stdout.write(f"{MARK} {marked[0]:.6f}\n")
            sys.stdout.flush()

    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=4,
        verbose=0,
        callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=_mark)],
    )
    return 0


def _time_to_first_step(argv: list[str], env: dict[str, str], expect: int) -> float:
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    marks = [float(m) for m in re.findall(rf"{MARK} ([0-9.]+)", done.stdout)]
    if done.returncode != 0 or len(marks) != expect:
        raise SystemExit(f"run failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return max(marks) - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-peer-wait", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.child:
        from tfdist import exit_cleanly

        exit_cleanly(child, not args.no_peer_wait)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    launch = [sys.executable, "-m", "tfdist.cli.launch", "--workers", "2", "--"] + me
    plain_s, launch_s, no_wait_s = [], [], []
    _time_to_first_step(me, env, 1)  # Warm the file cache so the first measured run is not penalised.
    for _ in range(args.repeats):
        plain_s.append(_time_to_first_step(me, env, 1))
        launch_s.append(_time_to_first_step(launch, env, 2))
        no_wait_s.append(_time_to_first_step(launch + ["--no-peer-wait"], env, 2))
    plain, launched, no_wait = (statistics.median(v) for v in (plain_s, launch_s, no_wait_s))
    report = {
        "repeats": args.repeats,
        "plain_single_process_s": [round(v, 2) for v in plain_s],
        "tfdist_launch_2_workers_s": [round(v, 2) for v in launch_s],
        "tfdist_launch_2_workers_without_peer_wait_s": [round(v, 2) for v in no_wait_s],
        "median_plain_s": round(plain, 2),
        "median_tfdist_s": round(launched, 2),
        "median_without_peer_wait_s": round(no_wait, 2),
        "ratio": round(launched / plain, 2),
        "ratio_without_peer_wait": round(no_wait / plain, 2),
        "goal": "ratio < 1.5",
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
