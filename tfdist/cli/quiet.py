"""``tfdist quiet -- CMD ...``: run one command with TensorFlow's noise left out of its stderr.

``tfdist-launch`` filters the output of every task it starts (docs/launch.md); this is the same filter for
one process outside the launcher, e.g. a data-preparation script::

    tfdist quiet -- python scripts/make_synthetic_images.py --out data/train --num 8000

The command's stdout is untouched; its stderr passes line by line, except TensorFlow's INFO records and
known start-up messages (``tfdist.launch.output``). The exit status is the command's (128 + N when a
signal N ends it). ``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off.

SIGTERM, SIGHUP and SIGINT sent to ``tfdist quiet`` (``kill -INT``, ``timeout -s INT``, a scheduler) are
passed on to the command, which decides how it ends. A Ctrl-C typed at the terminal already reaches the
command when it runs in the terminal's foreground process group; that SIGINT is not sent a second time (a
second SIGINT would interrupt the command's own clean-up, e.g. a Python ``finally`` or a checkpoint save).
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
from typing import Any

from tfdist.errors import LaunchError, invalid
from tfdist.launch.output import NoiseFilter, wants_tf_info
from tfdist.runtime import exit_codes

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "quiet",
        help="run a command without TensorFlow's start-up noise on stderr",
        description="Run CMD with TensorFlow's INFO records and known start-up "
        "messages left out of its stderr, as tfdist-launch does for its tasks; real "
        "warnings and errors pass. Exits with CMD's status.",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise invalid(
            LaunchError, "command", [], "a program to run after '--'", "e.g. tfdist quiet -- python prepare.py"
        )
    keep: Callable[[str], bool] = (lambda line: True) if wants_tf_info(os.environ) else NoiseFilter()
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []  # Signals that came before the command existed: sent to it once it does.

    def _forward(signum: int, _frame: FrameType | None) -> None:
        if not started:
            early.append(signum)
        elif not (signum == signal.SIGINT and _terminal_reached(started[0].pid)):
            started[0].send_signal(signum)

    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # Signal handlers can only be set there.
        previous = {sig: signal.signal(sig, _forward) for sig in _FORWARDED}
    binary = getattr(sys.stderr, "buffer", None)
    try:
        proc = _start(command)
        started.append(proc)
        for signum in early:
            proc.send_signal(signum)
        assert proc.stderr is not None
        with proc.stderr:
            for raw in iter(proc.stderr.readline, b""):
                line = raw.decode("utf-8", "replace")
                if not keep(line.rstrip("\r\n")):
                    continue
                if binary is not None:
                    binary.write(raw)
                else:  # stderr replaced by a text stream (tests, embedding)
                    sys.stderr.write(line)
                sys.stderr.flush()
        return exit_codes.from_returncode(proc.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    """``command`` started with its stderr piped to this process; LaunchError when it cannot start."""
    try:
        return subprocess.Popen(command, stdin=None, stdout=None, stderr=subprocess.PIPE)
    except OSError as err:
        raise invalid(
            LaunchError,
            "command",
            command[0],
            "a program that exists and can be run",
            f"It cannot be started: {err.strerror or err}. Check the command after '--' and PATH.",
        ) from None


def _terminal_reached(pid: int) -> bool:
    """True when process ``pid`` is in the foreground process group of this process's controlling terminal.

    Then a Ctrl-C typed there was delivered to ``pid`` by the terminal itself. Without a controlling terminal
    (a script, ``timeout``, a scheduler, a new session) or when the command left for a group of its own, it
    was not, and the SIGINT this process got must be passed on.
    """
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(tty) == os.getpgid(pid)
    except OSError:  # The command already ended, or the terminal went away.
        return False
    finally:
        os.close(tty)
