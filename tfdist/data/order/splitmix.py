"""SplitMix64, the hash behind every resumable order, in two forms that agree bit for bit: NumPy and TF graph ops.

The epoch order (:mod:`tfdist.data.order.epoch`) and the stratified draws (:mod:`tfdist.data.order.strata`)
are computed in NumPy on the coordinator and on a resume; parameter-server workers run no Python, so they
compute the same numbers in graph ops (:mod:`tfdist.data.order.claims`). Each function here has a
``graph_`` twin with the same arguments and results:

* :func:`key` folds integers into one 64-bit key, order-sensitive (:func:`graph_key`);
* :func:`hashes` gives the ``i``-th hash of a key, for an array of ``i`` (:func:`graph_hashes`);
* :func:`permutation` sorts ``range(n)`` by those hashes (:func:`graph_permutation`).

The mixing function is SplitMix64's finalizer (wrapping uint64 arithmetic): the same numbers on every
platform and NumPy or TF version, so a backup resumes on another machine.

Example:
    >>> permutation(8, 3, 0).tolist()
    [1, 2, 0, 6, 3, 4, 7, 5]
    >>> key(1, 2) != key(2, 1)
    True
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []

GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: SplitMix64's increment.
MASK64 = (1 << 64) - 1
_ROOT = 0x2545F4914F6CDD1D  # The key of no integers.


def mix(x: Any) -> Any:
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic).

    Example:
        >>> import numpy as np
        >>> int(mix(np.asarray([1], np.uint64))[0])
        6238072747940578789
    """
    import numpy as np

    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def key(*parts: int) -> int:
    """One 64-bit key from integers, order-sensitive (each part is taken modulo 2**64)."""
    import numpy as np

    folded = np.uint64(_ROOT)
    for part in parts:
        with np.errstate(over="ignore"):
            folded = mix(np.asarray([folded ^ np.uint64(part & MASK64)], dtype=np.uint64) + np.uint64(GOLDEN))[0]
    return int(folded)


def hashes(seed: int, index: Any) -> Any:
    """The hashes of positions ``index`` (a uint64 array) under key ``seed``: ``mix(index * GOLDEN ^ seed)``."""
    import numpy as np

    with np.errstate(over="ignore"):
        return mix(index * np.uint64(GOLDEN) ^ np.uint64(seed))


def permutation(n: int, *keys: int) -> Any:
    """A permutation of ``range(n)`` that depends on ``keys`` only (int64 array).

    Example:
        >>> permutation(5, 7, 0).tolist() == permutation(5, 7, 0).tolist() != permutation(5, 7, 1).tolist()
        True
    """
    import numpy as np

    sort_keys = hashes(key(*keys), np.arange(1, n + 1, dtype=np.uint64))
    return np.argsort(sort_keys, kind="stable").astype(np.int64)


def graph_constant(value: int) -> Any:
    """``value`` modulo 2**64 as a uint64 tensor."""
    import tensorflow as tf

    return tf.constant(value & MASK64, tf.uint64)


def graph_mix(x: Any) -> Any:
    """:func:`mix` in TF ops, on a uint64 tensor."""
    import tensorflow as tf

    shift, xor = tf.bitwise.right_shift, tf.bitwise.bitwise_xor
    x = xor(x, shift(x, graph_constant(30))) * graph_constant(0xBF58476D1CE4E5B9)
    x = xor(x, shift(x, graph_constant(27))) * graph_constant(0x94D049BB133111EB)
    return xor(x, shift(x, graph_constant(31)))


def graph_key(*parts: Any) -> Any:
    """:func:`key` in TF ops (a uint64 scalar); ``parts`` are non-negative ints or int64 tensors."""
    import tensorflow as tf

    folded = graph_constant(_ROOT)
    for part in parts:
        part = graph_constant(part) if isinstance(part, int) else tf.bitcast(tf.cast(part, tf.int64), tf.uint64)
        folded = graph_mix(tf.bitwise.bitwise_xor(folded, part) + graph_constant(GOLDEN))
    return folded


def graph_hashes(seed: Any, index: Any) -> Any:
    """:func:`hashes` in TF ops: ``seed`` an int or a uint64 tensor, ``index`` a uint64 tensor."""
    import tensorflow as tf

    seed = graph_constant(seed) if isinstance(seed, int) else seed
    return graph_mix(tf.bitwise.bitwise_xor(index * graph_constant(GOLDEN), seed))


def graph_permutation(n: int, *keys: Any) -> Any:
    """:func:`permutation` in TF ops (an int64 tensor); ``keys`` are non-negative ints or int64 tensors.

    Example:
        >>> import tensorflow as tf
        >>> graph_permutation(300, 7, tf.constant(2, tf.int64)).numpy().tolist() == permutation(300, 7, 2).tolist()
        True
    """
    import tensorflow as tf

    sort_keys = graph_hashes(graph_key(*keys), tf.bitcast(tf.range(1, n + 1, dtype=tf.int64), tf.uint64))
    signed = tf.bitcast(tf.bitwise.bitwise_xor(sort_keys, graph_constant(1 << 63)), tf.int64)  # Unsigned order.
    return tf.cast(tf.argsort(signed, stable=True), tf.int64)
