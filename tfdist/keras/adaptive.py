"""Adaptive stratified sampling: raise the weight of classes whose loss stays high.

Example:
    >>> import tensorflow as tf
    >>> from tfdist.keras import AdaptiveClassWeights
    >>> weights = tf.Variable([1.0, 1.0])
    >>> callback = AdaptiveClassWeights(weights, per_class_data={0: [], 1: []}, rate=0.5)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from tfdist._compat import callback_base
from tfdist.errors import DataError, invalid

__all__ = ["AdaptiveClassWeights"]

_log = logging.getLogger("tfdist.keras")


def reweight(weights: list[float], losses: list[float], *, rate: float, floor: float) -> list[float]:
    """Multiplicative update: w_c *= exp(rate * (loss_c / mean_loss - 1)), normalized, floored.

    Example:
        >>> [round(w, 3) for w in reweight([0.5, 0.5], [2.0, 1.0], rate=1.0, floor=0.01)]
        [0.661, 0.339]
    """
    mean = sum(losses) / len(losses)
    raw = [w * math.exp(rate * (loss / mean - 1.0)) if mean > 0 else w for w, loss in zip(weights, losses)]
    total = sum(raw)
    floored = [max(floor, w / total) for w in raw]
    total = sum(floored)
    return [w / total for w in floored]


class AdaptiveClassWeights(callback_base()):  # type: ignore[misc]
    """A tf-keras callback that moves sampling weight toward classes with high loss.

    At each epoch end it evaluates the model on a small held-out dataset per
    class and updates ``weights`` (the ``tf.Variable`` that
    :func:`stratified_sample` / ``TFRecordPipeline(class_weights=...)`` reads),
    so the next epoch samples hard classes more often.

    Args:
      weights: 1-D float ``tf.Variable``, one entry per class (sampler order).
      per_class_data: Class position -> dataset of (features, label) batches.
      rate: How fast weights move (0 freezes them).
      floor: Smallest weight any class keeps.
    """

    def __init__(
        self, weights: Any, *, per_class_data: Mapping[int, Any], rate: float = 0.5, floor: float = 0.02
    ) -> None:
        super().__init__()
        if rate < 0 or not 0 <= floor < 1:
            raise invalid(DataError, "rate/floor", (rate, floor), "rate >= 0 and 0 <= floor < 1")
        self.weights = weights
        self.per_class_data = dict(per_class_data)
        self.rate, self.floor = rate, floor
        self.history: list[list[float]] = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        losses = []
        for position in range(int(self.weights.shape[0])):
            result = self.model.evaluate(self.per_class_data[position], verbose=0, return_dict=True)
            losses.append(float(result["loss"]))
        updated = reweight([float(w) for w in self.weights.numpy()], losses, rate=self.rate, floor=self.floor)
        self.weights.assign(updated)
        self.history.append(updated)
        _log.info(
            "Epoch %d class losses %s -> sampling weights %s.",
            epoch,
            [round(v, 4) for v in losses],
            [round(v, 3) for v in updated],
        )
