"""Benchmark: launch to the first training step of one 2-worker MWMS script on three engines.

    pip install -e ".[ray,bench]"      # Ray 2.60 (+ ray[train] and pyarrow<26 for Ray Train)
    python scripts/bench_ray.py [--repeats 3] [--num-cpus 4] [--variants local,tfdist-ray-warm]

Each round runs, in alternating order so machine noise hits all alike:
  * local:        `tfdist-launch --workers 2 -- python bench_ray.py --child` (processes on this machine);
  * tfdist-ray:   the same with `--engine ray` (starts a local Ray for the run, shuts it down);
  * ray-train:    Ray Train's TensorflowTrainer (2 workers) running the same training function in a fresh
                  driver that starts its own local Ray, as a Ray Train user does;
  * tfdist-ray-warm / ray-train-warm: the same two joining a Ray that is already up ("once Ray is up").
Every variant trains the same model with the same data under MultiWorkerMirroredStrategy; each worker prints
the wall-clock time its first training step ended, and a run counts until the slower worker's first step.
Goals: tfdist-ray <= ray-train, and tfdist-ray-warm <= 1.5x local. Prints medians and ratios as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

MARK = "FIRST_STEP_AT"
HERE = os.path.abspath(__file__)


def train(config: dict[str, Any], strategy: Any = None) -> None:
    """The training function every variant runs (tfdist passes its strategy; under Ray Train it makes its own).

    Ray Train V2 passes ``train_loop_config`` only to a function whose one parameter has no default, so
    ``config`` is required (with a default it was called without it, and the workers' marks never reached
    the file: their printed marks stay in Ray's worker logs, which a driver with log_to_driver=False never
    sees).
    """
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    strategy = strategy or tf.distribute.MultiWorkerMirroredStrategy()
    x = np.random.default_rng(0).normal(size=(2048, 32)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(64).with_options(options)
    with strategy.scope():
        model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    marked: list[float] = []

    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]  # tfdist and Ray Train both write TF_CONFIG

    def _mark(batch: int, logs: object) -> None:
        if not marked:
            marked.append(time.time())
            sys.stdout.write(f"{MARK} {rank} {marked[0]:.6f}\n")
            sys.stdout.flush()
            if config.get("marks"):
                with open(config["marks"], "a") as f:
                    f.write(f"{MARK} {rank} {marked[0]:.6f}\n")

    model.fit(
        dataset,
        epochs=1,
        steps_per_epoch=4,
        verbose=0,
        callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=_mark)],
    )


def ray_train_driver(address: str, marks: str, num_cpus: int) -> int:
    """A Ray Train user's driver: TensorflowTrainer with 2 workers on the given (or a new local) Ray."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    if address == "local":  # The same logical CPUs as tfdist's local Ray gets (--ray-num-cpus) and the warm head.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    trainer = TensorflowTrainer(
        train,
        train_loop_config={"marks": marks},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=os.path.dirname(marks), name=f"bench-{os.getpid()}-{time.time_ns()}"),
    )
    trainer.fit()
    ray.shutdown()
    return 0


def _run(argv: list[str], env: dict[str, str], marks: str) -> float:
    if os.path.exists(marks):
        os.remove(marks)
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    text = done.stdout + (open(marks).read() if os.path.exists(marks) else "")
    found: dict[int, list[float]] = {}
    for rank, at in re.findall(rf"{MARK} (\d+) ([0-9.]+)", text):
        found.setdefault(int(rank), []).append(float(at))
    firsts = {rank: min(ats) for rank, ats in found.items()}
    if done.returncode != 0 or sorted(firsts) != [0, 1]:
        raise SystemExit(
            f"{argv[:6]} failed ({done.returncode}), marks {found}: {done.stdout[-2000:]} {done.stderr[-3000:]}"
        )
    return max(firsts.values()) - start


def _ray_head(env: dict[str, str], port: int, num_cpus: int) -> subprocess.Popen:
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--num-cpus={num_cpus}",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    from tfdist.cluster import can_connect

    if not can_connect(f"127.0.0.1:{port}", timeout=120):
        raise SystemExit("ray start --head did not come up")
    time.sleep(2)
    return head


