"""``tfdist index``: build the record index of a TFRecord dataset once, so no worker lists or walks its files.

Example:
    >>> from tfdist.cli.main import parser
    >>> args = parser().parse_args(["index", "/data/train-*", "--out", "/data/train.tfindex"])
    >>> args.patterns, args.out, args.grid
    (['/data/train-*'], '/data/train.tfindex', 256)
"""

from __future__ import annotations

import argparse
import sys
import time

from tfdist.errors import Error
from tfdist.runtime.program import exit_code_for, one_line

PROG = "tfdist index"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build a record index of TFRecord files (counts and byte offsets) for resumable reading at scale",
        description="List the files once, count their records and locate every GRID-th record, and write "
        "it all to one file. A pipeline given that file (files='OUT') reads in the resumable order "
        "without listing the files or walking their headers on any worker.",
    )
    parser.add_argument("patterns", nargs="+", help="globs of TFRecord files (quote them)")
    parser.add_argument("--out", required=True, help="the index file to write (ends in .tfindex)")
    parser.add_argument(
        "--grid",
        type=int,
        default=256,
        help="records between two located records (default 256, the default order_block; use at most "
        "batch_size / order_streams for parameter servers)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tfdist.data.order.index import build_index
    from tfdist.data.records.index import SUFFIX
    from tfdist.errors import DataError, invalid

    start = time.monotonic()
    try:
        if not args.out.endswith(SUFFIX):
            raise invalid(DataError, "--out", args.out, f"a path ending in {SUFFIX}", f"Use {args.out}{SUFFIX}.")
        index = build_index(args.patterns, args.out, grid=args.grid)
    except Error as err:
        sys.stderr.write(f"{PROG}: error: {one_line(str(err))}\n")
        return exit_code_for(err)
    sys.stdout.write(
        f"{index.num_records} records in {len(index.counts)} files (every {index.grid}th located) indexed "
        f"into {args.out} in {time.monotonic() - start:.1f}s\n"
    )
    return 0
