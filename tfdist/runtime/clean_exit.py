"""End a process with the right exit code when native code would abort at exit.

After any S3 access, tensorflow-io's file system aborts the process during
interpreter teardown ("pure virtual method called", exit 134; upstream
tensorflow/io#2039). A job scheduler then marks a successful training job as
failed. :func:`exit_cleanly` is the opt-in fix: it runs ``main``, works out
the exit code the way Python would, runs the ``atexit`` handlers, flushes
logging and the standard streams, then leaves with ``os._exit(code)`` before
native destructors can run.

Example:
    >>> from tfdist.runtime import exit_code_of
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
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from tfdist.runtime import exit_codes

__all__ = ["exit_cleanly", "exit_code_for_exception", "exit_code_of"]

# The rules live in tfdist.runtime.exit_codes; these are their names in tfdist.runtime since the first release.
exit_code_of = exit_codes.from_exit_value
exit_code_for_exception = exit_codes.from_exception


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
    :func:`tfdist.runtime.exit_codes.from_exception`), 130 for Ctrl-C.

    Args:
      main: The program's entry point.
      *args: Positional arguments for ``main``.
      **kwargs: Keyword arguments for ``main``.
    """
    try:
        code = exit_codes.from_exit_value(main(*args, **kwargs))
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
        code = exit_codes.from_exit_value(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = exit_codes.from_signal(signal.SIGINT)
    except BaseException as exc:
        sys.excepthook(*sys.exc_info())
        code = exit_codes.from_exception(exc)
    try:
        _flush_everything()
    finally:
        os._exit(code)
