"""``tfdist data-report``: per-worker shares and class mixes of a TFRecord dataset under a sharding policy."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from tfdist.cluster.spec import MAX_TASKS_PER_JOB
from tfdist.data.sharding import SHARD_POLICIES
from tfdist.errors import DataError, Error, require_int
from tfdist.runtime.program import exit_code_for, one_line

PROG = "tfdist data-report"
CORRUPT_CHOICES = ("raise", "skip")  # The library's on_corrupt values.
# skew_report's arguments and the flags that set them: errors speak in flags.
FLAGS = {
    "label_key": "--label-key",
    "num_workers": "--workers",
    "shard_policy": "--shard-policy",
    "shard_key": "--shard-key",
    "on_corrupt": "--on-corrupt",
    "progress_every": "--progress-every",
}
_PROGRESS_SECONDS = 2.0  # Without --progress-every: a progress line at most this often.


def in_flags(text: str) -> str:
    """``text`` with the arguments it names as their flags: `label_key` -> `--label-key`, on_corrupt='skip' -> --on-corrupt skip.

    Example:
        >>> in_flags("Invalid value for `label_key`. Received: 'lable'. Did you mean label_key='label'?")
        "Invalid value for `--label-key`. Received: 'lable'. Did you mean --label-key label?"
    """
    text = re.sub(r"`([a-z_]+)`", lambda m: f"`{FLAGS.get(m.group(1), m.group(1))}`", text)
    return re.sub(
        r"\b([a-z_]+)='([^']*)'",
        lambda m: f"{FLAGS[m.group(1)]} {m.group(2)}" if m.group(1) in FLAGS else m.group(0),
        text,
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "data-report",
        help="per-worker skew report of TFRecord files",
        description="Read every record's label and report what each worker gets under "
        "a sharding policy: records, bytes read, class histograms, imbalance, "
        "divergence from the global class mix, and what to change.",
    )
    parser.add_argument("pattern", help="glob of TFRecord files (quote it)")
    parser.add_argument("--label-key", required=True, help="the label feature (int64, float or bytes)")
    parser.add_argument("--workers", type=int, required=True, help="number of workers")
    parser.add_argument("--shard-policy", choices=SHARD_POLICIES, default="auto")
    parser.add_argument("--shard-key", default=None, help="hashed feature for --shard-policy hash (int64)")
    parser.add_argument(
        "--on-corrupt",
        choices=CORRUPT_CHOICES,
        default="raise",
        help="a damaged file: 'raise' an error naming it (default), or 'skip' its damaged part and report it",
    )
    parser.add_argument(
        "--plot", default=None, metavar="PNG", help="also draw the report (needs matplotlib: the plot extra)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on stderr while scanning (default: when stderr is a terminal)",
    )
    parser.add_argument(
        "--progress-every",
        type=int,
        default=None,
        metavar="N",
        help=f"a progress line every N records (default: every {_PROGRESS_SECONDS:g} s)",
    )
    parser.set_defaults(run=run)


class _Progress:
    """Writes the scan's progress to stderr: every ScanProgress call (``--progress-every``) or every 2 s."""

    def __init__(self, every_call: bool) -> None:
        self.every_call = every_call
        self.last = time.monotonic()

    def __call__(self, state: Any) -> None:
        if state.done:
            sys.stderr.write(
                f"{PROG}: scanned {state.records:,} records in {state.files} file(s) ({state.seconds:.1f} s)\n"
            )
            return
        if not self.every_call and time.monotonic() - self.last < _PROGRESS_SECONDS:
            return
        self.last = time.monotonic()
        of = f" of {state.total:,}" if state.total else ""
        sys.stderr.write(
            f"{PROG}: scanned {state.records:,}{of} records, worker {state.worker + 1} of {state.workers}, "
            f"{state.files} file(s) opened ({state.seconds:.1f} s)\n"
        )
        sys.stderr.flush()


def _usage_error(text: str) -> int:
    sys.stderr.write(f"{PROG}: error: {one_line(text)}\n")
    return 2


def run(args: argparse.Namespace) -> int:
    import importlib.util
    import os

    from tfdist.data.report import skew_report

    if args.plot:  # Checked first: a report that took minutes should not end in a bad path.
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            return _usage_error(
                f"--plot {args.plot!r}: the directory {folder} does not exist; create it or choose another path"
            )
        if importlib.util.find_spec("matplotlib") is None:
            from tfdist.data._report_plot import INSTALL

            return _usage_error(f"--plot needs matplotlib, which is not installed: {INSTALL}")
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    if args.progress_every is not None:
        show = args.progress is not False  # --progress-every asks for progress unless --no-progress says not.
    try:
        require_int(DataError, "--workers", args.workers, minimum=1, maximum=MAX_TASKS_PER_JOB)
        if args.progress_every is not None:
            require_int(DataError, "--progress-every", args.progress_every, minimum=1)
        report = skew_report(
            args.pattern,
            label_key=args.label_key,
            num_workers=args.workers,
            shard_policy=args.shard_policy,
            shard_key=args.shard_key,
            on_corrupt=args.on_corrupt,
            progress=_Progress(every_call=args.progress_every is not None) if show else None,
            **({"progress_every": args.progress_every} if args.progress_every is not None else {}),
        )
    except Error as err:
        sys.stderr.write(f"{PROG}: error: {one_line(in_flags(str(err)))}\n")
        return exit_code_for(err)  # 2 for bad input, 1 for storage that cannot be read
    sys.stdout.write((json.dumps(report.to_dict(), indent=1) if args.json else report.to_text()) + "\n")
    if args.plot:
        try:
            report.plot(args.plot)
        except Error as err:
            sys.stderr.write(f"{PROG}: error: {one_line(str(err))}\n")
            return exit_code_for(err)
        sys.stderr.write(f"{PROG}: plot written to {args.plot}\n")
    return 0
