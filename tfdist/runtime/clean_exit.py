"""End a process with the right exit code when native code would abort at exit.

After any S3 access, tensorflow-io's file system aborts the process during
interpreter teardown ("pure virtual method called", exit 134; upstream
tensorflow/io#2039). A job scheduler then marks a successful training job as
failed. :func:`exit_cleanly` is the opt-in fix: it runs ``main``, works out
the exit code the way Python would, runs the ``atexit`` handlers, flushes
logging and the standard streams, then leaves with ``os._exit(code)`` before
native destructors can run.

Example:
    >>> from tfdist.runtime.clean_exit import exit_code_of
    >>> exit_code_of(None), exit_code_of(3), exit_code_of("failed")  # The code Python gives sys.exit(value).
    (0, 3, 1)

At the end of a script (not run here: it ends the process)::

    if __name__ == "__main__":
        tfdist.exit_cleanly(main)
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["exit_cleanly", "exit_code_of", "exit_code_for_exception"]


def exit_code_of(value: Any) -> int:
    """The exit code Python gives ``sys.exit(value)`` (None -> 0, int -> int, other -> 1)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value & 0xFF
    return 1


def exit_code_for_exception(exc: BaseException) -> int:
    """The code a task ends with for an uncaught ``exc`` (see :mod:`tfdist.runtime.exit_codes`).

    TensorFlow's Unavailable/Aborted/DeadlineExceeded errors mean a peer went
    away: a rerun can fix that (LOST_PEER, retryable). A tfdist input error
    (``tfdist.Error`` that is a ``ValueError``) is BAD_CONFIG; anything else 1.

    Example:
        >>> from tfdist.errors import LaunchError
        >>> exit_code_for_exception(LaunchError("bad")), exit_code_for_exception(RuntimeError("bug"))
        (2, 1)
    """
    from tfdist.runtime import exit_codes
    from tfdist._compat import is_tf_error
    from tfdist.errors import Error

    if is_tf_error(exc, exit_codes.PEER_LOST_ERRORS):
        return exit_codes.LOST_PEER
    if isinstance(exc, Error) and isinstance(exc, ValueError):
        return exit_codes.BAD_CONFIG
    return exit_codes.FAILED


def _flush_everything() -> None:
    try:
        atexit._run_exitfuncs()  # What normal interpreter exit would run first.
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def exit_cleanly(main: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
    """Runs ``main(*args, **kwargs)`` and ends the process without native teardown.

    The exit code is what the same script would have returned without the
    abort: ``main``'s integer result or ``sys.exit`` code, 1 for an uncaught
    exception (its traceback printed to stderr as Python would; 201 when
    TensorFlow lost a peer, 2 for a tfdist input error: see
    :func:`exit_code_for_exception`), 130 for Ctrl-C.

    Args:
      main: The program's entry point.
      *args: Positional arguments for ``main``.
      **kwargs: Keyword arguments for ``main``.
    """
    try:
        code = exit_code_of(main(*args, **kwargs))
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
        code = exit_code_of(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException as exc:  # noqa: BLE001 - report any failure as Python would.
        sys.excepthook(*sys.exc_info())
        code = exit_code_for_exception(exc)
    try:
        _flush_everything()
    finally:
        os._exit(code)
