"""SplitMix64, the hash behind every resumable order, in two forms that agree bit for bit: NumPy and TF graph ops.

The epoch order (:mod:`tfdist.data.order.epoch`) and the stratified draws (:mod:`tfdist.data.order.strata`)
are computed in NumPy on the coordinator and on a resume; parameter-server workers run no Python, so they
compute the same numbers in graph ops (:mod:`tfdist.data.order.claims`). Each function here has a
``graph_`` twin with the same arguments and results:

* :func:`key` folds integers into one 64-bit key, order-sensitive (:func:`graph_key`);
* :func:`hashes` gives the ``i``-th hash of a key, for an array of ``i`` (:func:`graph_hashes`);
* :func:`permutation` sorts ``range(n)`` by those hashes (:func:`graph_permutation`);
* :func:`bijection` maps positions to a keyed permutation of ``range(n)`` one by one, without
  materializing it (:func:`graph_bijection`): a Feistel network over the smallest even number of bits
  that holds ``n``, cycle-walked back into ``range(n)``, so any position costs O(1) whatever ``n``.

The mixing function is SplitMix64's finalizer (wrapping uint64 arithmetic): the same numbers on every
platform and NumPy or TF version, so a backup resumes on another machine.

Example:
    >>> import numpy as np
    >>> permutation(8, 3, 0).tolist()
    [1, 2, 0, 6, 3, 4, 7, 5]
    >>> key(1, 2) != key(2, 1)
    True
    >>> bijection(np.arange(8), 8, 3, 0).tolist()
    [4, 1, 5, 3, 7, 2, 6, 0]
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []

GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: SplitMix64's increment.
MASK64 = (1 << 64) - 1
_ROOT = 0x2545F4914F6CDD1D  # The key of no integers.
ROUNDS = 6  # Feistel rounds of a bijection (4 already pass as a pseudo-random permutation; 6 for margin).


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


def _halves(n: int) -> int:
    """Bits per Feistel half for a domain holding ``range(n)``: at most 4n values, so a walk is short."""
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _round_keys(*keys: int) -> list[int]:
    return [key(*keys, 0xFE15, r) for r in range(ROUNDS)]


def bijection(index: Any, n: int, *keys: int) -> Any:
    """Where positions ``index`` (int64 array, each in ``[0, n)``) go in a permutation of ``range(n)``
    that depends on ``keys`` only (int64 array): O(1) per position, nothing of size ``n`` is built.

    Example:
        >>> import numpy as np
        >>> sorted(bijection(np.arange(1000), 1000, 5, 1).tolist()) == list(range(1000))
        True
    """
    import numpy as np

    x = np.asarray(index, np.int64).astype(np.uint64)
    if n <= 1:
        return x.astype(np.int64)
    half = np.uint64(_halves(n))
    mask = np.uint64((1 << int(half)) - 1)
    rounds = _round_keys(*keys)
    todo = np.ones(x.shape, bool)
    while todo.any():  # Cycle-walking: apply the network again to what fell outside range(n).
        y = x[todo]
        left, right = y >> half, y & mask
        for k in rounds:
            left, right = right, left ^ (hashes(k, right) & mask)
        x[todo] = (left << half) | right
        todo[todo] = x[todo] >= np.uint64(n)
    return x.astype(np.int64)


def graph_bijection(index: Any, n: int, *keys: Any) -> Any:
    """:func:`bijection` in TF ops: ``index`` an int64 tensor, ``keys`` non-negative ints or int64 tensors.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> at = np.arange(0, 10**6, 997)
        >>> graph_bijection(tf.constant(at), 10**6, 7, tf.constant(2, tf.int64)).numpy().tolist() == (
        ...     bijection(at, 10**6, 7, 2).tolist())
        True
    """
    import tensorflow as tf

    index = tf.cast(index, tf.int64)
    if n <= 1:
        return index
    half = graph_constant(_halves(n))
    mask = graph_constant((1 << _halves(n)) - 1)
    rounds = [graph_key(*keys, 0xFE15, r) for r in range(ROUNDS)]
    shift, xor, both = tf.bitwise.right_shift, tf.bitwise.bitwise_xor, tf.bitwise.bitwise_and

    def network(x: Any) -> Any:
        left, right = shift(x, half), both(x, mask)
        for k in rounds:
            left, right = right, xor(left, both(graph_hashes(k, right), mask))
        return tf.bitwise.bitwise_or(tf.bitwise.left_shift(left, half), right)

    def beyond(x: Any) -> Any:  # Compared as int64: the domain is below 2**63 for any n of blocks.
        return tf.bitcast(x, tf.int64) >= n

    def outside(x: Any) -> Any:
        return tf.reduce_any(beyond(x))

    def walk(x: Any) -> Any:  # Every element walks until all are inside: the ones inside stay put.
        return (tf.where(beyond(x), network(x), x),)

    start = network(tf.bitcast(index, tf.uint64))
    (done,) = tf.while_loop(outside, walk, (start,))
    return tf.bitcast(done, tf.int64)
