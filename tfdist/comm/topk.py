"""Top-k sparsification with error feedback (Deep Gradient Compression style).

Each replica adds to its gradient what it did not send before (its error), sends only the ``k`` entries of
largest magnitude (``k = ceil(density * size)``) as values and indices, and keeps the rest as its new
error. The replicas all-gather the values and indices, and each scatter-adds them into the summed gradient.
Over any number of steps nothing is lost: the updates applied plus the errors held equal the sum of every
gradient.

Example:
    >>> topk_count(1000, density=0.01), topk_count(10, density=0.01)
    (10, 1)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfdist.errors import StrategyError, invalid

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["topk_count", "topk_sum"]

AllGather = Callable[[Sequence[Any]], Sequence[Any]]


def topk_count(size: int, *, density: float) -> int:
    """Entries of a tensor of ``size`` values one replica sends per step: ``ceil(density * size)``, at least 1."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 < density <= 1.0:
        raise invalid(
            StrategyError,
            "density",
            density,
            "a fraction in (0, 1]: the share of each gradient's entries sent per step",
            "For example density=0.01 sends the largest 1%.",
        )
    return max(1, min(size, math.ceil(density * size)))


def topk_sum(
    grads: Sequence[tf.Tensor],
    errors: Sequence[tf.Tensor],
    *,
    density: float,
    all_gather: AllGather,
) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """One step of top-k over ``grads``: their sum over the replicas (of what was sent), and the new errors.

    Call in replica context, the same on every replica. ``errors[i]`` has ``grads[i]``'s shape (zeros at
    the start); ``all_gather`` concatenates a list of 1-D tensors over the replicas along axis 0 (one
    call: every tensor's values and indices).

    Ties in magnitude go to the lower index (``tf.math.top_k``'s order), the same on every platform.
    """
    import tensorflow as tf

    flats, picks, values = [], [], []
    for grad, error in zip(grads, errors):
        flat = tf.reshape(tf.cast(grad, tf.float32), [-1]) + tf.reshape(error, [-1])
        k = topk_count(int(flat.shape[0]), density=density)
        _, index = tf.math.top_k(tf.abs(flat), k=k)
        flats.append(flat)
        picks.append(index)
        values.append(tf.gather(flat, index))
    gathered = list(all_gather(values + picks)) if grads else []  # int32 indices: 8 bytes an entry.
    summed, new_errors = [], []
    for n, (grad, flat, index) in enumerate(zip(grads, flats, picks)):
        all_values, all_index = gathered[n], gathered[len(grads) + n]
        total = tf.scatter_nd(all_index[:, None], all_values, tf.shape(flat))
        summed.append(tf.cast(tf.reshape(total, tf.shape(grad)), grad.dtype))
        kept = tf.tensor_scatter_nd_update(flat, index[:, None], tf.zeros_like(index, tf.float32))
        new_errors.append(tf.reshape(kept, tf.shape(grad)))
    return summed, new_errors
