"""Benchmark: elastic recovery time against a cold start, 3 -> 2 -> 3 workers, MWMS on the local engine.

    python scripts/bench_elastic.py [--repeats 3]

Each round runs, alternating in one session so machine noise hits both alike, (a) a cold `tfdist.launch.run`
of tests/support/elastic_keras_train.py on 3 workers (launch to the leader's first training step) and (b) the same
script with `min_workers=2`, `--lose worker:2@after=^EPOCH 1 ` and `--return worker:2@after=^EPOCH 2 `:

  * loss: the launcher's 'elastic: losing worker:2' line -> the 2-worker group's first training step;
  * return: the launcher's 'worker:2 is available again' line -> the 3-worker group's first step. The
    group grows at the next epoch boundary after the return, so this includes the rest of one epoch of
    the 2-worker group (the training it does while it waits);
  * regroup: the 'membership 2' line (that boundary) -> the 3-worker group's first step: the restart.

A cold start of 2 workers (the smaller group's size) runs too, for comparison, and the launcher's own share
of each recovery (from the mark to the last task of the new group started: stopping and reaping the old
group, port checks, spawning) is reported as `launcher_loss` and `launcher_regroup`.

Prints every sample, the medians and each as a ratio to the cold start, as JSON. Goal (#16): <= 1.5x.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tfdist import launch

SCRIPT = str(Path(__file__).resolve().parent.parent / "tests" / "elastic_keras_train.py")
FIRST = re.compile(r"^FIRST_STEP generation (\d+) at ([\d.]+)$")
STATUS_MARKS = (
    ("elastic: losing worker:2", "lost"),
    ("elastic: worker:2 is available again", "returned"),
    ("elastic: membership 2:", "regrouped"),
)


def _run(kind: str) -> dict[str, float]:
    elastic, workers, epochs = kind == "elastic", 2 if kind == "cold2" else 3, 6 if kind == "elastic" else 1
    marks: dict[str, float] = {}
    starts: list[float] = []

    def on_line(task: str, line: str) -> None:
        match = FIRST.match(line)
        if match:
            marks.setdefault(f"step{match.group(1)}", float(match.group(2)))

    def on_status(message: str) -> None:
        now = time.time()
        for prefix, mark in STATUS_MARKS:
            if message.startswith(prefix):
                marks.setdefault(mark, now)
        if " started (command" in message:
            starts.append(now)

    options: dict[str, Any] = (
        dict(min_workers=2, loses=["worker:2@after=^EPOCH 1 "], returns=["worker:2@after=^EPOCH 2 "]) if elastic else {}
    )
    with tempfile.TemporaryDirectory() as work:
        start = time.time()
        result = launch.run(
            [sys.executable, SCRIPT, work, str(epochs)],
            workers=workers,
            timeout=900,
            grace_seconds=2,
            on_line=on_line,
            on_status=on_status,
            **options,
        )
    if result.exit_code != 0:
        raise SystemExit(result.summary())
    if not elastic:
        return {kind: marks["step0"] - start}

    def launcher(mark: str, step: str) -> float:
        return max(t for t in starts if marks[mark] <= t <= marks[step]) - marks[mark]

    return {
        "loss": marks["step1"] - marks["lost"],
        "return": marks["step2"] - marks["returned"],
        "regroup": marks["step2"] - marks["regrouped"],
        "launcher_loss": launcher("lost", "step1"),
        "launcher_regroup": launcher("regrouped", "step2"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {
        k: [] for k in ("cold", "cold2", "loss", "return", "regroup", "launcher_loss", "launcher_regroup")
    }
    for round_ in range(args.repeats):
        kinds = ("cold", "cold2", "elastic")
        for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
            for key, value in _run(kind).items():
                samples[key].append(round(value, 2))
        sys.stderr.write(json.dumps(samples) + "\n")
    medians = {k: statistics.median(v) for k, v in samples.items()}
    cold = medians["cold"]
    sys.stdout.write(
        json.dumps(
            {
                "median_seconds": {k: round(v, 2) for k, v in medians.items()},
                "ratio_to_cold": {k: round(v / cold, 2) for k, v in medians.items()},
                "loss_vs_cold2": round(medians["loss"] / medians["cold2"], 2),
                "samples": samples,
            },
            indent=1,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
