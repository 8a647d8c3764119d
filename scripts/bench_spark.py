"""Benchmark: launch to the first training step of one 2-worker MWMS script on Spark, locally and on Ray.

    pip install -e ".[spark,ray]"          # pyspark 4, Ray 2.60; Java 17 or 21 for Spark
    python scripts/bench_spark.py [--repeats 5] [--variants local,spark-warm]

One driver (this process) times each variant from the call that launches the job to the slower worker's
first finished training step, in alternating order per round so machine noise hits all alike. The job is
scripts/bench_ray.py's child (the same model, data and strategy as the Ray benchmark):
  * plain:       the same model and data in one process without TF_CONFIG (scripts/bench_launch.py's child):
                 one TensorFlow start, the physical floor;
  * local:       tfdist's local engine (run_config with LocalEngine);
  * spark-warm:  the Spark engine on a SparkSession this driver already holds ("once the session exists");
  * ray-warm:    the Ray engine joining a Ray head that is already up (the best other engine);
  * spark-cold:  `tfdist-launch --engine spark --spark-master URL`, a new driver and session per run.
A standalone Spark (scripts/spark_local.py, 4 slots) and a Ray head (4 CPUs) are started on 127.0.0.1 for
the benchmark and stopped after it. Goal: spark-warm within 1.5x of local. Prints medians and ratios as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_ray
import spark_local

SLOTS = 2  # spark.cores.max of each Spark application: the warm session and a cold run's each hold 2 slots


def _first_steps(text: str, started: float, what: str) -> float:
    firsts: dict[int, float] = {}
    for rank, at in re.findall(rf"{bench_ray.MARK} (\d+) ([0-9.]+)", text):
        firsts[int(rank)] = min(firsts.get(int(rank), float("inf")), float(at))
    if sorted(firsts) != [0, 1]:
        raise SystemExit(f"{what}: the workers' first steps were not both seen: {text[-3000:]}")
    return max(firsts.values()) - started


def _engine_run(engine: Callable[[], Any], child: list[str]) -> float:
    from tfdist.launch import LaunchConfig, run_config

    config = LaunchConfig(command=tuple(child), workers=2, timeout=600)
    started = time.time()
    result = run_config(config, engine=engine())
    if result.exit_code != 0:
        raise SystemExit(f"{result.summary()}\n{result.tasks[0].output[-2000:]}")
    return _first_steps("\n".join(task.output for task in result.tasks), started, result.summary())


def _plain(env: dict[str, str]) -> float:
    """bench_launch.py's child (the same model and data) alone, without TF_CONFIG: TF's default strategy."""
    started = time.time()
    child = [sys.executable, os.path.join(HERE, "bench_launch.py"), "--child"]
    done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=600)
    marks = re.findall(rf"{bench_ray.MARK} ([0-9.]+)", done.stdout)
    if done.returncode != 0 or not marks:
        raise SystemExit(f"plain failed ({done.returncode}): {done.stderr[-2000:]}")
    return float(marks[0]) - started


def _cold(master: str, child: list[str], env: dict[str, str]) -> float:
    argv = [sys.executable, "-m", "tfdist.cli.launch", "--engine", "spark", "--spark-master", master]
    argv += ["--spark-conf", f"spark.cores.max={SLOTS}", "--workers", "2", "--timeout", "600", "--", *child]
    started = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"spark-cold failed ({done.returncode}): {done.stderr[-3000:]}")
    return _first_steps(done.stdout, started, "spark-cold")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default="plain,local,spark-warm,ray-warm,spark-cold", metavar="A,B")
    args = parser.parse_args()
    chosen = args.variants.split(",")
    known = ("plain", "local", "spark-warm", "ray-warm", "spark-cold")
    if set(chosen) - set(known):
        parser.error(f"--variants: unknown {sorted(set(chosen) - set(known))}; choose from {', '.join(known)}")
    # The children get this environment; this driver's own Spark and Ray read it too (the launcher's role).
    os.environ.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", SPARK_LOCAL_IP="127.0.0.1")
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "RAY_ADDRESS")}
    child = [sys.executable, os.path.join(HERE, "bench_ray.py"), "--child"]

    from pyspark.sql import SparkSession

    from tfdist.cluster import free_ports
    from tfdist.launch import LocalEngine, RayEngine, SparkEngine

    reason = spark_local.ensure_installed()
    if reason:
        raise SystemExit(reason)
    cluster = spark_local.start(tempfile.mkdtemp(prefix="tfdist-bench-spark-"), cores=2 * SLOTS)
    port = free_ports(1)[0]
    head = bench_ray._ray_head(env, port, 4) if "ray-warm" in chosen else None
    session_s = time.time()
    builder = SparkSession.builder.master(cluster.master).appName("tfdist-bench").config("spark.cores.max", str(SLOTS))
    spark = builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.time() - session_s
    runs: dict[str, Callable[[], float]] = {
        "plain": lambda: _plain(env),
        "local": lambda: _engine_run(LocalEngine, child),
        "spark-warm": lambda: _engine_run(lambda: SparkEngine(spark=spark), child),
        "ray-warm": lambda: _engine_run(lambda: RayEngine(address=f"127.0.0.1:{port}"), child),
        "spark-cold": lambda: _cold(cluster.master, child, env),
    }
    times: dict[str, list[float]] = {name: [] for name in chosen}
    try:
        runs["local"]()  # Warm the file cache so the first measured run is not penalised.
        for round_ in range(args.repeats):
            for name in chosen if round_ % 2 == 0 else list(reversed(chosen)):
                times[name].append(runs[name]())
                sys.stderr.write(f"round {round_}: {name} {times[name][-1]:.2f}s\n")
    finally:
        spark.stop()
        cluster.stop()
        if head is not None:
            bench_ray.stop_head(head)
    median = {name: statistics.median(values) for name, values in times.items()}
    report: dict[str, Any] = {
        "repeats": args.repeats,
        "spark_session_start_s": round(session_s, 2),
        "seconds": {k: [round(v, 2) for v in vs] for k, vs in times.items()},
        "median_s": {k: round(v, 2) for k, v in median.items()},
    }
    for top, bottom in (
        ("spark-warm", "local"),
        ("spark-warm", "ray-warm"),
        ("spark-cold", "local"),
        ("local", "plain"),
    ):
        if top in times and bottom in times:
            key = f"{top}_over_{bottom}".replace("-", "_")
            report[key] = round(median[top] / median[bottom], 2)
            report[key + "_per_round"] = [round(a / b, 2) for a, b in zip(times[top], times[bottom])]
    report["goal"] = "spark_warm_over_local <= 1.5"
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
