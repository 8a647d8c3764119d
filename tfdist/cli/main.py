"""``tfdist``: the command-line tool. Subcommands register themselves here."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from tfdist.cli import data_report, doctor, plan, quiet
from tfdist.runtime import program as _common

_SUBCOMMANDS = (doctor, data_report, plan, quiet)


def parser() -> _common.ArgumentParser:
    """The ``tfdist`` command line, every subcommand registered (the docs' command lines are parsed with it)."""
    root = _common.ArgumentParser(prog="tfdist", description="TensorFlow distributed training tools.")
    root.add_argument("--version", action="version", version=f"%(prog)s {_common.version()}")
    subparsers = root.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(subparsers)
    return root


@_common.cli_main("tfdist")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
