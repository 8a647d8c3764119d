"""The one exception hierarchy of tfdist.

Every error names the field, repeats the value received, says what was
expected and how to fix it. Use :func:`invalid` to build such a message.

Example:
    >>> from tfdist import errors
    >>> err = errors.invalid(errors.ClusterSpecError, "task.index", -1,
    ...                      "an integer >= 0", "Use the task's position in its job.")
    >>> isinstance(err, ValueError)
    True
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = [
    "Error",
    "ClusterSpecError",
    "StrategyError",
    "LaunchError",
    "DataError",
    "invalid",
    "require_int",
]


class Error(Exception):
    """Base class of every error tfdist raises on purpose."""


class ClusterSpecError(Error, ValueError):
    """A cluster spec or TF_CONFIG is malformed or inconsistent."""


class StrategyError(Error, ValueError):
    """A distribution strategy cannot be built from the options given."""


class LaunchError(Error, ValueError):
    """A local cluster cannot be launched with the options given."""


class DataError(Error, ValueError):
    """Input data is missing, corrupt, or inconsistent with its pipeline."""


_E = TypeVar("_E", bound=Error)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_int(cls: type[_E], field: str, value: Any, *, minimum: int, fix: str = "") -> int:
    """Returns ``value`` if it is an int >= ``minimum`` (bools refused); else raises ``cls``.

    Example:
        >>> require_int(DataError, "num_shards", 4, minimum=1)
        4
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise invalid(cls, field, value, f"an integer >= {minimum}", fix)
    return value


def invalid(cls: type[_E], field: str, value: Any, expected: str, fix: str = "") -> _E:
    """Builds ``cls`` with the standard message for an invalid value.

    Args:
      cls: Error subclass to instantiate.
      field: Name of the field or argument, e.g. ``"cluster.worker[1]"``.
      value: The value received; repeated (shortened) in the message.
      expected: What was expected instead.
      fix: How to fix it; optional.

    Returns:
      An instance of ``cls`` (not raised).
    """
    message = f"Invalid value for `{field}`. Received: {_short(value)}. Expected {expected}."
    if fix:
        message += f" {fix}"
    return cls(message)
