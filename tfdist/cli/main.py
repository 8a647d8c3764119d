"""``tfdist``: the command-line tool. Subcommands register themselves here."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from tfdist.cli import data_report, doctor, index, plan, quiet
from tfdist.runtime import logs, program

_SUBCOMMANDS = (doctor, data_report, index, plan, quiet)
_LOG_LEVEL_HELP = "level of the tfdist logger's lines on stderr (default $TFDIST_LOG_LEVEL, else info)"


def parser() -> program.ArgumentParser:
    """The ``tfdist`` command line, every subcommand registered (the docs' command lines are parsed with it).

    ``--log-level`` is taken before the subcommand and after it (``tfdist doctor --log-level debug``).
    """
    root = program.ArgumentParser(prog="tfdist", description="TensorFlow distributed training tools.")
    root.add_argument("--version", action="version", version=f"%(prog)s {program.version()}")
    root.add_argument("--log-level", choices=logs.LOG_LEVELS, default=None, help=_LOG_LEVEL_HELP)
    subparsers = root.add_subparsers(dest="command", required=True)
    for module in _SUBCOMMANDS:
        module.add_parser(subparsers)
    for sub in subparsers.choices.values():  # SUPPRESS: an absent one leaves the root's value alone.
        sub.add_argument("--log-level", choices=logs.LOG_LEVELS, default=argparse.SUPPRESS, help=_LOG_LEVEL_HELP)
    return root


@program.cli_main("tfdist")
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status.

    tfdist's lines go to stderr at ``--log-level`` (``INFO tfdist.strategy: ...``), other libraries' from
    WARNING up. Every subcommand but ``quiet`` (which filters its command's stderr) runs with TensorFlow's
    start-up noise left out of this process's stderr (:func:`tfdist.cli.quiet.filtered_stderr`).
    """
    args = parser().parse_args(argv)
    logs.configure_cli(logs.cli_level(args.log_level))
    with contextlib.nullcontext() if args.run is quiet.run else quiet.filtered_stderr():
        code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
