"""Stratified draws under parameter servers: global step ``g`` trains draws ``g*B .. (g+1)*B`` of one stream.

One input pipeline's stratified draws (:mod:`tfdist.data.order.strata`, the sequence of pipeline 0 of 1)
are the cluster's: whichever worker claims global step ``g`` (:func:`~tfdist.data.order.claims.claim_next`)
trains that step's ``B`` draws, so ``E`` epochs of ``S`` steps train exactly the records one process reading
the same pipeline trains in ``E*S`` batches. The workers run no Python: the class of draw ``k`` is the
SplitMix64 hash :func:`~tfdist.data.order.strata.graph_classes`, and the record of a class's ``j``-th draw
is position ``j`` of that class's endless epoch order (epoch ``j // N``): its window permutation, then the
record at that position of the epoch's permuted blocks (:func:`~tfdist.data.order.claims.graph_records`,
O(1) a draw), computed in graph ops as the NumPy order computes them.

Where a step's draws stand in each class is the count of every earlier draw of that class: each worker
counts the draws between its claims (hashes only, no record is read), from its last claim on (a step
given back, before it, from the restored step or from the start). A restore
sets the counter and, beside it, the draw counts at the restored step (NumPy, on the coordinator), where a
worker starting then begins to count.

A step reads each draw's record from the nearest known byte offset at or before it
(:func:`~tfdist.data.order.claims.locator`): the draws of one file at most :data:`SPAN_GAP` records apart are
one piece, read whole (a step's draws of a class fall in one shuffle window of it: a reader per draw cost
more than the records between them), and the draws are gathered from the pieces' records. Nothing is read
ahead of the claim.

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
from tfdist.data.order.claims import MAX_BLOCKS, claimed_indices, graph_records, graph_spans, locator, read_steps
from tfdist.data.order.epoch import EpochOrder
from tfdist.data.order.strata import StrataOrder, draw_counts, graph_classes
from tfdist.errors import DataError, invalid

__all__: list[str] = []

_COUNT_CHUNK = 1 << 20  # Draws a worker counts per graph pass on its way to a claimed step.
_LOCATED = 1 << 20  # Byte offsets of located records held in the workers' graph at most, all classes (8 MB).
SPAN_GAP = 32  # Records between two draws of one file read with them rather than by a reader of their own.


def draw_grid(records: int | None, block: int, classes: int = 1) -> int:
    """Records between two located records (whose byte offsets the workers hold) of one of ``classes``
    classes, this one of ``records``: a draw is read from the nearest located record at or before it, so
    every record while the classes' share of :data:`_LOCATED` allows, else every 2nd, 4th, ... record, at
    most every ``block``-th (unknown counts: that).

    Example:
        >>> draw_grid(6000, 256, 8), draw_grid(10**7, 256, 8), draw_grid(None, 256)
        (1, 128, 256)
    """
    grid, share = 1, max(1, _LOCATED // max(1, classes))
    while grid < block and (records is None or records > grid * share):
        grid *= 2
    return min(grid, block)


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
    worker: Any = 0,
) -> Any:
    """One element per claimed global step: the batch of its draws, in draw order.

    Args:
      order: The stratified order of one pipeline (``num_workers=1``; each class's order one stream).
      class_paths: Each class's files, in its order's listing order.
      compression: The files' compression ('' for none).
      global_batch: Draws per global step.
      counter: An int64 ``tf.Variable`` (on a parameter server): the next global step to claim; or a
        :class:`~tfdist.data.order.ledger.StepLedger` (steps given back first, in any order).
      base: An int64 ``tf.Variable`` of ``1 + classes`` values (on a parameter server): :func:`base_counts`
        of the step the counter was last set to (zeros at the start).
      passes: Epochs of ``order.share`` draws to take (None: endless).
      finish: Turns the dataset of the steps' serialized records (one vector per step) into their batches.
      worker: The claiming worker's index (int64), which a ledger records.
    """
    import tensorflow as tf

    blocks = sum(0 if one.offsets is None else len(one.offsets) for one in order.orders)
    if blocks > MAX_BLOCKS:
        raise invalid(
            DataError,
            "order_block",
            order.orders[0].block,
            f"blocks of enough records to make at most {MAX_BLOCKS} blocks over the class groups (now {blocks})",
            "Under parameter servers the byte offsets of the blocks travel to every worker in the graph: use a "
            "larger order_block.",
        )
    limit = None if passes is None else passes * order.share
    step = _step_pieces(order, [len(paths) for paths in class_paths], global_batch, limit, base)
    start = (tf.constant(-1, tf.int64), tf.zeros([len(order.orders)], tf.int64))
    # The base comes with each claim, from the same call to the ps: the scan itself runs on the worker alone.
    claims = claimed_indices(counter, None if limit is None else -(-limit // global_batch), worker, also=base)
    plain = tf.autograph.experimental.do_not_convert
    locate = _class_locator(order, class_paths)
    pieces = claims.scan(start, plain(lambda state, claim: step(state, *claim)))
    pieces = pieces.map(plain(lambda spans, place: (*locate(*spans), place)))
    return read_steps(pieces, compression=compression, global_batch=global_batch, finish=finish)


def _class_locator(order: StrataOrder, class_paths: Sequence[Sequence[str]]) -> Callable[..., Any]:
    """A graph function over a step's pieces, ``(class, file of the class, first record of the class's listing,
    records) -> (path, byte offset, records to skip, records, bytes to read at once)``: each class's pieces
    located by that class's :func:`~tfdist.data.order.claims.locator`."""
    import tensorflow as tf

    locators = [locator(one, paths, None) for one, paths in zip(order.orders, class_paths)]

    def locate(label: Any, file: Any, record: Any, take: Any) -> Any:
        parts = tf.dynamic_partition(tf.range(tf.size(label)), tf.cast(label, tf.int32), len(locators))
        found = [at(tf.gather(file, p), tf.gather(record, p), tf.gather(take, p)) for at, p in zip(locators, parts)]
        return tuple(tf.dynamic_stitch(parts, [one[k] for one in found]) for k in range(5))

    return locate


