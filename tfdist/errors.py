"""The one exception hierarchy of tfdist.

Two families sit under :class:`Error`:

* **Bad input** (a ``ValueError`` too): :class:`ClusterSpecError`,
  :class:`StrategyError`, :class:`LaunchError`, :class:`DataError`,
  :class:`PlanError`. The caller passed something that can never work; the
  message names the field, repeats the value, says what was expected and how
  to fix it, and the error keeps those as attributes.
* **Runtime failure** (a ``RuntimeError`` too): :class:`RuntimeFailure` and its
  subclasses. The input was fine but the world was not: no free port, a
  network namespace that cannot be made, a service not started, storage that
  cannot be read, an engine that is not there.

Users catch the classes as ``tfdist.Error``, ``tfdist.LaunchError``, ...; inside tfdist, :func:`invalid`
and the ``require_*`` checks build the bad-input errors.

Example:
    >>> from tfdist import errors
    >>> err = errors.invalid(errors.ClusterSpecError, "task.index", -1,
    ...                      "an integer >= 0", "Use the task's position in its job.")
    >>> isinstance(err, ValueError), err.field, err.value, err.expected
    (True, 'task.index', -1, 'an integer >= 0')
    >>> isinstance(errors.StorageError("disk gone"), ValueError)
    False
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = [
    "ClusterSpecError",
    "DataError",
    "EngineError",
    "Error",
    "LaunchError",
    "LaunchFailure",
    "PlanError",
    "RuntimeFailure",
    "ServiceError",
    "StackError",
    "StorageError",
    "StrategyError",
]

_UNSET: Any = object()


class Error(Exception):
    """Base class of every error tfdist raises on purpose.

    Attributes:
      field: The argument, flag or field at fault, when there is one.
      value: The value received (``None`` when not applicable or unknown).
      expected: What was expected instead, in words.
      fix: How to fix it, in words.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        value: Any = _UNSET,
        expected: str | None = None,
        fix: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.value = None if value is _UNSET else value
        self.expected = expected
        self.fix = fix or None


# ---- bad input: each is a ValueError -------------------------------------------------------------------------


class ClusterSpecError(Error, ValueError):
    """A cluster spec or TF_CONFIG is malformed or inconsistent."""


class StrategyError(Error, ValueError):
    """A distribution strategy cannot be built from the options given."""


class LaunchError(Error, ValueError):
    """A cluster cannot be launched with the options given."""


class DataError(Error, ValueError):
    """Input data is missing, corrupt, or inconsistent with its pipeline."""


class PlanError(Error, ValueError):
    """A planning input (size, bandwidth, measurement) is invalid."""


# ---- runtime failure: never a ValueError ---------------------------------------------------------------------


class RuntimeFailure(Error, RuntimeError):
    """The input was valid, but the environment failed (ports, services, storage, engines)."""


class LaunchFailure(RuntimeFailure):
    """Starting or supervising tasks failed: no free port, no network namespace, a task that cannot start."""


class StorageError(RuntimeFailure):
    """A file or object store could not be read or written (permissions, I/O, a missing file system)."""


class ServiceError(RuntimeFailure):
    """A service tfdist relies on is not started or not reachable (tf.data service, S3 endpoint)."""


class EngineError(RuntimeFailure):
    """An execution engine (Slurm, Ray, Kubernetes) is unavailable or refused the job."""


class StackError(RuntimeFailure):
    """The installed TensorFlow / tf-keras lacks what tfdist needs (an unsupported version, a moved internal)."""


_E = TypeVar("_E", bound=Error)


def _short(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # Nested too deep, or an int too long to print.
        text = f"<{type(value).__name__} too deeply nested or too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_int(
    cls: type[_E], field: str, value: Any, *, minimum: int, fix: str = "", maximum: int | None = None
) -> int:
    """Returns ``value`` if it is an int in ``[minimum, maximum]`` (bools refused); else raises ``cls``.

    Example:
        >>> require_int(DataError, "num_shards", 4, minimum=1)
        4
        >>> require_int(DataError, "num_shards", 0, minimum=1).field
        Traceback (most recent call last):
        ...
        tfdist.errors.DataError: Invalid value for `num_shards`. Received: 0. Expected an integer >= 1.
    """
    too_big = maximum is not None and isinstance(value, int) and value > maximum
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or too_big:
        expected = f"an integer >= {minimum}" + ("" if maximum is None else f" and <= {maximum}")
        raise invalid(cls, field, value, expected, fix)
    return value