def stop_head(head: subprocess.Popen) -> None:
    """Stops a head from :func:`_ray_head`: SIGTERM (its daemons follow), SIGKILL to its session after 30 s."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ray-train", nargs=2, metavar=("ADDRESS", "MARKS"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--num-cpus",
        type=int,
        default=4,
        help="logical CPUs of every Ray (tfdist's own, Ray Train's own, the warm head); 4 holds "
        "2 workers plus Ray Train's controller",
    )
    parser.add_argument(
        "--variants",
        default=None,
        metavar="A,B",
        help="run only these variants (default: all five); e.g. local,tfdist-ray-warm for a quick "
        "look at the once-Ray-is-up ratio",
    )
    args = parser.parse_args()
    if args.child:
        import tfdist

        strategy = tfdist.build_strategy("auto", communication="ring")  # What a tfdist script does first.
        train({}, strategy)
        return 0
    if args.ray_train:
        address, marks = args.ray_train
        return ray_train_driver(address, marks, args.num_cpus)
    from tfdist.cluster import free_ports

    tmp = os.path.join("/tmp", f"tfdist-bench-ray-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    marks = os.path.join(tmp, "marks")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "RAY_ADDRESS")}
    env.update(
        TF_USE_LEGACY_KERAS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_AUTH_MODE="disabled",
        RAY_TRAIN_V2_ENABLED=env.get("RAY_TRAIN_V2_ENABLED", "1"),
    )
    child = [sys.executable, HERE, "--child"]
    launch = [sys.executable, "-m", "tfdist.cli.launch", "--workers", "2", "--timeout", "600"]
    port = free_ports(1)[0]
    warm = f"127.0.0.1:{port}"
    variants = {
        "local": launch + ["--"] + child,
        "tfdist-ray": launch + ["--engine", "ray", "--ray-num-cpus", str(args.num_cpus), "--"] + child,
        "ray-train": [sys.executable, HERE, "--ray-train", "local", marks, "--num-cpus", str(args.num_cpus)],
        "tfdist-ray-warm": launch + ["--engine", "ray", "--ray-address", warm, "--"] + child,
        "ray-train-warm": [sys.executable, HERE, "--ray-train", warm, marks],
    }
    if args.variants:
        chosen = args.variants.split(",")
        unknown = sorted(set(chosen) - set(variants))
        if unknown:
            parser.error(f"--variants: unknown {unknown}; choose from {sorted(variants)}")
        variants = {name: variants[name] for name in chosen}
    times: dict[str, list[float]] = {name: [] for name in variants}
    head = _ray_head(env, port, args.num_cpus)
    try:
        _run(launch + ["--"] + child, env, marks)  # Warm the file cache so the first measured run is not penalised.
        for round_ in range(args.repeats):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                times[name].append(_run(variants[name], env, marks))
                sys.stderr.write(f"round {round_}: {name} {times[name][-1]:.2f}s\n")
    finally:
        stop_head(head)
    median = {name: statistics.median(values) for name, values in times.items()}
    report: dict[str, Any] = {
        "repeats": args.repeats,
        "num_cpus": args.num_cpus,
        "seconds": {k: [round(v, 2) for v in vs] for k, vs in times.items()},
        "median_s": {k: round(v, 2) for k, v in median.items()},
    }
    ratios = {
        "tfdist_ray_over_ray_train": ("tfdist-ray", "ray-train"),
        "tfdist_ray_warm_over_ray_train_warm": ("tfdist-ray-warm", "ray-train-warm"),
        "tfdist_ray_warm_over_local": ("tfdist-ray-warm", "local"),
        "tfdist_ray_cold_over_local": ("tfdist-ray", "local"),
    }
    for key, (top, bottom) in ratios.items():
        if top in times and bottom in times:
            report[key] = round(median[top] / median[bottom], 2)
            report[key + "_per_round"] = [round(a / b, 2) for a, b in zip(times[top], times[bottom])]
    report["goals"] = "tfdist_ray_over_ray_train <= 1; tfdist_ray_warm_over_local <= 1.5"
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