def _step_pieces(
    order: StrataOrder, files: Sequence[int], batch: int, limit: int | None, base: Any
) -> Callable[[Any, Any, Any], Any]:
    """The scan function: (the draws counted, each class's count; claimed step, the base read with it) -> the
    step's pieces (class, file of the class, first record of the class's listing, records) and each draw's
    place among their records."""
    import numpy as np
    import tensorflow as tf

    classes = graph_classes(order.mix, seed=order.seed, worker=0)
    count = len(order.orders)
    records_of = [_records(one) for one in order.orders]
    class_starts = [tf.constant(one.starts, tf.int64) for one in order.orders]  # Each file's first record.
    firsts = tf.constant(np.concatenate([[0], np.cumsum(files)[:-1]]), tf.int64)  # Files numbered over classes.

    def from_base(first: Any, saved: Any) -> tuple[Any, Any]:
        zero = (tf.constant(0, tf.int64), tf.zeros([count], tf.int64))
        return tf.cond(saved[0] <= first, lambda: (saved[0], saved[1:]), lambda: zero)

    def counted(at: Any, counts: Any, first: Any, saved: Any) -> tuple[Any, Any]:
        """How many draws before ``first`` each class took, counted on from ``at`` (or from the base)."""
        at, counts = tf.cond((at < 0) | (first < at), lambda: from_base(first, saved), lambda: (at, counts))

        def more(at: Any, counts: Any) -> tuple[Any, Any]:
            n = tf.minimum(tf.constant(_COUNT_CHUNK, tf.int64), first - at)
            drawn = tf.cast(classes(at, n), tf.int32)
            return at + n, counts + tf.math.bincount(drawn, minlength=count, maxlength=count, dtype=tf.int64)

        return tf.while_loop(lambda at, _: at < first, more, (at, counts))

    def step(state: Any, claimed: Any, saved: Any) -> Any:
        at, counts = state
        first = claimed * batch
        at, counts = counted(at, counts, first, saved)
        size = (
            tf.constant(batch, tf.int64) if limit is None else tf.minimum(tf.constant(batch, tf.int64), limit - first)
        )
        drawn = classes(first, size)
        taken = tf.one_hot(drawn, count, dtype=tf.int64)
        # The position of each draw in its class's endless order: that class's draws before it.
        index = tf.gather(counts, drawn) + tf.gather(tf.cumsum(taken, axis=0, exclusive=True), drawn, batch_dims=1)
        file, record = tf.zeros(tf.shape(drawn), tf.int64), tf.zeros(tf.shape(drawn), tf.int64)
        for c, (records, starts) in enumerate(zip(records_of, class_starts)):
            where = tf.where(tf.equal(drawn, c))
            found = records(tf.gather_nd(index, where))
            record = tf.tensor_scatter_nd_update(record, where, found)
            at = tf.searchsorted(starts, found, side="right", out_type=tf.int64) - 1
            file = tf.tensor_scatter_nd_update(file, where, at)
        # Spans within one file of one class; ``place``: each draw among the spans' records.
        order, fresh, take, place = graph_spans(tf.gather(firsts, drawn) + file, record, SPAN_GAP)
        spans = (*(tf.boolean_mask(tf.gather(column, order), fresh) for column in (drawn, file, record)), take)
        return (first + size, counts + tf.reduce_sum(taken, 0)), (spans, place)

    return step