def invalid(cls: type[_E], field: str, value: Any, expected: str, fix: str = "") -> _E:
    """Builds ``cls`` with the standard message for an invalid value.

    Args:
      cls: Error subclass to instantiate.
      field: Name of the field or argument, e.g. ``"cluster.worker[1]"``.
      value: The value received; repeated (shortened) in the message and kept as ``err.value``.
      expected: What was expected instead.
      fix: How to fix it; optional.

    Returns:
      An instance of ``cls`` (not raised), with ``field``, ``value``, ``expected`` and ``fix`` set.

    Example:
        >>> err = invalid(LaunchError, "workers", -1, "an integer >= 1", "Pass --workers 2.")
        >>> str(err)
        'Invalid value for `workers`. Received: -1. Expected an integer >= 1. Pass --workers 2.'
        >>> err.fix
        'Pass --workers 2.'
    """
    message = f"Invalid value for `{field}`. Received: {_short(value)}. Expected {expected}."
    if fix:
        message += f" {fix}"
    return cls(message, field=field, value=value, expected=expected, fix=fix)


def require_number(
    cls: type[_E],
    field: str,
    value: Any,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
    fix: str = "",
) -> Any:
    """Returns ``value`` if it is a finite real number (bools refused) within the bounds; else raises ``cls``.

    ``minimum`` and ``maximum`` are inclusive, ``above`` exclusive; ``allow_none`` lets ``None`` through.
    NaN and the infinities are always refused: where "no limit" is meant, take None.

    Example:
        >>> require_number(PlanError, "latency", 5e-5, minimum=0)
        5e-05
        >>> require_number(LaunchError, "timeout", "5", above=0).field
        Traceback (most recent call last):
        ...
        tfdist.errors.LaunchError: Invalid value for `timeout`. Received: '5'. Expected a number > 0.
        >>> require_number(LaunchError, "grace_seconds", float("inf"), minimum=0, maximum=3600)
        Traceback (most recent call last):
        ...
        tfdist.errors.LaunchError: Invalid value for `grace_seconds`. Received: inf. Expected a number >= 0 and <= 3600.
    """
    if value is None and allow_none:
        return value
    in_range = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and _finite_float(value)
        and (minimum is None or value >= minimum)
        and (above is None or value > above)
        and (maximum is None or value <= maximum)
    )
    if not in_range:
        bounds = [f">= {_bound(minimum)}"] if minimum is not None else []
        bounds += [f"> {_bound(above)}"] if above is not None else []
        bounds += [f"<= {_bound(maximum)}"] if maximum is not None else []
        expected = "a number" + (" " + " and ".join(bounds) if bounds else "") + (" or None" if allow_none else "")
        raise invalid(cls, field, value, expected, fix)
    return value


def _bound(value: float) -> str:
    """A bound as people write it: 31622400 (not 3.16224e+07), 0.5, 1e-05."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _finite_float(value: float) -> bool:
    """True when ``value`` is a finite float, or an int that converts to one (10**400 does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def require_type(
    cls: type[_E], field: str, value: Any, types: type | tuple[type, ...], expected: str, fix: str = ""
) -> Any:
    """Returns ``value`` if it is an instance of ``types`` (bools only where ``bool`` is named); else raises ``cls``.

    Example:
        >>> require_type(LaunchError, "host", "127.0.0.1", str, "a host name or address")
        '127.0.0.1'
    """
    wanted = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
        raise invalid(cls, field, value, expected, fix)
    return value


def require_bool(cls: type[_E], field: str, value: Any) -> bool:
    """Returns ``value`` if it is True or False (not 0, 1, a string or None); else raises ``cls``.

    Example:
        >>> require_bool(DataError, "augment", "yes").fix
        Traceback (most recent call last):
        ...
        tfdist.errors.DataError: Invalid value for `augment`. Received: 'yes'. Expected True or False. Pass \
augment=True or augment=False (a bool, not a string or number).
    """
    return require_type(
        cls,
        field,
        value,
        bool,
        "True or False",
        f"Pass {field}=True or {field}=False (a bool, not a string or number).",
    )


def check_keywords(cls: type[_E], field: str, given: Iterable[str], allowed: Iterable[str], fix: str = "") -> None:
    """Raises ``cls`` naming the first unknown keyword in ``given`` and the closest allowed one.

    Example:
        >>> check_keywords(LaunchError, "options", ["timeot"], ["timeout", "workers"])
        Traceback (most recent call last):
        ...
        tfdist.errors.LaunchError: Invalid value for `options`. Received: ['timeot']. Expected keyword options among \
'timeout', 'workers' (did you mean 'timeout'?).
    """
    from tfdist._names import closest

    allowed = sorted(allowed)
    unknown = sorted(str(name) for name in set(given) - set(allowed))
    if unknown:
        expected = "keyword options among " + ", ".join(repr(name) for name in allowed)
        guess = closest(unknown[0], allowed)
        if guess is not None:
            expected += f" (did you mean {guess!r}?)"
        raise invalid(cls, field, unknown, expected, fix)
