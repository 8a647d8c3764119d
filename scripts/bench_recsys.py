"""Benchmark: recommendation training steps/s with 1 vs 2 ps and 1 vs 2 workers, on this machine.

    .venv/bin/python scripts/bench_recsys.py [--data /tmp/clicks] [--steps 150] [--repeats 2]

Runs scripts/train_recsys.py under tfdist-launch (chief + W workers + P ps) for each topology, alternating
topologies between repeats, and reports the median steps/s after the first epoch plus the planner's bytes
per worker step (embedding rows pulled and pushed vs an all-reduce of the whole tables). Creates the click
logs with scripts/make_synthetic_clicks.py when --data does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOPOLOGIES = ((1, 1), (2, 1), (1, 2), (2, 2))  # (workers, ps)


def run_once(data: str, workers: int, ps: int, steps: int, out: str) -> dict:
    summary = os.path.join(out, f"w{workers}p{ps}.json")
    cmd = [
        sys.executable,
        "-m",
        "tfdist.cli.launch",
        "--chief",
        "--workers",
        str(workers),
        "--ps",
        str(ps),
        "--timeout",
        "600",
        "--",
        sys.executable,
        os.path.join(HERE, "train_recsys.py"),
        "--data",
        data,
        "--epochs",
        "3",
        "--steps-per-epoch",
        str(steps),
        "--cold-weight",
        "1",
        "--summary",
        summary,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"w{workers}p{ps} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    with open(summary, encoding="utf-8") as f:
        return json.load(f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "tfdist-clicks"))
    parser.add_argument("--steps", type=int, default=150, help="steps per epoch (3 epochs; the first is warm-up)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.data, "clicks.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "make_synthetic_clicks.py"), "--out", args.data], check=True)
    out = tempfile.mkdtemp(prefix="bench-recsys-")
    rates: dict[str, list[float]] = {}
    last: dict[str, dict] = {}
    for _ in range(args.repeats):
        for workers, ps in TOPOLOGIES:
            key = f"{workers} workers, {ps} ps"
            last[key] = run_once(args.data, workers, ps, args.steps, out)
            rates.setdefault(key, []).append(round(last[key]["steps_per_s"], 1))
    base = statistics.median(rates["1 workers, 1 ps"])
    rows = [
        {
            "topology": key,
            "steps_per_s": runs,
            "median": statistics.median(runs),
            "ratio_to_1w1p": round(statistics.median(runs) / base, 2),
            "auc": last[key]["auc"],
            "bytes_per_step": last[key]["bytes_per_step"],
        }
        for key, runs in rates.items()
    ]
    sys.stdout.write(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