def _records(order: EpochOrder) -> Callable[[Any], Any]:
    """A graph function: positions in the class's endless order (stream 0 of every epoch, one after the
    other) -> the records of the class's listing there (int64)."""
    import tensorflow as tf

    length, window = order.stream_lengths[0], order.window
    windowed = bool(order.shuffle and window)
    windows = -(-length // window) if windowed else 1
    width = min(window, length)
    records_at = graph_records(order)

    def in_windows(keys: Any) -> Any:  # The permutations of windows w of epochs e (keys e * windows + w), one a row.
        epoch, w = keys // windows, keys % windows
        size = tf.minimum(tf.constant(window, tf.int64), length - w * window)
        return _graph_permutations(width, size, order.seed, epoch, tf.zeros_like(epoch), w)

    def records(index: Any) -> Any:
        epoch, at = index // length, index % length
        if windowed:  # Position `at` of the stream holds position begin + permutation[at - begin] of its window.
            begin = at // window * window
            keys, slot = tf.unique(epoch * windows + at // window, out_idx=tf.int64)
            at = begin + tf.gather_nd(in_windows(keys), tf.stack([slot, at - begin], 1))
        return records_at(epoch, at)  # Stream 0 starts at position 0 of the epoch.

    return records


def _graph_permutations(width: int, sizes: Any, *keys: Any) -> Any:
    """:func:`~tfdist.data.order.splitmix.graph_permutation` of ``sizes[i]`` under the keys ``keys[j][i]``, one
    row each (int64 vectors, ``sizes`` at most ``width``), in one pass: row ``i`` is that permutation, then the
    places from ``sizes[i]`` on.

    Example:
        >>> import tensorflow as tf
        >>> rows = _graph_permutations(5, tf.constant([5, 3], tf.int64), 7, tf.constant([2, 4], tf.int64))
        >>> want = [splitmix.graph_permutation(n, 7, tf.constant(e, tf.int64)).numpy().tolist() for n, e in ((5, 2), (3, 4))]
        >>> [row[:n] for row, n in zip(rows.numpy().tolist(), (5, 3))] == want
        True
    """
    import tensorflow as tf

    key = splitmix.graph_key(*keys)[:, None]
    places = tf.bitcast(tf.range(1, width + 1, dtype=tf.int64), tf.uint64)[None, :]
    hashed = splitmix.graph_hashes(key, places)
    signed = tf.bitcast(tf.bitwise.bitwise_xor(hashed, splitmix.graph_constant(1 << 63)), tf.int64)
    beyond = tf.range(width, dtype=tf.int64)[None, :] >= sizes[:, None]
    signed = tf.where(beyond, tf.constant(tf.int64.max, tf.int64), signed)  # Sorted after the window's places.
    return tf.cast(tf.argsort(signed, axis=-1, stable=True), tf.int64)
