"""What every tfdist command line shares: one-line errors, exit codes, and a closed pipe that is not a crash.

Bad input ends a command with exit 2 and exactly one line on stderr, never a
traceback. An environment failure (:class:`tfdist.errors.RuntimeFailure`)
ends it with exit 1 and one line. A reader that closes the pipe early
(``tfdist doctor | head -1``) ends it quietly, like any Unix filter.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.metadata
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from tfdist.errors import Error
from tfdist.runtime import exit_codes

EXIT_FAILURE, EXIT_USAGE = exit_codes.FAILED, exit_codes.BAD_CONFIG
EXIT_PIPE = exit_codes.from_signal(signal.SIGPIPE)  # What a shell reports for a filter killed by SIGPIPE.


class Main(Protocol):
    """A program's ``main(argv=None) -> exit code``."""

    def __call__(self, argv: Sequence[str] | None = None, /) -> int: ...


def version() -> str:
    """The installed tfdist's version, for ``--version`` (the distribution's metadata: setup.cfg's ``version``)."""
    try:
        return importlib.metadata.version("tfdist")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source tree)"


def one_line(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped, so it prints as one line.

    Example:
        >>> one_line("bad value 'a\\nb\\udcff'")
        "bad value 'a\\\\nb\\\\udcff'"
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (``PROG: error: MESSAGE``) and exit 2.

    A mistyped flag or subcommand gets a "did you mean", an unknown argument
    is reported by the subcommand it was given to (``tfdist plan: error:``),
    and ``takes_command=True`` (``PROG [options] -- CMD``) adds the hint a forgotten ``--`` needs.

    Example:
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--workers")
        >>> parser.suggest("unrecognized arguments: --workrs 3")
        'unrecognized arguments: --workrs 3 (did you mean --workers?)'
    """

    def __init__(self, *args: Any, takes_command: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.takes_command = takes_command

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        chosen = self._chosen_subparser(parsed)
        if extras and chosen is not None:
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")  # Named by the subcommand it went to.
        return parsed, extras

    def _chosen_subparser(self, parsed: argparse.Namespace) -> ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest != argparse.SUPPRESS:
                sub = action.choices.get(str(getattr(parsed, action.dest, "") or ""))
                return sub if isinstance(sub, ArgumentParser) else None
        return None

    def suggest(self, message: str) -> str:
        """``message`` with the nearest flag or choice for each one mistyped, and a hint for a missing ``--``."""
        hints = []
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            options = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
            tokens = unknown.group(1).split()
            for token in tokens:
                near = difflib.get_close_matches(token.split("=", 1)[0], options, n=1, cutoff=0.6)
                if token.startswith("--") and near:
                    hints.append(f"did you mean {near[0]}?")
            if self.takes_command and tokens and not tokens[0].startswith("-"):
                hints.append(f"put -- before the program: {self.prog} [options] -- {' '.join(tokens)}")
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            choices = re.findall(r"'([^']*)'", choice.group(2)) or [c.strip() for c in choice.group(2).split(",")]
            near = difflib.get_close_matches(choice.group(1), choices, n=1, cutoff=0.6)
            if near:
                hints.append(f"did you mean {near[0]}?")
        return message + "".join(f" ({hint})" for hint in hints)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(self.suggest(message))} (see {self.prog} --help)\n")


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """A command line's own flags and the program after ``--`` (empty without one).

    Example:
        >>> split_command(["--mesh", "model=2", "--", "python", "train.py", "--", "x"])
        (['--mesh', 'model=2'], ['python', 'train.py', '--', 'x'])
    """
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def finite_float(text: str) -> float:
    """argparse ``type=`` for a finite number (refuses nan and inf, which ``float`` accepts).

    Example:
        >>> finite_float("2.5")
        2.5
    """
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


finite_float.__name__ = "finite number"  # argparse names the type in its message.


def port_number(text: str) -> int:
    """argparse ``type=`` for a TCP port, 0 (pick a free one) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(text)
    return value


port_number.__name__ = "port (0-65535)"


def _silence_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def cli_main(prog: str) -> Callable[[Main], Main]:
    """Decorates a ``main(argv) -> int`` so tfdist errors, Ctrl-C and closed pipes end it in one line.

    Args:
      prog: The command's name in messages, e.g. ``"tfdist-launch"``.

    Example:
        >>> from tfdist import LaunchError
        >>> @cli_main("demo")
        ... def main(argv=None):
        ...     raise LaunchError("Invalid value for `--workers`. Received: -1.")
        >>> import contextlib, io
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err):
        ...     main([])
        2
        >>> err.getvalue()
        'demo: error: Invalid value for `--workers`. Received: -1.\\n'
    """

    def decorate(main: Main) -> Main:
        @functools.wraps(main)
        def wrapper(argv: Sequence[str] | None = None) -> int:
            try:
                code = main(argv)
                sys.stdout.flush()  # A closed pipe shows here when stdout is block-buffered, not at exit.
                return code
            except SystemExit as exc:  # argparse's usage errors and --help: a status, as main's own returns are.
                if exc.code is None or isinstance(exc.code, int):
                    return exc.code or 0
                raise
            except BrokenPipeError:
                _silence_stdout()
                return EXIT_PIPE
            except KeyboardInterrupt:
                sys.stderr.write(f"{prog}: interrupted\n")
                return exit_codes.from_signal(signal.SIGINT)
            except Error as err:
                sys.stderr.write(f"{prog}: error: {one_line(str(err))}\n")
                return exit_code_for(err)

        return wrapper

    return decorate


def exit_code_for(err: Error) -> int:
    """A CLI's exit status for a tfdist error: 2 for bad input (not worth retrying), 1 for a runtime failure.

    The rule is :func:`tfdist.runtime.exit_codes.from_exception`, the one every task ends by.

    Example:
        >>> from tfdist import EngineError, LaunchError
        >>> exit_code_for(LaunchError("bad")), exit_code_for(EngineError("no Ray"))
        (2, 1)
    """
    return exit_codes.from_exception(err)
