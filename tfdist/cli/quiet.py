"""``tfdist quiet -- CMD ...``: run one command with TensorFlow's noise left out of its stderr.

``tfdist-launch`` filters the output of every task it starts (docs/launch.md); this is the same filter for
one process outside the launcher, e.g. a data-preparation script::

    tfdist quiet -- python scripts/make_synthetic_images.py --out data/train --num 8000

The command's stdout is untouched; its stderr passes line by line, except TensorFlow's INFO records and
known start-up messages (``tfdist.launch.output``). The exit status is the command's (128 + N when a
signal N ends it). ``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off.

tfdist's own commands that import TensorFlow in their own process (``tfdist doctor --stack``, ``tfdist
data-report``) run with the same filter on that process's stderr: :func:`filtered_stderr`.

SIGTERM, SIGHUP and SIGINT sent to ``tfdist quiet`` (``kill -INT``, ``timeout -s INT``, a scheduler) are
passed on to the command, which decides how it ends. A Ctrl-C typed at the terminal already reaches the
command when it runs in the terminal's foreground process group; that SIGINT is not sent a second time (a
second SIGINT would interrupt the command's own clean-up, e.g. a Python ``finally`` or a checkpoint save).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from tfdist.errors import LaunchError, invalid
from tfdist.launch.output import NoiseFilter, read_lines, wants_tf_info
from tfdist.runtime import exit_codes

_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_DRAIN_SECONDS = 5.0  # At the end of filtered_stderr: how long the last lines may take to pass.


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
            for line in read_lines(proc.stderr):
                if not keep(line.rstrip("\r")):
                    continue
                if binary is not None:
                    binary.write(_as_written(line))
                else:  # stderr replaced by a text stream (tests, embedding)
                    sys.stderr.write(line if line.endswith("\r") else line + "\n")
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


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Within: TensorFlow's INFO records and start-up messages are left out of this process's stderr.

    For a tfdist command that imports TensorFlow in its own process. TensorFlow's C++ code writes to file
    descriptor 2 itself, so fd 2 is pointed at a pipe. A forked filter process reads it, drops TF's noise
    line by line (:class:`~tfdist.launch.output.NoiseFilter`) and writes the rest, in order, to the real
    stderr; it ignores Ctrl-C and ends when every writer is gone, so the last lines of a process that
    crashes (a TF ``F`` record and ``abort()``) still pass. At the end fd 2 is put back. Python's
    ``sys.stderr`` writes into the same pipe (one order for every line) and ``isatty()`` still tells a
    terminal. Only when the command runs as its own process (``sys.stderr`` is the process's, not a test's
    replacement). ``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off.
    """
    python_stderr = sys.stderr
    if wants_tf_info(os.environ) or not _is_process_stderr(python_stderr) or not hasattr(os, "fork"):
        yield
        return
    # The filter must never take Ctrl-C (or the group's SIGTERM) meant for the command: blocked before the
    # fork, so that a signal sent to the process group right after it cannot reach the filter before it
    # blocks them itself (it would die and take the last lines with it). The parent unblocks at once.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED + (signal.SIGQUIT,))
    try:
        python_stderr.flush()
        real = os.dup(2)
        read_end, write_end = os.pipe()
        pid = os.fork()
    except OSError:  # No fd 2 (a daemon), no fds or processes left: nothing is filtered.
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield
        return
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    else:  # pragma: no cover - the filter process, signals still blocked
        try:
            _close_all_but(read_end, 2)
            _forward(read_end, 2)
        finally:
            os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    sys.stderr = _TerminalAware(python_stderr, real)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        sys.stderr = python_stderr
        os.dup2(real, 2)  # Closes the pipe's last write end (unless a child still holds it): the filter ends.
        os.close(real)
        _reap(pid, _DRAIN_SECONDS)


class _TerminalAware(io.TextIOWrapper):
    """``sys.stderr`` while fd 2 is the filter's pipe: writes there, and says whether the real stderr is a tty."""

    def __init__(self, like: Any, real: int) -> None:
        super().__init__(
            io.FileIO(2, "w", closefd=False), encoding=like.encoding, errors=like.errors, line_buffering=True
        )
        self._real = real

    def isatty(self) -> bool:
        return os.isatty(self._real)


def _is_process_stderr(stream: object) -> bool:
    """True when ``stream`` is Python's own stderr on fd 2 (not a test's or an embedding's replacement)."""
    try:
        return stream is sys.__stderr__ and stream.fileno() == 2  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        return False


def _close_all_but(*keep: int) -> None:
    """In the filter process: no other descriptor (a pipe someone waits on) stays open because of it."""
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def _reap(pid: int, timeout: float) -> None:
    """Waits up to ``timeout`` s for the filter process (a child of the command may still hold the pipe)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                time.sleep(0.01)
                continue
        return


def _as_written(line: str) -> bytes:
    """A line of :func:`read_lines` as bytes for a terminal: a progress update keeps its ``\\r``, others get ``\\n``."""
    return (line if line.endswith("\r") else line + "\n").encode("utf-8", "replace")


def _forward(read_end: int, out: int) -> None:
    """Reads the pipe and writes every line (or update ended by ``\\r``) the filter keeps to ``out``."""
    keep = NoiseFilter()
    broken = False  # The real stderr went away: the pipe is still read to its end, so no writer blocks.
    with open(read_end, "rb", buffering=0, closefd=False) as pipe:
        for line in read_lines(pipe):
            if broken or not keep(line.rstrip("\r")):
                continue
            view = memoryview(_as_written(line))
            try:
                while view:
                    view = view[os.write(out, view) :]
            except OSError:
                broken = True
