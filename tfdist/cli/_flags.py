"""Flags made from options declared once (:func:`tfdist._options.option`), and the options read back from them.

Each field of a dataclass declared with ``option(default, help=...)`` is one flag: named after the field
(``--max-restarts``, or ``--ray-address`` with the prefix ``ray``) unless it declares its own (``--grace``),
with the field's default (or its declared ``cli_default``; :class:`DefaultsShown` shows it in ``--help``) and
help, and read as its type says: ``bool`` is
a switch, ``int`` an integer, ``float`` a finite number, a tuple a repeatable flag, a mapping a repeatable
``KEY=VALUE`` flag; a flag that declares a ``bare`` value may be given without one (``--stall-seconds``
alone is 300). :func:`option_values` turns the parsed flags back into the dataclass's keyword arguments.

Example:
    >>> import dataclasses
    >>> from tfdist._options import option
    >>> @dataclasses.dataclass(frozen=True, kw_only=True)
    ... class Retry:
    ...     attempts: int = option(3, help="tries before giving up")
    ...     backoff: float | None = option(None, help="seconds between `attempts`")
    >>> parser = argparse.ArgumentParser()
    >>> add_flags(parser, Retry)
    >>> args = parser.parse_args(["--attempts", "5"])
    >>> option_values(parser, args, Retry), flag_names(Retry)
    ({'attempts': 5}, {'attempts': '--attempts', 'backoff': '--backoff'})
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from tfdist._options import FlaggedOption, flagged_options
from tfdist.runtime import program


def flag_names(kind: type, prefix: str = "") -> dict[str, str]:
    """Option name -> its flag, for every option of ``kind`` a command line offers."""
    return {opt.name: opt.flag_name(prefix) for opt in flagged_options(kind)}


def dest(opt: FlaggedOption, prefix: str = "") -> str:
    """Where argparse keeps the option's value: its name (``grace_seconds``), after ``prefix_`` if any."""
    return f"{prefix}_{opt.name}" if prefix else opt.name


def with_flags(text: str, flags: Mapping[str, str], quote: str = "`") -> str:
    """``text`` with each option it names in backticks as its flag: `grace_seconds` -> `--grace`.

    Example:
        >>> with_flags("Expected `chief` as well.", {"chief": "--chief"}, quote="")
        'Expected --chief as well.'
    """
    return re.sub(r"`([a-z_]+)`", lambda m: f"{quote}{flags[m[1]]}{quote}" if m[1] in flags else m[0], text)


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, kind: type, *, prefix: str = "", group: str = ""
) -> None:
    """Adds a flag for each option of ``kind`` (with ``group``: of that option group only).

    A flag the parser has already is shared (the Ray engine's ``gpus_per_task`` is ``--gpus``, as the
    emitters'): it keeps its first declaration.
    """
    names = flag_names(kind, prefix)
    for opt in flagged_options(kind):
        flag = opt.flag_name(prefix)
        if (not group or opt.group == group) and flag not in parser._option_string_actions:
            parser.add_argument(flag, dest=dest(opt, prefix), help=_help(opt, names), **_reading(opt, flag))


def option_values(
    parser: argparse.ArgumentParser, args: argparse.Namespace, kind: type, prefix: str = ""
) -> dict[str, Any]:
    """The keyword arguments of ``kind`` that the flags give (a flag left at None is left out).

    A repeated flag gives a tuple, a ``KEY=VALUE`` one a dict; a pair without ``=`` is a usage error (exit 2).
    """
    values = {}
    for opt in flagged_options(kind):
        flag = opt.flag_name(prefix)
        value = getattr(args, parser._option_string_actions[flag].dest)
        if value is None:
            continue
        if _is_mapping(opt):
            value = dict(_pair(parser, flag, item) for item in value)
        elif isinstance(value, list):
            value = tuple(value)
        values[opt.name] = value
    return values


def _pair(parser: argparse.ArgumentParser, flag: str, item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        parser.error(f"{flag} {item!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


def _plain(kind: Any) -> Any:
    """``kind`` without ``| None``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def _is_mapping(opt: FlaggedOption) -> bool:
    origin = typing.get_origin(_plain(opt.type)) or _plain(opt.type)
    return isinstance(origin, type) and issubclass(origin, Mapping)


def _reading(opt: FlaggedOption, flag: str) -> dict[str, Any]:
    """How argparse reads the option: its action, type, default, choices and metavar (the flag's name)."""
    kind = _plain(opt.type)
    reading: dict[str, Any] = {"metavar": opt.flag.metavar or flag.lstrip("-").replace("-", "_").upper()}
    if opt.flag.choices:
        reading = {"choices": opt.flag.choices}
    if kind is bool and opt.default is False:
        return {"action": "store_true"}
    if typing.get_origin(kind) is tuple or _is_mapping(opt):
        return {**reading, "action": "append", "default": []}
    if kind not in (int, float, str):
        raise TypeError(f"option {opt.name!r} of type {opt.type} has no flag form")
    types_ = {int: int, float: program.finite_float, str: None}
    if opt.flag.takes_bare:  # `--stall-seconds` alone, or with a value
        reading = {**reading, "nargs": "?", "const": opt.flag.bare}
    return {**reading, "type": types_[kind], "default": opt.default}


def _help(opt: FlaggedOption, flags: Mapping[str, str]) -> str:
    """The option's help, other options named by their flags, and whether it repeats."""
    text = with_flags(opt.flag.help, flags, quote="")
    if typing.get_origin(_plain(opt.type)) is tuple or _is_mapping(opt):
        text += " (repeatable)"
    return text.replace("%", "%%")  # argparse formats help with %.


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends with each flag's default, unless it is empty (None, off, 0) or the help speaks of it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, 0, [], "", argparse.SUPPRESS) or "default" in text:
            return text
        return text + " (default %(default)s)"
