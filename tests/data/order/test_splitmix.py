"""SplitMix64: pinned numbers, and the graph form equal to the NumPy form for every function."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.data.order import splitmix


def test_permutations_are_fixed_numbers() -> None:
    # Pinned: a backup must resume in the same order after an upgrade of NumPy or on another machine.
    assert splitmix.permutation(8, 3, 0).tolist() == PINNED
    assert sorted(splitmix.permutation(1000, 1, 2).tolist()) == list(range(1000))
    assert splitmix.permutation(50, 1, 2).tolist() != splitmix.permutation(50, 1, 3).tolist()
    assert splitmix.permutation(0, 1).tolist() == []


PINNED = [1, 2, 0, 6, 3, 4, 7, 5]


def test_the_graph_permutation_is_numpys_for_any_key() -> None:
    for n, keys in ((1, (0, 0)), (7, (3, 9)), (1000, (2**40, 5)), (257, (0,))):
        tensors = [tf.constant(k, tf.int64) if i else k for i, k in enumerate(keys)]  # An int and a tensor.
        assert splitmix.graph_permutation(n, *tensors).numpy().tolist() == splitmix.permutation(n, *keys).tolist()


def test_the_graph_key_and_hashes_are_numpys() -> None:
    for parts in ((), (0,), (7, 2**40), (2**63 - 1, 1, 0x5747)):
        assert int(tf.bitcast(splitmix.graph_key(*parts), tf.int64).numpy()) % 2**64 == splitmix.key(*parts)
    seed = splitmix.key(3, 1)
    index = np.arange(1, 65, dtype=np.uint64)
    graph = splitmix.graph_hashes(seed, tf.constant(index, tf.uint64))
    assert tf.bitcast(graph, tf.int64).numpy().tolist() == splitmix.hashes(seed, index).view(np.int64).tolist()
