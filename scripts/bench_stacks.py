"""Benchmark: the pinned stack (TF 2.17.1) against the newest (TF 2.21.0), side by side in one run.

    python scripts/bench_stacks.py --pinned .venv/bin/python --newest .venv-newest/bin/python \
        [--rounds 3] [--allreduce-rounds 2]

Alternates the two venvs round by round (so machine noise hits both alike) and runs, with each venv's Python
and this checkout first on PYTHONPATH:
  * scripts/bench_launch.py --repeats 1: launch to the first completed step, 2-worker MWMS under tfdist-launch,
    and one plain process;
  * scripts/bench_allreduce.py --repeats 3 --no-gloo: TF's default all-reduce and tfdist's tuned bf16 one
    on 2 workers (4 MB, 64 MB, the ResNet-50 gradient list).
Prints medians per stack and the ratio newest/pinned (> 1: newest is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES = (str(4 << 20), str(64 << 20), "resnet50")


def _run(python: str, script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [python, os.path.join(HERE, script), *args], env=env, capture_output=True, text=True, timeout=1500
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} {script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def _launch(python: str) -> dict[str, float]:
    report = json.loads(_run(python, "bench_launch.py", "--repeats", "1"))
    return {"plain_s": report["median_plain_s"], "tfdist_launch_s": report["median_tfdist_s"]}


def _allreduce(python: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        _run(python, "bench_allreduce.py", "--repeats", "3", "--no-gloo", "--json", path)
        with open(path) as f:
            rows = {row["case"]: row for row in json.load(f)["rows"]}
    out = {}
    for case in CASES:
        out[f"{case} TF default ms"] = rows[case]["tf_default_ms"]
        out[f"{case} tuned bf16 ms"] = rows[case]["tuned_bf16_ms"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pinned", required=True)
    parser.add_argument("--newest", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--allreduce-rounds", type=int, default=2)
    args = parser.parse_args()
    stacks = {"pinned": args.pinned, "newest": args.newest}
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in stacks}
    for round_ in range(max(args.rounds, args.allreduce_rounds)):
        for name, python in stacks.items():
            parts: dict[str, Any] = {}
            if round_ < args.rounds:
                parts.update(_launch(python))
            if round_ < args.allreduce_rounds:
                parts.update(_allreduce(python))
            for key, value in parts.items():
                runs[name].setdefault(key, []).append(value)
            print(f"round {round_ + 1} {name}: {json.dumps(parts)}", file=sys.stderr, flush=True)
    print("| measure | pinned runs | pinned median | newest runs | newest median | newest / pinned |")
    print("|---|---|---|---|---|---|")
    for key in runs["pinned"]:
        p, n = runs["pinned"][key], runs["newest"][key]
        mp, mn = statistics.median(p), statistics.median(n)
        print(
            f"| {key} | {' '.join(f'{v:g}' for v in p)} | {mp:g} | {' '.join(f'{v:g}' for v in n)} | {mn:g} | "
            f"**{mn / mp:.2f}** |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
