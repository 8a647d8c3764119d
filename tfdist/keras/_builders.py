"""Checks the keras helpers share: a model builder (``shard_model``, ``stage_model``), and no DTensor mesh
where a helper cannot run on one (``with_communication``'s compressors, ``local_sgd``)."""

from __future__ import annotations

from typing import Any

from tfdist import _compat
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


def refuse_mesh(field: str, value: Any, feature: str, *, optimizer: Any = None) -> None:
    """StrategyError if this process trains on a DTensor mesh (``build_mesh`` ran, or ``optimizer`` is a DTensor
    optimizer): ``feature`` replaces a MultiWorkerMirroredStrategy all-reduce a mesh does not have."""
    if not (_compat.dtensor_initialized() or (optimizer is not None and _compat.is_dtensor_optimizer(optimizer))):
        return
    raise invalid(
        StrategyError,
        field,
        value,
        f"no {feature} on a DTensor mesh (its gradients are summed by DTensor's own collectives, which "
        "tfdist does not replace)",
        "Train the mesh without it, or use it under MultiWorkerMirroredStrategy (data parallel, "
        "tfdist.build_strategy('multi_worker_mirrored')), where it replaces the gradient all-reduce.",
    )
