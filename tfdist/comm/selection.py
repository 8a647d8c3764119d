"""Top-k's selection: how many entries a tensor sends, and which, without the compressor around them.

:mod:`tfdist.comm.topk` selects with these at every step, and :mod:`tfdist.comm.host` times them to price that
step, so they sit below both (the compressors import the host's rates).

Example:
    >>> topk_count(1000, density=0.01), topk_count(10, density=0.01)
    (10, 1)
    >>> import tensorflow as tf
    >>> largest(tf.constant([0.5, 3.0, 1.0, 2.0]), 2).numpy().tolist()
    [1, 3]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tfdist.errors import StrategyError, invalid

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["topk_count"]  # `largest` is internal to tfdist.comm.

_SAMPLE = 4096  # Values sampled to set the selection threshold of a large tensor.


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


def largest(magnitude: tf.Tensor, k: int) -> tf.Tensor:
    """The indices of the ``k`` largest of ``magnitude`` (1-D), as ``tf.math.top_k`` gives them, but fast.

    ``top_k`` over millions of values takes ~0.1 s on a CPU. So a strided sample of ``_SAMPLE`` values sets a
    threshold that about ``2k`` values pass; ``top_k`` then runs over those alone (their order kept, so ties
    go to the lower index as before). If fewer than ``k`` pass, ``top_k`` runs over everything: the result
    is exact either way.
    """
    import tensorflow as tf

    n = int(magnitude.shape[0])
    if n <= 4 * _SAMPLE:
        return tf.math.top_k(magnitude, k=k).indices
    sample = magnitude[:: n // _SAMPLE]
    taken = min(int(sample.shape[0]), max(1, -(-2 * k * int(sample.shape[0]) // n)))
    threshold = tf.math.top_k(sample, k=taken).values[-1]
    candidates = tf.where(magnitude >= threshold)[:, 0]

    def among_candidates() -> tf.Tensor:
        best = tf.math.top_k(tf.gather(magnitude, candidates), k=k).indices
        return tf.cast(tf.gather(candidates, best), tf.int32)

    return tf.cond(tf.size(candidates) >= k, among_candidates, lambda: tf.math.top_k(magnitude, k=k).indices)
