"""Where the ``tfdist`` logger's lines go when nobody configured logging: its default in launched tasks.

tfdist logs under ``tfdist.*`` and never configures logging itself, with one exception that a variable asks
for: ``TFDIST_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error`` or ``off``). ``tfdist-launch`` writes
it into every task's environment (``info`` unless ``--log-level`` says otherwise), so that a line such as
``Strategy 'auto' chose ...`` reaches the console of a launched program that configures no logging.

When the variable is set, ``import tfdist`` (:func:`install_default`) sets the ``tfdist`` logger's level
to it and gives the logger a handler that writes ``LEVEL tfdist.module: message`` to stderr, but only when
the program has not configured logging yet: no handler on the root logger and no handler or level on the
``tfdist`` logger. The handler writes a record only while no other handler would get it: once the program
configures logging (``logging.basicConfig``, a handler of its own, also after ``import tfdist``), tfdist's
lines go to those handlers alone, each once. The level stays what the variable said; the program may set
another one (``logging.getLogger("tfdist").setLevel(...)``).

The command lines (``tfdist``, ``tfdist-launch``) configure logging themselves: :func:`configure_cli`.

Example:
    >>> level_number("warning"), level_number("off") > logging.CRITICAL
    (30, True)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

LEVEL_VAR = "TFDIST_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error", "off")
DEFAULT_LEVEL = "info"
FORMAT = "%(levelname)s %(name)s: %(message)s"
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}
_LOGGER = "tfdist"


def level_number(name: str) -> int:
    """The :mod:`logging` level of a name in :data:`LOG_LEVELS` (KeyError for any other)."""
    return _LEVELS[name]


class _DefaultHandler(logging.Handler):
    """Writes a record to the current ``sys.stderr``, unless another handler gets it (then it steps aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(FORMAT))
        self.retired = False

    def handle(self, record: logging.LogRecord) -> bool:
        if self.retired or _another_handler(record.name, self):
            self.retired = True  # The program configured logging: its handlers have tfdist's lines from now on.
            return False
        return bool(super().handle(record))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _another_handler(name: str, mine: logging.Handler) -> bool:
    """True when a record of logger ``name`` reaches a handler other than ``mine`` (as Logger.callHandlers goes)."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None:
        if any(handler is not mine for handler in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


def install_default(environ: Mapping[str, str] | None = None) -> bool:
    """The ``tfdist`` logger's default when ``TFDIST_LOG_LEVEL`` is set; True when it was installed.

    Called once as ``import tfdist`` imports this module (the last line below). Does nothing when the variable is unset or empty, or when logging is
    configured already (a root handler, a handler or level on the ``tfdist`` logger). An unknown value is
    reported as a warning and ignored.
    """
    name = (os.environ if environ is None else environ).get(LEVEL_VAR, "").strip().lower()
    logger = logging.getLogger(_LOGGER)
    if not name or logger.handlers or logger.level != logging.NOTSET or logging.getLogger().handlers:
        return False
    if name not in _LEVELS:
        logger.warning("%s=%r is not one of %s; ignored.", LEVEL_VAR, name, ", ".join(LOG_LEVELS))
        return False
    logger.setLevel(_LEVELS[name])
    logger.addHandler(_DefaultHandler())
    return True


def cli_level(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """A command line's level name: its ``--log-level``, else a valid ``TFDIST_LOG_LEVEL``, else ``info``."""
    if flag is not None:
        return flag
    name = (os.environ if environ is None else environ).get(LEVEL_VAR, "").strip().lower()
    return name if name in _LEVELS else DEFAULT_LEVEL


def configure_cli(level: str, fmt: str = FORMAT) -> None:
    """For a tfdist command line (the program, not the library): records of other libraries at WARNING and
    above, tfdist's at ``level``, on stderr in ``fmt``; an import-time default handler steps aside."""
    logging.basicConfig(level=logging.WARNING, format=fmt)
    logger = logging.getLogger(_LOGGER)
    for handler in logger.handlers:
        if isinstance(handler, _DefaultHandler):
            handler.retired = True
    logger.setLevel(_LEVELS[level])


# Once per process, as tfdist/__init__.py imports this module: a no-op unless TFDIST_LOG_LEVEL is set.
install_default()
