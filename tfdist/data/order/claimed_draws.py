"""Stratified draws under parameter servers: global step ``g`` trains draws ``g*B .. (g+1)*B`` of one stream.

One input pipeline's stratified draws (:mod:`tfdist.data.order.strata`, the sequence of pipeline 0 of 1)
are the cluster's: whichever worker claims global step ``g`` (:func:`~tfdist.data.order.claims.claim_next`)
trains that step's ``B`` draws, so ``E`` epochs of ``S`` steps train exactly the records one process reading
the same pipeline trains in ``E*S`` batches. The workers run no Python: the class of draw ``k`` is the
SplitMix64 hash :func:`~tfdist.data.order.strata.graph_classes`, and the record of a class's ``j``-th draw
is position ``j`` of that class's endless epoch order (epoch ``j // N``, its block permutation and window
permutation) computed in graph ops, as the NumPy order computes them.

Where a step's draws stand in each class is the count of every earlier draw of that class: each worker
counts the draws between its claims (hashes only, no record is read), from its last claim on. A restore
sets the counter and, beside it, the draw counts at the restored step (NumPy, on the coordinator), where a
worker starting then begins to count.

A step reads each draw's record from its block's byte offset (a run of consecutive records of one file is
one piece): nothing is read ahead of the claim.

Example (one process: the claims run in order):
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tfdist.data import write_tfrecords
    >>> from tfdist.data.order.epoch import EpochOrder
    >>> from tfdist.data.order.strata import StrataOrder
    >>> prefix = os.path.join(tempfile.mkdtemp(), "part")
    >>> groups = [write_tfrecords([tf.train.Example()] * n, f"{prefix}{n}", num_shards=1) for n in (6, 2)]
    >>> classes = tuple(EpochOrder(counts=(n,), block=2, streams=1, window=0, seed=1) for n in (6, 2))
    >>> order = StrataOrder(labels=("a", "b"), counts=(6, 2), mix=(0.5, 0.5), seed=3, num_workers=1, share=8,
    ...                     orders=classes)
    >>> counter, base = tf.Variable(0, dtype=tf.int64), tf.Variable([0, 0, 0], dtype=tf.int64)
    >>> steps = claimed_draws(order, groups, compression="", global_batch=4, counter=counter, base=base,
    ...                       passes=1)
    >>> [int(batch.shape[0]) for batch in steps], int(counter.numpy())
    ([4, 4], 3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfdist.data.order import splitmix
from tfdist.data.order.claims import MAX_BLOCKS, claimed_indices, read_steps
from tfdist.data.order.epoch import EpochOrder
from tfdist.data.order.strata import StrataOrder, draw_counts, graph_classes
from tfdist.errors import DataError, invalid

__all__: list[str] = []

_COUNT_CHUNK = 1 << 20  # Draws a worker counts per graph pass on its way to a claimed step.


def base_counts(order: StrataOrder, step: int, global_batch: int) -> list[int]:
    """What the ``base`` variable of :func:`claimed_draws` holds for a restore at global step ``step``:
    the first draw of that step, then how many draws before it each class took.

    Example:
        >>> from tfdist.data.order.epoch import EpochOrder
        >>> one = EpochOrder(counts=(4,), block=2, streams=1, window=0, seed=1)
        >>> order = StrataOrder(labels=("a", "b"), counts=(4, 4), mix=(0.5, 0.5), seed=3, num_workers=1,
        ...                     share=8, orders=(one, one))
        >>> base_counts(order, 2, 4)
        [8, 2, 6]
    """
    first = step * global_batch
    return [first, *(int(c) for c in draw_counts(order.mix, seed=order.seed, worker=0, upto=first))]


def claimed_draws(
    order: StrataOrder,
    class_paths: Sequence[Sequence[str]],
    *,
    compression: str,
    global_batch: int,
    counter: Any,
    base: Any,
    passes: int | None,
    finish: Callable[[Any], Any] | None = None,
) -> Any:
    """One element per claimed global step: the batch of its draws, in draw order.

    Args:
      order: The stratified order of one pipeline (``num_workers=1``; each class's order one stream).
      class_paths: Each class's files, in its order's listing order.
      compression: The files' compression ('' for none).
      global_batch: Draws per global step.
      counter: An int64 ``tf.Variable`` (on a parameter server): the next global step to claim.
      base: An int64 ``tf.Variable`` of ``1 + classes`` values (on a parameter server): :func:`base_counts`
        of the step the counter was last set to (zeros at the start).
      passes: Epochs of ``order.share`` draws to take (None: endless).
      finish: Turns the dataset of a step's serialized records into a dataset of one element, its batch.
    """
    import tensorflow as tf

    blocks = sum(len(one._blocks) for one in order.orders)
    if blocks > MAX_BLOCKS:
        raise invalid(
            DataError,
            "order_block",
            order.orders[0].block,
            f"blocks of enough records to make at most {MAX_BLOCKS} blocks over the class groups (now {blocks})",
            "Under parameter servers the block tables travel to every worker in the graph: use a larger order_block.",
        )
    firsts = [0]
    for paths in class_paths:
        firsts.append(firsts[-1] + len(paths))
    limit = None if passes is None else passes * order.share
    step = _step_pieces(order, firsts, global_batch, limit, base)
    start = (tf.constant(-1, tf.int64), tf.zeros([len(order.orders)], tf.int64), *(_empty(o) for o in order.orders))
    claims = claimed_indices(counter, None if limit is None else -(-limit // global_batch))
    pieces = claims.scan(start, tf.autograph.experimental.do_not_convert(step))
    paths = [path for group in class_paths for path in group]
    return read_steps(pieces, paths, compression=compression, global_batch=global_batch, finish=finish)


def _empty(order: EpochOrder) -> tuple[Any, Any, Any]:
    """No epoch's blocks cached yet: (epoch -1, blocks, their first positions)."""
    import tensorflow as tf

    n = len(order._blocks)
    return (tf.constant(-1, tf.int64), tf.zeros([n, 4], tf.int64), tf.zeros([n + 1], tf.int64))


def _step_pieces(
    order: StrataOrder, firsts: Sequence[int], batch: int, limit: int | None, base: Any
) -> Callable[[Any, Any], Any]:
    """The scan function: (draws counted, each class's cached epoch blocks; claimed step) -> the step's pieces."""
    import tensorflow as tf

    classes = graph_classes(order.mix, seed=order.seed, worker=0)
    count = len(order.orders)
    locators = [_locator(one, firsts[c]) for c, one in enumerate(order.orders)]

    def from_base(first: Any) -> tuple[Any, Any]:
        saved = tf.raw_ops.ReadVariableOp(resource=base.handle, dtype=tf.int64)
        zero = (tf.constant(0, tf.int64), tf.zeros([count], tf.int64))
        return tf.cond(saved[0] <= first, lambda: (saved[0], saved[1:]), lambda: zero)

    def counted(at: Any, counts: Any, first: Any) -> tuple[Any, Any]:
        """How many draws before ``first`` each class took, counted on from ``at`` (or from the base)."""
        at, counts = tf.cond((at < 0) | (first < at), lambda: from_base(first), lambda: (at, counts))

        def more(at: Any, counts: Any) -> tuple[Any, Any]:
            n = tf.minimum(tf.constant(_COUNT_CHUNK, tf.int64), first - at)
            drawn = tf.cast(classes(at, n), tf.int32)
            return at + n, counts + tf.math.bincount(drawn, minlength=count, maxlength=count, dtype=tf.int64)

        return tf.while_loop(lambda at, _: at < first, more, (at, counts))

    def step(state: Any, claimed: Any) -> Any:
        at, counts, caches = state[0], state[1], state[2:]
        first = claimed * batch
        at, counts = counted(at, counts, first)
        size = (
            tf.constant(batch, tf.int64) if limit is None else tf.minimum(tf.constant(batch, tf.int64), limit - first)
        )
        drawn = classes(first, size)
        taken = tf.one_hot(drawn, count, dtype=tf.int64)
        # The position of each draw in its class's endless order: that class's draws before it.
        index = tf.gather(counts, drawn) + tf.gather(tf.cumsum(taken, axis=0, exclusive=True), drawn, batch_dims=1)
        columns = [tf.zeros(tf.shape(drawn), tf.int64) for _ in range(4)]  # file, record, byte offset, skip
        cached = []
        for c, locate in enumerate(locators):
            where = tf.where(tf.equal(drawn, c))
            found, cache = locate(tf.gather_nd(index, where), caches[c])
            cached.append(cache)
            columns = [tf.tensor_scatter_nd_update(column, where, f) for column, f in zip(columns, found)]
        file, record, offset, skip = columns
        # Consecutive records of one file become one piece: read from the first one's place, `take` records.
        fresh = tf.concat([[True], (file[1:] != file[:-1]) | (record[1:] != record[:-1] + 1)], 0)
        run = tf.cumsum(tf.cast(fresh, tf.int64)) - 1
        take = tf.math.bincount(tf.cast(run, tf.int32), dtype=tf.int64)
        pieces = (*(tf.boolean_mask(column, fresh) for column in (file, offset, skip)), take)
        return (first + size, counts + tf.reduce_sum(taken, 0), *cached), pieces

    return step


def _locator(order: EpochOrder, first_file: int) -> Callable[[Any, Any], Any]:
    """A graph function: (positions in the class's endless order, cached epoch blocks) -> ((file, record,
    byte offset, skip) of each, the new cache). Files are numbered from ``first_file``."""
    import numpy as np
    import tensorflow as tf

    rows = order._blocks + np.asarray([first_file, 0, 0, 0], np.int64)
    table = tf.constant(rows, tf.int64)  # (file, first record, count, byte offset or -1)
    n, records, window = len(rows), order.num_records, order.window
    windowed = bool(order.shuffle and window)
    windows = -(-records // window) if windowed else 1
    width = min(window, records)
    plain = tf.autograph.experimental.do_not_convert

    def epoch_blocks(epoch: Any) -> tuple[Any, Any]:
        blocks = tf.gather(table, splitmix.graph_permutation(n, order.seed, epoch)) if order.shuffle else table
        return blocks, tf.concat([[0], tf.cumsum(blocks[:, 2])], 0)

    def in_window(keys: Any) -> Any:  # The permutation of window w of epoch e (key e * windows + w), padded.
        epoch, w = keys // windows, keys % windows
        length = tf.minimum(tf.constant(window, tf.int64), records - w * window)
        permuted = splitmix.graph_permutation(length, order.seed, epoch, 0, w)
        return tf.ensure_shape(tf.pad(permuted, [[0, width - length]]), [width])

    def locate(index: Any, cache: Any) -> Any:
        epoch, at = index // records, index % records
        if windowed:  # Position `at` of the stream holds record begin + permutation[at - begin] of its window.
            begin = at // window * window
            keys, slot = tf.unique(epoch * windows + at // window, out_idx=tf.int64)
            permutations = tf.map_fn(plain(in_window), keys, fn_output_signature=tf.TensorSpec([width], tf.int64))
            at = begin + tf.gather_nd(permutations, tf.stack([slot, at - begin], 1))
        epochs, slot = tf.unique(epoch, out_idx=tf.int64)
        cached_epoch, cached_blocks, cached_starts = cache

        def one_epoch(e: Any) -> Any:  # Every position looked up in epoch e's blocks (those of e are kept).
            blocks, starts = tf.cond(
                tf.equal(e, cached_epoch), lambda: (cached_blocks, cached_starts), lambda: epoch_blocks(e)
            )
            i = tf.clip_by_value(tf.searchsorted(starts, at, side="right") - 1, 0, n - 1)
            row = tf.gather(blocks, i)
            inside = at - tf.gather(starts, i)
            seek = row[:, 3] >= 0
            found = (
                row[:, 0],
                row[:, 1] + inside,
                tf.where(seek, row[:, 3], 0),
                tf.where(seek, inside, row[:, 1] + inside),
            )
            return found, blocks, starts

        def lookup() -> Any:
            spec = tf.TensorSpec([None], tf.int64)
            found, blocks, starts = tf.map_fn(
                plain(one_epoch),
                epochs,
                fn_output_signature=((spec,) * 4, tf.TensorSpec([n, 4], tf.int64), tf.TensorSpec([n + 1], tf.int64)),
            )
            pick = tf.stack([slot, tf.range(tf.size(slot, out_type=tf.int64))], 1)
            # Epochs come in order: the last one is the one the next step goes on in.
            return tuple(tf.gather_nd(column, pick) for column in found), (epochs[-1], blocks[-1], starts[-1])

        none = tf.zeros([0], tf.int64)
        found, cache = tf.cond(tf.size(epochs) > 0, lookup, lambda: ((none,) * 4, tuple(cache)))  # No draw here.
        return found, cache

    return locate
