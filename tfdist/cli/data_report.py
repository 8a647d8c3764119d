"""``tfdist data-report``: per-worker shares and class mixes of a TFRecord dataset under a sharding policy."""

from __future__ import annotations

import argparse
import json
import sys

from tfdist.cluster.spec import MAX_TASKS_PER_JOB
from tfdist.data.sharding import SHARD_POLICIES
from tfdist.errors import DataError, Error, require_int
from tfdist.runtime.program import exit_code_for, one_line


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "data-report",
        help="per-worker skew report of TFRecord files",
        description="Read every record's label and report what each worker gets under "
        "a sharding policy: records, bytes read, class histograms, imbalance, "
        "divergence from the global class mix, and what to change.",
    )
    parser.add_argument("pattern", help="glob of TFRecord files (quote it)")
    parser.add_argument("--label-key", required=True, help="the label feature (int64)")
    parser.add_argument("--workers", type=int, required=True, help="number of workers")
    parser.add_argument("--shard-policy", choices=SHARD_POLICIES, default="auto")
    parser.add_argument("--shard-key", default=None, help="hashed feature for --shard-policy hash (int64)")
    parser.add_argument("--plot", default=None, metavar="PNG", help="also draw the report (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import os

    from tfdist.data.report import skew_report

    if args.plot:  # Checked first: a report that took minutes should not end in a bad path.
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            sys.stderr.write(
                f"tfdist data-report: error: --plot {args.plot!r}: the directory {folder} does not "
                "exist; create it or choose another path\n"
            )
            return 2
    try:
        require_int(DataError, "--workers", args.workers, minimum=1, maximum=MAX_TASKS_PER_JOB)
        report = skew_report(
            args.pattern,
            label_key=args.label_key,
            num_workers=args.workers,
            shard_policy=args.shard_policy,
            shard_key=args.shard_key,
        )
    except Error as err:
        sys.stderr.write(f"tfdist data-report: error: {one_line(str(err))}\n")
        return exit_code_for(err)  # 2 for bad input, 1 for storage that cannot be read
    sys.stdout.write((json.dumps(report.to_dict(), indent=1) if args.json else report.to_text()) + "\n")
    if args.plot:
        try:
            report.plot(args.plot)
        except ImportError:
            sys.stderr.write("tfdist data-report: --plot needs matplotlib: pip install 'tfdist[bench]'\n")
            return 2
        sys.stderr.write(f"tfdist data-report: plot written to {args.plot}\n")
    return 0
