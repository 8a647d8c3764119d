"""Stratified draws that a resume replays: the class of every draw is a function of (seed, worker, draw index).

Under ``order='resumable'`` with ``class_weights``, each input pipeline draws its records from the class
groups with the asked mix, and the class of its draw ``k`` is a pure function of ``(seed, worker, k)``: a
SplitMix64 hash of ``k`` compared with the mix's cumulative thresholds (53-bit integers, so NumPy and the
graph agree exactly). Each class is read in its own resumable epoch order (:mod:`tfdist.data.order.epoch`),
cut into one stream per pipeline, endlessly. A position of ``(epoch, step)`` is ``k`` draws; a resume
counts, in NumPy, how many of those draws each class took (no record is read), starts every class there,
and draws on from ``k``: the same records in the same order as the run that was not interrupted.

Example:
    >>> draws = class_draws([0.5, 0.0, 0.5], seed=3, worker=0, start=0, count=8)
    >>> draws.tolist(), draw_counts([0.5, 0.0, 0.5], seed=3, worker=0, upto=8).tolist()
    ([0, 2, 2, 2, 2, 2, 2, 0], [2, 0, 6])
    >>> draw_counts([0.5, 0.0, 0.5], seed=3, worker=0, upto=100_000).tolist()  # The mix, over many draws.
    [49885, 0, 50115]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.data.order import splitmix

__all__: list[str] = []

_BITS = 53  # Draws compare 53-bit integers: exact in NumPy and in TF, and finer than any float weight.
_COUNT_CHUNK = 1 << 20  # Draws counted per NumPy pass when a resume replays the classes of k draws.
_GRAPH_CHUNK = 1024  # Draws per graph op batch.


def thresholds(mix: Sequence[float]) -> Any:
    """The cumulative 53-bit thresholds of ``mix`` (int64): draw value ``u`` falls in class ``#{t <= u}``."""
    import numpy as np

    weights = np.asarray(mix, np.float64)
    cdf = np.cumsum(weights / weights.sum())
    return np.minimum(np.round(cdf * (1 << _BITS)), 1 << _BITS).astype(np.int64)[:-1]


def _stream_key(seed: int, worker: int) -> int:
    return splitmix.key(seed, worker, 0x5747)  # A constant part keeps these draws apart from the order's permutations.


def class_draws(mix: Sequence[float], *, seed: int, worker: int, start: int, count: int) -> Any:
    """The classes (int64) of draws ``start .. start + count`` of pipeline ``worker``."""
    import numpy as np

    index = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    values = (splitmix.hashes(_stream_key(seed, worker), index) >> np.uint64(64 - _BITS)).astype(np.int64)
    return np.searchsorted(thresholds(mix), values, side="right").astype(np.int64)


def draw_counts(mix: Sequence[float], *, seed: int, worker: int, upto: int, start: int = 0) -> Any:
    """How many of draws ``start .. start + upto`` each class took (from 0: where a resume at draw ``upto``
    starts each class)."""
    import numpy as np

    counts = np.zeros(len(mix), np.int64)
    for first in range(start, start + upto, _COUNT_CHUNK):
        count = min(_COUNT_CHUNK, start + upto - first)
        counts += np.bincount(class_draws(mix, seed=seed, worker=worker, start=first, count=count), minlength=len(mix))
    return counts


def graph_draws(mix: Sequence[float], *, seed: int, worker: int, start: Any) -> Any:
    """An endless ``tf.data.Dataset`` of the classes of draws ``start, start + 1, ...`` (graph ops, no Python).

    Example:
        >>> import tensorflow as tf
        >>> got = [int(c) for c in graph_draws([0.2, 0.8], seed=1, worker=2, start=tf.constant(5, tf.int64)).take(6)]
        >>> got == class_draws([0.2, 0.8], seed=1, worker=2, start=5, count=6).tolist()
        True
    """
    import tensorflow as tf

    from tfdist import _compat

    classes = graph_classes(mix, seed=seed, worker=worker)
    firsts = tf.data.Dataset.range(tf.constant(0, tf.int64), tf.constant((1 << 63) - 1, tf.int64), _GRAPH_CHUNK)
    return _compat.unbatch_dense(firsts.map(lambda offset: classes(offset + start, _GRAPH_CHUNK)))


def graph_classes(mix: Sequence[float], *, seed: int, worker: int) -> Callable[[Any, Any], Any]:
    """A graph function ``(start, count) -> the classes (int64) of draws start .. start + count`` of pipeline
    ``worker``: :func:`class_draws` in TF ops (int64 scalars or tensors in, no Python at run time).

    Example:
        >>> import tensorflow as tf
        >>> classes = graph_classes([0.3, 0.7], seed=2, worker=0)
        >>> classes(tf.constant(7, tf.int64), 5).numpy().tolist() == class_draws([0.3, 0.7], seed=2, worker=0,
        ...                                                                          start=7, count=5).tolist()
        True
    """
    import tensorflow as tf

    limits = tf.constant(thresholds(mix), tf.int64)
    seed_key = _stream_key(seed, worker)

    def classes(start: Any, count: Any) -> Any:
        first = tf.cast(start, tf.int64)
        index = tf.bitcast(tf.range(first + 1, first + 1 + tf.cast(count, tf.int64), dtype=tf.int64), tf.uint64)
        values = tf.bitwise.right_shift(splitmix.graph_hashes(seed_key, index), tf.constant(64 - _BITS, tf.uint64))
        return tf.searchsorted(limits, tf.bitcast(values, tf.int64), side="right", out_type=tf.int64)

    return classes


@dataclasses.dataclass(frozen=True, kw_only=True)
class StrataOrder:
    """The stratified order of one input pipeline: what a backup records, and its epoch's length.

    ``share`` draws make one epoch of this pipeline (its even share of all records).
    """

    labels: tuple[str, ...]
    counts: tuple[int, ...]
    mix: tuple[float, ...]
    seed: int
    num_workers: int
    share: int
    orders: tuple[Any, ...]  # Each class's EpochOrder (one stream per pipeline).

    @property
    def stream_lengths(self) -> tuple[int, ...]:
        """Draws of one epoch of this pipeline (as :class:`~tfdist.data.order.epoch.EpochOrder` names it)."""
        return (self.share,)

    def fingerprint(self) -> dict[str, Any]:
        """What a backup records to check that a resume draws the same records."""
        first = self.orders[0]
        return {
            "stratified": list(self.labels),
            "counts": list(self.counts),
            "files": [order.fingerprint()["counts_key"] for order in self.orders],  # Each class's record counts.
            "mix": [round(p, 12) for p in self.mix],
            "seed": self.seed,
            "pipelines": self.num_workers,  # Each pipeline draws its own sequence: a world size is part of it.
            "block": first.block,
            "window": first.window,
        }
