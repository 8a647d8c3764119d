"""How a tfdist process runs and ends: exit codes and their retry rule, clean exits, the program wrapper.

The bottom floor beside :mod:`tfdist.errors`: every other layer may use it. Public here: the exit codes
(the table in :mod:`tfdist.runtime.exit_codes`), :func:`is_retryable`, :func:`exit_cleanly` and the codes
Python gives an ending; the command-line wrapper (``program``) is tfdist's own.

Example:
    >>> from tfdist.runtime import PREEMPTED, is_retryable
    >>> PREEMPTED, is_retryable(PREEMPTED)
    (200, True)
"""

from tfdist.runtime.clean_exit import exit_cleanly, exit_code_for_exception, exit_code_of
from tfdist.runtime.exit_codes import (
    BAD_CONFIG,
    CANNOT_EXECUTE,
    FAILED,
    LOST_PEER,
    NOT_FOUND,
    OK,
    PREEMPTED,
    STALLED,
    TIMEOUT,
    TOO_FEW_WORKERS,
    is_retryable,
)

__all__ = [
    "BAD_CONFIG",
    "CANNOT_EXECUTE",
    "FAILED",
    "LOST_PEER",
    "NOT_FOUND",
    "OK",
    "PREEMPTED",
    "STALLED",
    "TIMEOUT",
    "TOO_FEW_WORKERS",
    "exit_cleanly",
    "exit_code_for_exception",
    "exit_code_of",
    "is_retryable",
]
