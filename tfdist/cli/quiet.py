"""``tfdist quiet -- CMD ...``: run one command with TensorFlow's noise left out of its stderr.

``tfdist-launch`` filters the output of every task it starts (docs/launch.md); this is the same filter for
one process outside the launcher, e.g. a data-preparation script::

    tfdist quiet -- python scripts/make_synthetic_images.py --out data/train --num 8000

The command's stdout is untouched; its stderr passes line by line, except TensorFlow's INFO records and
known start-up messages (``tfdist.launch._tf_logs``). The exit status is the command's (128 + N when a
signal N ends it). ``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Optional

from tfdist.errors import LaunchError, invalid
from tfdist.launch._process import exit_code
from tfdist.launch._tf_logs import NoiseFilter, wants_tf_info

_FORWARDED = (signal.SIGTERM, signal.SIGHUP)  # SIGINT from a terminal reaches the command's group directly.


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("quiet", help="run a command without TensorFlow's start-up noise on stderr",
                                   description="Run CMD with TensorFlow's INFO records and known start-up "
                                   "messages left out of its stderr, as tfdist-launch does for its tasks; real "
                                   "warnings and errors pass. Exits with CMD's status.")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise invalid(LaunchError, "command", [], "a program to run after '--'",
                      "e.g. tfdist quiet -- python prepare.py")
    try:
        proc = subprocess.Popen(command, stdin=None, stdout=None, stderr=subprocess.PIPE)
    except OSError as err:
        raise invalid(LaunchError, "command", command[0], "a program that exists and can be run",
                      f"It cannot be started: {err.strerror or err}. Check the command after '--' and PATH.") \
            from None
    keep: Callable[[str], bool] = (lambda line: True) if wants_tf_info(os.environ) else NoiseFilter()

    def _forward(signum: int, _frame: Optional[FrameType]) -> None:
        proc.send_signal(signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # Signal handlers can only be set there.
        previous = {sig: signal.signal(sig, _forward) for sig in _FORWARDED}
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # The command decides its end.
    binary = getattr(sys.stderr, "buffer", None)
    try:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace")
            if not keep(line.rstrip("\r\n")):
                continue
            if binary is not None:
                binary.write(raw)
            else:  # stderr replaced by a text stream (tests, embedding)
                sys.stderr.write(line)
            sys.stderr.flush()
        return exit_code(proc.wait())
    finally:
        proc.stderr.close()  # type: ignore[union-attr]
        for sig, handler in previous.items():
            signal.signal(sig, handler)
