"""Stratified sampling against class skew, on ``tf.data.Dataset.choose_from_datasets``.

Example:
    >>> from tfdist.data import resolve_weights
    >>> resolve_weights("sqrt", counts={"cat": 900, "dog": 100})
    {'cat': 0.75, 'dog': 0.25}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from tfdist import _compat
from tfdist._compat import is_variable
from tfdist._names import describe_choices
from tfdist.errors import DataError, invalid, require_int

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["resolve_weights", "stratified_sample"]

_WEIGHT_SCHEMES = ("balanced", "natural", "sqrt")
_EXHAUSTED_POLICIES = ("repeat", "stop", "drop")
Weights = Union[str, Mapping[Any, float], "tf.Variable"]
_CHOICES_PER_DRAW = 1024  # Class choices drawn per vectorized draw.
_PLANNED_CHOICES = 1 << 18  # At most this many choices are drawn up front (2 MB of int64 in the dataset's graph).


def resolve_weights(
    weights: str | Mapping[Any, float], *, counts: Mapping[Any, int] | None = None, classes: Sequence[Any] | None = None
) -> dict[Any, float]:
    """Turns a weight scheme or mapping into normalized per-class probabilities.

    Args:
      weights: 'balanced' (equal), 'natural' (proportional to counts), 'sqrt'
        (proportional to the square root of counts), or class -> weight.
      counts: Class -> record count; needed by 'natural' and 'sqrt'.
      classes: The classes, when no counts are given.
    """
    keys = list(counts) if counts is not None else list(classes or [])
    if isinstance(weights, str):
        if weights not in _WEIGHT_SCHEMES:
            raise invalid(
                DataError,
                "class_weights",
                weights,
                describe_choices(weights, _WEIGHT_SCHEMES) + ", a mapping, or a tf.Variable",
            )
        if weights != "balanced" and counts is None:
            raise invalid(
                DataError,
                "class_weights",
                weights,
                "class counts to weigh by",
                "Pass counts=..., or write the data with write_tfrecords(partition_by=...).",
            )
        if not keys:
            raise invalid(DataError, "classes", keys, "at least one class")
        if weights == "balanced":
            raw = {k: 1.0 for k in keys}
        else:
            assert counts is not None  # Checked above: 'natural' and 'sqrt' need counts.
            raw = {k: float(counts[k]) if weights == "natural" else math.sqrt(counts[k]) for k in keys}
    else:
        try:
            raw = {k: float(v) for k, v in weights.items()}
        except (TypeError, ValueError, AttributeError) as err:
            raise invalid(DataError, "class_weights", weights, "class -> a number") from err
        missing = [k for k in keys if k not in raw]
        if missing:
            raise invalid(DataError, "class_weights", dict(weights), f"a weight for every class (missing {missing})")
    if any(v < 0 or not math.isfinite(v) for v in raw.values()) or sum(raw.values()) <= 0:
        raise invalid(DataError, "class_weights", raw, "finite weights >= 0 with a positive sum")
    total = sum(raw.values())
    return {k: v / total for k, v in raw.items()}


def stratified_sample(
    datasets: Mapping[Any, tf.data.Dataset] | Sequence[tf.data.Dataset],
    weights: Weights,
    *,
    counts: Mapping[Any, int] | None = None,
    seed: int | None = None,
    on_exhausted: str = "repeat",
    block: int = 1,
    draws: int | None = None,
) -> tf.data.Dataset:
    """Samples from per-class datasets with the given class mix.

    Args:
      datasets: Class -> dataset (or a list, classes 0..n-1).
      weights: 'balanced', 'natural', 'sqrt', class -> weight, a list of
        weights (one per dataset, in order), or a 1-D
        float ``tf.Variable`` (one entry per class, in ``datasets`` order) that
        is read for every element, so it can be changed while training (see
        :class:`tfdist.keras.adaptive.AdaptiveClassWeights`); a change shows
        after the elements already prefetched (2-14 measured here).
      counts: Class -> record count, for 'natural'/'sqrt'.
      seed: Sampling seed (deterministic mix when set).
      on_exhausted: What happens when one class runs out: 'repeat' (default:
        every class repeats, so the mix holds forever; bound the result with
        ``take``), 'stop' (end at the first exhausted class: the mix holds but
        data of other classes is left unread), or 'drop' (keep going without
        it: the mix drifts toward the remaining classes).
      block: Draw this many consecutive elements of a class per choice. The
        long-run mix is the same and the sampler does a quarter of the work
        per element with blocks of 4. Shuffle afterwards to spread blocks, or
        keep 1 for a per-element mix.
      draws: How many elements the caller takes (e.g. with ``take``), when
        known. With a ``seed``, fixed weights and at most 262,144 choices
        (``draws / block``), the choices are then drawn up front by numpy
        (seeded by ``seed``): no traced function, ~15 ms less building per
        pipeline. Past them the classes of weight > 0 come round robin (an
        even mix), so a miscount loses nothing. Otherwise (no seed: TF's
        global seed applies; a ``tf.Variable``; more choices) it is unused.

    Returns:
      A dataset of the elements of ``datasets``, interleaved by weight: by
      ``choose_from_datasets`` over :func:`class_choices` (or the choices
      planned for ``draws``) for fixed weights, by ``sample_from_datasets``
      for a ``tf.Variable``.
    """
    if on_exhausted not in _EXHAUSTED_POLICIES:
        raise invalid(DataError, "on_exhausted", on_exhausted, describe_choices(on_exhausted, _EXHAUSTED_POLICIES))
    require_int(DataError, "block", block, minimum=1)
    mapping = dict(datasets) if isinstance(datasets, Mapping) else dict(enumerate(datasets))
    if not mapping:
        raise invalid(DataError, "datasets", [], "at least one per-class dataset")
    keys = list(mapping)
    if not isinstance(weights, (str, Mapping)) and not is_variable(weights):
        # A list of weights, one per dataset in order (as tf.data.Dataset.sample_from_datasets takes them).
        if not isinstance(weights, Sequence) or len(weights) != len(keys):
            raise invalid(
                DataError,
                "weights",
                weights,
                f"a scheme name, a mapping, a tf.Variable, or a list of {len(keys)} weights (one per dataset)",
            )
        weights = dict(zip(keys, weights))
    members = [mapping[k].repeat() if on_exhausted == "repeat" else mapping[k] for k in keys]
    if block > 1:
        members = [m.batch(block) for m in members]
    if draws is not None:
        require_int(DataError, "draws", draws, minimum=0)
        draws = -(-draws // block)  # Choices: one per block.
    sampled = _sample(members, weights, keys, counts=counts, seed=seed, stop=on_exhausted == "stop", choices=draws)
    return _compat.unbatch_dense(sampled) if block > 1 else sampled


def _sample(
    members: list[tf.data.Dataset],
    weights: Weights,
    keys: list[Any],
    *,
    counts: Mapping[Any, int] | None,
    seed: int | None,
    stop: bool,
    choices: int | None = None,
) -> tf.data.Dataset:
    import tensorflow as tf

    if isinstance(weights, tf.Variable):
        if weights.shape.rank != 1 or weights.shape[0] != len(keys):
            raise invalid(
                DataError,
                "class_weights",
                f"tf.Variable{weights.shape}",
                f"a 1-D variable with {len(keys)} entries (one per class)",
            )
        variable = weights
        # A dataset of weights reads the variable at every element, so updates take effect while training.
        live = (
            tf.data.Dataset.from_tensors(0)
            .repeat()
            .map(lambda _: tf.cast(variable.read_value(), tf.float32) / tf.reduce_sum(variable))
        )
        return tf.data.Dataset.sample_from_datasets(members, weights=live, seed=seed, stop_on_empty_dataset=stop)
    probabilities = resolve_weights(weights, counts=counts, classes=keys)
    mix = [probabilities[k] for k in keys]
    if choices is not None and seed is not None and choices <= _PLANNED_CHOICES:
        picks = _planned_choices(mix, choices, seed=seed)
    else:  # Unseeded: Dataset.random follows TF's global seed (tf.random.set_seed), as it always did.
        picks = class_choices(mix, seed=seed)
    return tf.data.Dataset.choose_from_datasets(members, picks, stop_on_empty_dataset=stop)


def _planned_choices(probabilities: Sequence[float], count: int, *, seed: int) -> tf.data.Dataset:
    """``count`` class indices (int64) drawn now by numpy with ``probabilities``, then round robin forever.

    The round robin runs over the classes of weight > 0 only: past the planned
    choices the mix is even over them, and every such class is still drained.
    """
    import numpy as np
    import tensorflow as tf

    mix = np.asarray(probabilities, np.float64)
    rng = np.random.default_rng(seed % (1 << 64))  # Seeds may be negative (as TF's); numpy takes them mod 2**64.
    picks = rng.choice(len(mix), size=count, p=mix / mix.sum())
    drawn = tf.data.Dataset.from_tensor_slices(tf.constant(picks, tf.int64))
    return drawn.concatenate(
        tf.data.Dataset.from_tensor_slices(tf.constant(np.flatnonzero(mix > 0), tf.int64)).repeat()
    )


def class_choices(probabilities: Sequence[float], *, seed: int | None = None) -> tf.data.Dataset:
    """An endless stream of class indices (int64) drawn with ``probabilities``, 1,024 at a time.

    What ``sample_from_datasets`` draws per element (one random categorical
    per choice, ~36 us measured here), vectorized: one inverse-CDF lookup
    (``searchsorted`` of uniform draws) per 1,024 choices. Deterministic with
    a seed.

    Example:
        >>> import collections
        >>> picks = class_choices([0.75, 0.0, 0.25], seed=0).take(4000)
        >>> counts = collections.Counter(int(c) for c in picks)
        >>> sorted(counts), abs(counts[0] / 4000 - 0.75) < 0.03
        ([0, 2], True)
    """
    import numpy as np
    import tensorflow as tf

    total = float(sum(probabilities))
    cdf = tf.constant(np.cumsum(np.asarray(probabilities, np.float64) / total), tf.float64)
    last = len(probabilities) - 1

    def pick(bits: Any) -> Any:  # Dataset.random yields uniform 32-bit integers: u in [0, 1).
        uniform = tf.cast(bits, tf.float64) / float(1 << 32)
        return tf.minimum(tf.searchsorted(cdf, uniform, side="right", out_type=tf.int64), last)

    return _compat.unbatch_dense(tf.data.Dataset.random(seed=seed).batch(_CHOICES_PER_DRAW).map(pick))
