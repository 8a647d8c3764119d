"""The check shared by helpers that build a model themselves (``shard_model``, ``pipeline_model``)."""

from __future__ import annotations

from typing import Any

from tfdist.errors import StrategyError, invalid


def require_builder(build: Any, *, returns: str, example: str, why: str) -> None:
    """StrategyError unless ``build`` is a function (a model, being callable, is refused with the fix)."""
    import tf_keras

    if not callable(build) or isinstance(build, tf_keras.Model):
        raise invalid(
            StrategyError,
            "build",
            type(build).__name__,
            f"a function that returns {returns}",
            f"Pass the function (e.g. `{example}`, not `{example}()`): {why}.",
        )
