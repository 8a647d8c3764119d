"""Prints the demo's summary table and draws its picture, from the summary.json of each of its runs.

    python scripts/demo_report.py demo-out                      # natural, sqrt, balanced; writes demo-out/demo.png
    python scripts/demo_report.py demo-out natural balanced     # those run directories only

scripts/run_demo.sh runs it last. Every number comes from the summaries that scripts/demo.py wrote: the
per-class validation accuracy as mean ± standard deviation over the seeds, and what ran (strategy,
workers, the records each worker trained on per epoch and the distinct records an epoch trained, both
counted in the train step). The picture shows
the training set's class counts (log scale) above each run's per-class accuracy: bars are the mean
over seeds, whiskers the lowest and highest seed, dots the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

RUNS = ("natural", "sqrt", "balanced")  # scripts/run_demo.sh's runs: natural sampling, then two stratified mixes.


def _pm(spread: dict[str, float]) -> str:
    return f"{spread['mean']:.3f} ± {spread['std']:.3f}"


def _name(summary: dict[str, Any]) -> str:
    """'natural', or 'stratified (MIX)'."""
    return "natural" if summary["sampling"] == "natural" else f"stratified ({summary['class_weights']})"


def _records(summary: dict[str, Any]) -> str:
    low, high = summary["records_per_worker_epoch"]["min"], summary["records_per_worker_epoch"]["max"]
    return ", ".join(
        f"worker {w} {lo}" if lo == hi else f"worker {w} {lo}-{hi}" for w, (lo, hi) in enumerate(zip(low, high))
    )


def _span(values: Any) -> str:
    """'LOW-HIGH', or the one value."""
    values = list(values)
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _classes(summary: dict[str, Any]) -> list[str]:
    """The classes in numeric order (2 before 10), then the others as text."""
    return sorted(
        summary["train_class_counts"], key=lambda c: (0, int(c), "") if c.lstrip("-").isdigit() else (1, 0, c)
    )


def table(runs: list[dict[str, Any]], picture: str | None) -> str:
    """The summary as text: what ran, then per-class accuracy of every run (mean ± std over seeds)."""
    a = runs[0]
    counts = a["train_class_counts"]
    order = _classes(a)
    seeds = ", ".join(str(s) for s in a["seeds"])
    lines = [
        "== tfdist demo summary",
        f"data: {a['train_records']} training records in {len(counts)} classes ("
        + ", ".join(f"{c}: {counts[c]}" for c in order)
        + f"), {a['val_records']} validation records",
        f"ran, per column: {a['strategy']}, {a['workers']} training workers; seeds {seeds}, each "
        f"{a['epochs']} epochs x {a['steps_per_epoch']} steps of {a['global_batch']} records",
    ]
    for run in runs:
        name = _name(run)
        built = "; ".join(
            re.sub(r", mix \{[^}]*\}", "", line) for line in run["input_pipelines"]
        )  # The mix is the name.
        lines.append(f"{name}: the chief's log of the train input: {built or '-'}")
        lines.append(f"{name}: records each worker trained on per epoch (counted in the train step): {_records(run)}")
        epochs = [epoch for seed_run in run["runs"] for epoch in seed_run.get("distinct_records", [])]
        if epochs:  # [distinct, trained] per epoch of every seed
            lines.append(
                f"{name}: distinct records trained per epoch (counted in the train step): "
                f"{_span(e[0] for e in epochs)}, of {_span(e[1] for e in epochs)} trained"
            )
    cell = 24
    lines.append(f"{'':22}" + "".join(f"{_name(run):>{cell}}" for run in runs))
    lines.append(f"{'examples/s':22}" + "".join(f"{run['examples_per_s']:>{cell}}" for run in runs))
    lines.append(f"{'val accuracy':22}" + "".join(f"{_pm(run['val_accuracy']):>{cell}}" for run in runs))
    for c in order:
        label = f"class {c} ({counts[c]} train)"
        lines.append(f"{label:22}" + "".join(f"{_pm(run['per_class_accuracy'][c]):>{cell}}" for run in runs))
    lines.append(f"{'worst class':22}" + "".join(f"{_pm(run['worst_class_accuracy']):>{cell}}" for run in runs))
    lines.append(f"mean ± standard deviation over {len(a['seeds'])} seed(s)")
    if picture:
        lines.append(f"picture: {picture}")
    return "\n".join(lines)


def draw(runs: list[dict[str, Any]], path: str) -> None:
    """Writes the picture: class counts (log) above per-class accuracy with the seeds' spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    a = runs[0]
    counts = a["train_class_counts"]
    order = _classes(a)
    x = np.arange(len(order))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [1, 2.4]}, constrained_layout=True
    )
    top.bar(x, [counts[c] for c in order], color="0.6")
    top.set_yscale("log")
    top.set_ylabel("training records")
    top.set_title(
        f"{a['strategy']}, {a['workers']} workers, {len(a['seeds'])} seeds x {a['epochs']} epochs: "
        "per-class validation accuracy"
    )
    width = 0.8 / len(runs)
    colours = ("tab:orange", "tab:blue", "tab:green", "tab:purple", "tab:red")
    for i, run in enumerate(runs):
        offset = (i - (len(runs) - 1) / 2) * width
        spread = [run["per_class_accuracy"][c] for c in order]
        mean = np.array([s["mean"] for s in spread])
        low = mean - np.array([s["min"] for s in spread])
        high = np.array([s["max"] for s in spread]) - mean
        colour = colours[i % len(colours)]
        bottom.bar(x + offset, mean, width, color=colour, label=_name(run), yerr=[low, high], capsize=2)
        for seed_run in run["runs"]:
            seeds = [seed_run["per_class_accuracy"][c] for c in order]
            bottom.plot(x + offset, seeds, "o", color="black", markersize=2.5, alpha=0.6)
    bottom.set_ylim(0, 1.14)
    bottom.set_yticks(np.linspace(0, 1, 6))
    bottom.set_ylabel("validation accuracy")
    bottom.set_xlabel("class (bars: mean over seeds; whiskers: lowest and highest seed; dots: seeds)")
    bottom.set_xticks(x, order)
    bottom.legend(loc="upper center", ncol=len(runs), frameon=False)
    bottom.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the demo's --out directory")
    parser.add_argument("runs", nargs="*", default=RUNS, help=f"its run directories, in columns (default {RUNS})")
    parser.add_argument("--no-picture", action="store_true", help="print the table only")
    args = parser.parse_args()
    runs = []
    for name in args.runs:
        with open(os.path.join(args.out, name, "summary.json")) as f:
            runs.append(json.load(f))
    picture = None if args.no_picture else os.path.join(args.out, "demo.png")
    if picture:
        draw(runs, picture)
    sys.stdout.write(table(runs, picture) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
