"""Parameter-server input that is one pass per epoch: each worker claims the next global step from a counter.

Under ParameterServerStrategy the coordinator sends each step to whichever worker is free, and TensorFlow
hands every worker's dataset function the same single-pipeline ``InputContext``: a dataset sharded by
worker cannot know how many steps its worker will run, and an unsharded one is read once per worker.
Here every worker's dataset takes the next global step ``g`` from one int64 variable on a parameter
server (an atomic fetch-and-add, :func:`claim_next`) at the moment a step asks for its batch, and reads step ``g``'s records
of the epoch order: data epoch ``g // steps_per_pass``, step ``g % steps_per_pass``. Each global step is
claimed by exactly one step run, whichever worker runs it, so an epoch of ``steps_per_pass`` steps trains
every record once.

The order is :class:`~tfdist.data.order.epoch.EpochOrder` without windows: a step takes ``b`` consecutive
records of every stream of the epoch's permuted blocks. It is computed in the graph (workers run no
Python): the block permutation is the same SplitMix64 sort as :func:`~tfdist.data.order.splitmix.permutation`,
so the coordinator's NumPy order and a worker's graph agree record for record.

Nothing may read ahead of the claim, or a worker would hold steps another one needs: the reader claims,
then reads and parses the step's records inside one element; :func:`claim_options` turns off tf.data's
injected prefetch and map parallelization, and :func:`claim_input_options` the distributed iterator's
buffer.

Example (one process: the claims run in order):
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tfdist.data import write_tfrecords
    >>> from tfdist.data.order.epoch import EpochOrder
    >>> prefix = os.path.join(tempfile.mkdtemp(), "part")
    >>> paths = write_tfrecords([tf.train.Example() for _ in range(10)], prefix, num_shards=2)
    >>> order = EpochOrder(counts=(5, 5), block=1, streams=2, window=0, seed=4)
    >>> counter = tf.Variable(0, dtype=tf.int64)
    >>> steps = claimed_steps(order, paths, compression="", global_batch=4, counter=counter, passes=1)
    >>> [int(batch.shape[0]) for batch in steps], int(counter.numpy())
    ([4, 4, 2], 4)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfdist.data.order import splitmix
from tfdist.data.order.epoch import EpochOrder
from tfdist.errors import DataError, invalid

__all__: list[str] = []

MAX_BLOCKS = 1 << 22  # Blocks held as constants in the workers' graph (4M rows, 128 MB).
_BUFFER = 1 << 18
_NO_LIMIT = (1 << 63) - 1  # ResourceCountUpTo's bound: claims are bounded by take_while instead.


def steps_per_pass(order: EpochOrder, global_batch: int) -> int:
    """Global steps of one data epoch: ``b = global_batch // streams`` records of every stream each step.

    Example:
        >>> steps_per_pass(EpochOrder(counts=(480,), block=256, streams=12, window=0, seed=0), 24)
        20
    """
    return -(-max(order.stream_lengths) // (global_batch // order.streams))


def _check(order: EpochOrder, global_batch: int) -> None:
    if global_batch % order.streams:
        raise invalid(
            DataError,
            "order_streams",
            order.streams,
            f"a divisor of the global batch {global_batch}",
            "Each step takes the same number of records from every stream.",
        )
    blocks = len(order._blocks)
    if blocks > MAX_BLOCKS:
        raise invalid(
            DataError,
            "order_block",
            order.block,
            f"blocks of enough records to make at most {MAX_BLOCKS} blocks (now {blocks})",
            "Under parameter servers the block table travels to every worker in the graph: use a larger order_block.",
        )


def _step_pieces(order: EpochOrder, global_batch: int, spp: int) -> Callable[[Any, Any], Any]:
    """The scan function: (cached epoch blocks, claimed step) -> (new cache, the step's pieces)."""
    import numpy as np
    import tensorflow as tf

    per = global_batch // order.streams
    table = tf.constant(order._blocks, tf.int64)  # (file, first record, count, byte offset or -1)
    n = len(order._blocks)
    lengths = np.asarray(order.stream_lengths, np.int64)
    bases = np.asarray([j * order.num_records // order.streams for j in range(order.streams)], np.int64)
    rel = np.arange(per, dtype=np.int64)[None, :]  # Position of each record of a step inside its stream.
    stream_base, stream_length = tf.constant(bases[:, None] + rel), tf.constant(lengths[:, None] - rel)

    def epoch_blocks(epoch: Any) -> tuple[Any, Any]:
        blocks = tf.gather(table, splitmix.graph_permutation(n, order.seed, epoch)) if order.shuffle else table
        return blocks, tf.concat([[0], tf.cumsum(blocks[:, 2])], 0)

    def step(state: Any, claimed: Any) -> Any:
        cached, blocks, starts = state
        epoch, at = claimed // spp, claimed % spp
        blocks, starts = tf.cond(
            tf.equal(epoch, cached), lambda: (blocks, starts), lambda: epoch_blocks(epoch), name="epoch_blocks"
        )
        keep = at * per < stream_length  # The last step of an epoch may take fewer records of a stream.
        positions = tf.boolean_mask(stream_base + at * per, keep)
        block = tf.searchsorted(starts, positions, side="right") - 1
        # Runs of consecutive records of one block become one piece: read from its offset, `take` records.
        fresh = tf.concat([[True], (block[1:] != block[:-1]) | (positions[1:] != positions[:-1] + 1)], 0)
        run = tf.cumsum(tf.cast(fresh, tf.int64)) - 1
        first = tf.boolean_mask(positions, fresh)
        which = tf.boolean_mask(block, fresh)
        take = tf.math.bincount(tf.cast(run, tf.int32), dtype=tf.int64)
        rows = tf.gather(blocks, which)
        inside = first - tf.gather(starts, which)
        seek = rows[:, 3] >= 0
        offset = tf.where(seek, rows[:, 3], 0)
        skip = tf.where(seek, inside, rows[:, 1] + inside)
        return (epoch, blocks, starts), (rows[:, 0], offset, skip, take)

    return step


def claim_next(counter: Any) -> Any:
    """The counter's value before an atomic increment: concurrent claims never return the same step.

    ``assign_add(1, read_value=True)`` is two ops, an add and a read: two workers' adds can both land
    before either reads, and both then train the same step while the one before it is never claimed.
    ``ResourceCountUpTo`` reads and increments under the variable's lock in one kernel.

    Example:
        >>> import tensorflow as tf
        >>> counter = tf.Variable(5, dtype=tf.int64)
        >>> int(claim_next(counter)), int(counter.numpy())
        (5, 6)
    """
    import tensorflow as tf

    return tf.raw_ops.ResourceCountUpTo(resource=counter.handle, limit=_NO_LIMIT, T=tf.int64)


def claimed_steps(
    order: EpochOrder,
    paths: Sequence[str],
    *,
    compression: str,
    global_batch: int,
    counter: Any,
    passes: int | None,
    finish: Callable[[Any], Any] | None = None,
) -> Any:
    """One element per claimed global step: the batch of its records (``finish`` makes it, e.g. parsed).

    Args:
      order: The epoch order (its ``window`` is not used: a step reads consecutive records of each stream).
      paths: The files, in the order's listing order.
      compression: The files' compression ('' for none).
      global_batch: Records per global step.
      counter: An int64 ``tf.Variable`` (on a parameter server under PS): the next global step to claim.
      passes: Data epochs to read (None: endless).
      finish: Turns the dataset of a step's serialized records into a dataset of one element, its batch
        (default: ``records.batch(global_batch)``).
    """
    import tensorflow as tf

    _check(order, global_batch)
    spp = steps_per_pass(order, global_batch)
    n = len(order._blocks)
    start = (tf.constant(-1, tf.int64), tf.zeros([n, 4], tf.int64), tf.zeros([n + 1], tf.int64))
    claims = claimed_indices(counter, None if passes is None else passes * spp)
    pieces = claims.scan(start, tf.autograph.experimental.do_not_convert(_step_pieces(order, global_batch, spp)))
    return read_steps(pieces, paths, compression=compression, global_batch=global_batch, finish=finish)


def claimed_indices(counter: Any, steps: int | None) -> Any:
    """An endless dataset of the global steps claimed from ``counter`` (the first ``steps`` only: None, all)."""
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert
    claims = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    claims = claims.map(plain(lambda _: claim_next(counter)))
    return claims if steps is None else claims.take_while(plain(lambda g: g < steps))


def read_steps(
    pieces: Any,
    paths: Sequence[str],
    *,
    compression: str,
    global_batch: int,
    finish: Callable[[Any], Any] | None,
) -> Any:
    """Each step's batch from a dataset of its pieces ``(file, byte offset, records to skip, records to take)``,
    read in order after the claim (:func:`claim_options`)."""
    import tensorflow as tf

    from tfdist import _compat

    files = tf.constant(list(paths), tf.string)
    plain = tf.autograph.experimental.do_not_convert

    @plain
    def read_piece(file: Any, offset: Any, skip: Any, take: Any) -> Any:
        return _compat.tfrecord_reader_at(tf.gather(files, file), offset, compression, _BUFFER).skip(skip).take(take)

    @plain
    def read_step(file: Any, offset: Any, skip: Any, take: Any) -> Any:
        records = tf.data.Dataset.from_tensor_slices((file, offset, skip, take)).flat_map(read_piece)
        return finish(records) if finish is not None else records.batch(global_batch)  # The step: one element.

    return pieces.flat_map(read_step).with_options(claim_options())


def claim_options() -> Any:
    """``tf.data.Options`` under which nothing runs ahead of a claim (no injected prefetch, no parallel maps)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    options.experimental_optimization.map_parallelization = False
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def claim_input_options() -> Any:
    """``tf.distribute.InputOptions`` whose per-worker iterators buffer no element (each would be a claim)."""
    import tensorflow as tf

    return tf.distribute.InputOptions(experimental_fetch_to_device=False, experimental_per_replica_buffer_size=0)
