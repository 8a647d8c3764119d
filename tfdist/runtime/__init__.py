"""How a tfdist process runs and ends: exit codes and their retry rule, clean exits, the program wrapper.

The bottom floor beside :mod:`tfdist.errors`: every other layer may use it.
"""

from tfdist.runtime.clean_exit import exit_cleanly, exit_code_for_exception, exit_code_of
from tfdist.runtime.exit_codes import is_retryable

__all__ = ["exit_cleanly", "exit_code_for_exception", "exit_code_of", "is_retryable"]
