"""Name lookup with "did you mean" suggestions, shared by every registry."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, choices: Iterable[str]) -> str | None:
    """Returns the choice closest to ``name``, or None when nothing is close."""
    matches = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return matches[0] if matches else None


def describe_choices(name: object, choices: Iterable[str]) -> str:
    """Returns "one of 'a', 'b'" plus a "Did you mean" hint when ``name`` is a string close to a choice."""
    choices = sorted(choices)
    text = "one of " + ", ".join(repr(c) for c in choices)
    guess = closest(name, choices) if isinstance(name, str) else None
    if guess is not None:
        text += f" (did you mean {guess!r}?)"
    return text
