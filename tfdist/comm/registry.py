"""The compressor registry: every compressor's name to its class, in one place.

Kept apart from :mod:`tfdist.comm.compressor` (what a compressor is), so a compressor's module imports the
interface and the registry imports the compressors: the arrows point one way. A new compressor is one
class (a subclass of :class:`~tfdist.comm.WireCast`, :class:`~tfdist.comm.TrafficModel` or
:class:`~tfdist.comm.ErrorFeedback`) and one :func:`register_compressor` call; ``CollectiveConfig``,
``with_communication``, ``compressed_traffic`` and ``tfdist plan`` find it here.

Example:
    >>> compressor_for("powersgd", {"rank": 2})
    PowerSGD(rank=2, warmup_steps=25, min_compression_rate=2.0)
    >>> compressor_for("topk", {"rank": 2})
    Traceback (most recent call last):
    ...
    tfdist.errors.StrategyError: Invalid value for `rank`. Received: 2. Expected no `rank` with 'topk' (its options: density). Pass rank only with 'powersgd'.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

from tfdist._names import describe_choices
from tfdist.comm.casts import BFloat16, Float16, NoCompression
from tfdist.comm.compressor import Compressor
from tfdist.comm.local_sgd import LocalSGD
from tfdist.comm.powersgd import PowerSGD
from tfdist.comm.topk import TopK
from tfdist.errors import Error, StrategyError, invalid

__all__ = ["compressor_for", "register_compressor", "registered_compressors"]

_C = TypeVar("_C", bound=type[Compressor])
_REGISTRY: dict[str, type[Compressor]] = {}


def register_compressor(cls: _C) -> _C:
    """Makes ``cls`` available by its ``name``; returns it, so it also serves as a class decorator.

    Raises:
      StrategyError: ``cls`` is not a concrete compressor dataclass whose options all have defaults, or its
        name is taken (the message names both classes).
    """
    if not (inspect.isclass(cls) and issubclass(cls, Compressor) and dataclasses.is_dataclass(cls)):
        raise invalid(StrategyError, "cls", cls, "a dataclass subclass of tfdist.comm.Compressor")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise invalid(StrategyError, "cls.name", name, "an identifier, e.g. 'powersgd'", f"Set {_title(cls)}.name.")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise invalid(StrategyError, "cls", _title(cls), "a compressor that implements every method", f"Add {missing}.")
    needs = [f.name for f in dataclasses.fields(cls) if f.default is f.default_factory is dataclasses.MISSING]
    if needs:
        raise invalid(
            StrategyError, "cls", _title(cls), "options that all have defaults", f"Give {', '.join(needs)} a default."
        )
    taken = _REGISTRY.get(name)
    if taken is not None and taken is not cls:
        raise invalid(
            StrategyError,
            "name",
            name,
            f"a name not registered yet: {name!r} is {_title(taken)}, so {_title(cls)} cannot have it",
            f"Give {_title(cls)} another name.",
        )
    _REGISTRY[name] = cls
    return cls


def registered_compressors(kind: type = Compressor) -> dict[str, type[Any]]:
    """The registered compressors of ``kind`` (default: all) by name, in the order they were registered.

    Example:
        >>> from tfdist.comm import WireCast
        >>> list(registered_compressors(WireCast))
        ['none', 'fp16', 'bf16']
    """
    return {name: cls for name, cls in _REGISTRY.items() if issubclass(cls, kind)}


def compressor_for(
    compression: Any,
    options: Mapping[str, Any] | None = None,
    *,
    kind: type[Compressor] | tuple[type[Compressor], ...] = Compressor,
    error: type[Error] = StrategyError,
    field: str = "compression",
) -> Compressor:
    """The compressor ``compression`` names, built with ``options``; a registered compressor as it is.

    Args:
      compression: A registered name ('powersgd'), or a compressor (``PowerSGD(rank=2)``).
      options: Options of the named compressor (``{'rank': 2}``); none beside a compressor object.
      kind: The kinds the caller takes (``WireCast``...); a compressor of another kind is refused.
      error: The error class of an unknown or refused ``compression`` (``PlanError`` for the planner).
      field: The argument ``compression`` came from, for the error.

    Raises:
      StrategyError: An option the compressor does not take, or that it refuses (from its ``__post_init__``).
      ``error``: ``compression`` is no registered compressor of ``kind``.
    """
    allowed = [name for name, cls in _REGISTRY.items() if issubclass(cls, kind)]
    if options is not None and not isinstance(options, Mapping):
        raise invalid(StrategyError, "options", options, "a mapping of option names to values, e.g. {'rank': 2}")
    options = dict(options or {})
    if isinstance(compression, Compressor):
        if _REGISTRY.get(compression.name) is not type(compression):
            raise invalid(
                error, field, compression, "a registered compressor", "Register its class with register_compressor."
            )
        if options:
            key = next(iter(options))
            raise invalid(
                StrategyError,
                key,
                options[key],
                f"no `{key}` beside a compressor object",
                f"Pass it inside: {type(compression).__name__}({key}=...).",
            )
        cls: type[Compressor] = type(compression)
    elif isinstance(compression, str) and compression in _REGISTRY:
        cls = _REGISTRY[compression]
    else:
        raise invalid(error, field, compression, describe_choices(compression, allowed))
    if cls.name not in allowed:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        raise invalid(
            error,
            field,
            compression if isinstance(compression, str) else cls.name,
            describe_choices(cls.name, allowed),
            f"{cls.name!r} is a {_kind(cls)}, not a {' or '.join(k.__name__ for k in kinds)}.",
        )
    if isinstance(compression, Compressor):
        return compression
    fields = [f.name for f in dataclasses.fields(cls)]
    for key, value in options.items():
        if key not in fields:
            owners = [name for name, other in _REGISTRY.items() if key in {f.name for f in dataclasses.fields(other)}]
            raise invalid(
                StrategyError,
                key,
                value,
                f"no `{key}` with {cls.name!r} (its options: {', '.join(fields) or 'none'})",
                f"Pass {key} only with {' or '.join(repr(o) for o in owners)}." if owners else f"Leave {key} out.",
            )
    return cls(**options)


def _title(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _kind(cls: type) -> str:
    """The nearest kind of compressor ``cls`` is (``ErrorFeedback``, ``TrafficModel``, ``WireCast``)."""
    return next(base.__name__ for base in cls.__mro__[1:] if base.__module__ == Compressor.__module__)


# The built-in compressors; a new one is registered here (or with register_compressor from its own module).
for _builtin in (NoCompression, Float16, BFloat16, PowerSGD, TopK, LocalSGD):
    register_compressor(_builtin)
