"""Parameter-server input that is one pass per epoch: each worker claims the next global step from a counter.

Under ParameterServerStrategy the coordinator sends each step to whichever worker is free, and TensorFlow
hands every worker's dataset function the same single-pipeline ``InputContext``: a dataset sharded by
worker cannot know how many steps its worker will run, and an unsharded one is read once per worker.
Here every worker's dataset takes the next global step ``g`` from one int64 variable on a parameter
server (an atomic fetch-and-add, :func:`claim_next`) at the moment a step asks for its batch, and reads step ``g``'s records
of the epoch order: data epoch ``g // steps_per_pass``, step ``g % steps_per_pass``. Each global step is
claimed by exactly one step run, whichever worker runs it, so an epoch of ``steps_per_pass`` steps trains
every record once. Under parameter servers the counter is a :class:`~tfdist.data.order.ledger.StepLedger`'s:
the steps a failed run had claimed are given back and claimed first, by whichever worker asks next.

The order is :class:`~tfdist.data.order.epoch.EpochOrder` without windows: a step takes ``b`` consecutive
records of every stream of the epoch's permuted blocks. It is computed in the graph (workers run no
Python): the block of each position is the same bijection as
:func:`~tfdist.data.order.splitmix.bijection` (:func:`~tfdist.data.order.splitmix.graph_bijection`),
so the coordinator's NumPy order and a worker's graph agree record for record, at O(1) per position.
The files' first records travel in the graph (8 bytes a file); the byte offsets of the blocks and the
file names too for up to :data:`MAX_BLOCKS` blocks, else they are read by range from the record index
(:mod:`tfdist.data.records.index`) a piece at a time. (That read is correct but slow today: TF's
``FixedLengthRecordDataset`` reads through the file up to the entry instead of seeking.)

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
from tfdist.data.order.ledger import StepLedger, count_up
from tfdist.data.records.index import RecordIndex
from tfdist.errors import DataError, invalid

__all__: list[str] = []

MAX_BLOCKS = 1 << 22  # Byte offsets held as constants in the workers' graph (4M, 32 MB); past that, an index.
_BUFFER = 1 << 18


def steps_per_pass(order: EpochOrder, global_batch: int) -> int:
    """Global steps of one data epoch: ``b = global_batch // streams`` records of every stream each step.

    Example:
        >>> steps_per_pass(EpochOrder(counts=(480,), block=256, streams=12, window=0, seed=0), 24)
        20
    """
    return -(-max(order.stream_lengths) // (global_batch // order.streams))


def _check(order: EpochOrder, global_batch: int, index: RecordIndex | None) -> None:
    if global_batch % order.streams:
        raise invalid(
            DataError,
            "order_streams",
            order.streams,
            f"a divisor of the global batch {global_batch}",
            "Each step takes the same number of records from every stream.",
        )
    blocks = 0 if order.offsets is None or index is not None else len(order.offsets)
    if blocks > MAX_BLOCKS:
        raise invalid(
            DataError,
            "order_block",
            order.block,
            f"blocks of enough records to make at most {MAX_BLOCKS} blocks (now {blocks})",
            "Without a record index the block offsets travel to every worker in the graph: build one "
            "(tfdist index 'FILES' --out data.tfindex) and pass files='data.tfindex', or use a larger order_block.",
        )


def graph_records(order: EpochOrder) -> Callable[[Any, Any], Any]:
    """A graph function ``(epoch, positions) -> records``: the listing's record (int64) at each position of
    ``epoch``'s permuted blocks, before windows (:meth:`~tfdist.data.order.epoch.EpochOrder.blocks_at`).

    ``epoch`` is an int64 scalar, or one epoch per position; O(1) per position whatever the data's size.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> order = EpochOrder(counts=(7, 6), block=3, streams=1, window=0, seed=2)
        >>> at = np.arange(13)
        >>> want = (order.blocks_at(4, 0, 5)[at // 3] * 3 + at % 3).tolist()
        >>> graph_records(order)(tf.constant(4, tf.int64), tf.constant(at)).numpy().tolist() == want
        True
    """
    import tensorflow as tf

    size, whole = order.block, order.permuted_blocks

    def records(epoch: Any, positions: Any) -> Any:
        place, inside = positions // size, positions % size
        if order.shuffle and whole > 1:  # The last, shorter block stays last.
            moved = splitmix.graph_bijection(tf.minimum(place, whole - 1), whole, order.seed, epoch)
            place = tf.where(place < whole, moved, place)
        return place * size + inside

    return records


def graph_runs(file: Any, records: Any) -> tuple[Any, Any]:
    """Where runs of consecutive records of one file start (a bool mask) and each run's length (int64):
    each run becomes one piece, read from its first record on.

    Example:
        >>> import tensorflow as tf
        >>> fresh, take = graph_runs(tf.constant([0, 0, 1, 1, 1]), tf.constant([3, 4, 9, 10, 2]))
        >>> fresh.numpy().tolist(), take.numpy().tolist()
        ([True, False, True, False, True], [2, 2, 1])
    """
    import tensorflow as tf

    fresh = tf.concat([[True], (file[1:] != file[:-1]) | (records[1:] != records[:-1] + 1)], 0)
    run = tf.cumsum(tf.cast(fresh, tf.int64)) - 1
    return fresh, tf.math.bincount(tf.cast(run, tf.int32), dtype=tf.int64)


def _step_pieces(order: EpochOrder, global_batch: int, spp: int) -> Callable[[Any], Any]:
    """The map function: claimed step -> the step's pieces (file, first record in the listing, records)."""
    import numpy as np
    import tensorflow as tf

    per = global_batch // order.streams
    starts = tf.constant(order.starts, tf.int64)  # Each file's first record in the listing (and the total).
    lengths = np.asarray(order.stream_lengths, np.int64)
    bases = np.asarray([j * order.num_records // order.streams for j in range(order.streams)], np.int64)
    rel = np.arange(per, dtype=np.int64)[None, :]  # Position of each record of a step inside its stream.
    stream_base, stream_length = tf.constant(bases[:, None] + rel), tf.constant(lengths[:, None] - rel)
    records_at = graph_records(order)

    def step(claimed: Any) -> Any:
        epoch, at = claimed // spp, claimed % spp
        keep = at * per < stream_length  # The last step of an epoch may take fewer records of a stream.
        records = records_at(epoch, tf.boolean_mask(stream_base + at * per, keep))
        file = tf.searchsorted(starts, records, side="right", out_type=tf.int64) - 1
        fresh, take = graph_runs(file, records)
        return tf.boolean_mask(file, fresh), tf.boolean_mask(records, fresh), take

    return step


def locator(order: EpochOrder, paths: Sequence[str], index: RecordIndex | None) -> Callable[[Any, Any], Any]:
    """A graph function ``(file, first record of the listing) -> (path, byte offset, records to skip there)``
    for one piece: from constants, or read by range from the record index."""
    import tensorflow as tf

    starts = tf.constant(order.starts, tf.int64)
    grid = order.offset_grid
    if index is None or order.offsets is None or len(order.offsets) <= MAX_BLOCKS:  # Small enough: constants.
        names = tf.constant(list(paths), tf.string)
        table = None if order.offsets is None else tf.constant(order.offsets, tf.int64)

        def name_of(file: Any) -> Any:
            return tf.gather(names, file)

        def offset_of(point: Any) -> Any:
            assert table is not None
            return tf.gather(table, point)
    else:
        (names_at, width), (offsets_at, _) = index.places["names"], index.places["offsets"]
        directory = index.root + "/" if index.root else ""

        def entry(at: Any, size: int) -> Any:  # ``size`` bytes of the index from byte ``at``: one record.
            read = tf.data.FixedLengthRecordDataset(
                index.path, size, header_bytes=at, footer_bytes=index.nbytes - at - size, buffer_size=size
            )
            return read.get_single_element()

        def name_of(file: Any) -> Any:
            name = tf.strings.regex_replace(entry(names_at + file * width, width), "\x00+$", "")
            return tf.strings.join([directory, name])

        def offset_of(point: Any) -> Any:
            return tf.reshape(tf.io.decode_raw(entry(offsets_at + point * 8, 8), tf.int64, little_endian=True), [])

    def locate(file: Any, record: Any) -> Any:
        start = starts[file]
        first = record - start
        point = record // grid
        if order.offsets is None:
            return name_of(file), tf.constant(0, tf.int64), first
        seek = (first > 0) & (point * grid >= start)
        offset = tf.cond(seek, lambda: offset_of(point), lambda: tf.constant(-1, tf.int64))
        seek = offset >= 0
        return name_of(file), tf.where(seek, offset, 0), tf.where(seek, record - point * grid, first)

    return locate


def claim_next(counter: Any) -> Any:
    """The counter's value before an atomic increment: concurrent claims never return the same step.

    ``assign_add(1, read_value=True)`` is two ops, an add and a read: two workers' adds can both land
    before either reads, and both then train the same step while the one before it is never claimed.
    ``ResourceCountUpTo`` reads and increments under the variable's lock in one kernel
    (:func:`~tfdist.data.order.ledger.count_up`).

    Example:
        >>> import tensorflow as tf
        >>> counter = tf.Variable(5, dtype=tf.int64)
        >>> int(claim_next(counter)), int(counter.numpy())
        (5, 6)
    """
    return count_up(counter)


def claimed_steps(
    order: EpochOrder,
    paths: Sequence[str],
    *,
    compression: str,
    global_batch: int,
    counter: Any,
    passes: int | None,
    finish: Callable[[Any], Any] | None = None,
    index: RecordIndex | None = None,
    worker: Any = 0,
) -> Any:
    """One element per claimed global step: the batch of its records (``finish`` makes it, e.g. parsed).

    Args:
      order: The epoch order (its ``window`` is not used: a step reads consecutive records of each stream).
      paths: The files, in the order's listing order.
      compression: The files' compression ('' for none).
      global_batch: Records per global step.
      counter: An int64 ``tf.Variable`` (on a parameter server under PS): the next global step to claim; or
        a :class:`~tfdist.data.order.ledger.StepLedger`, whose steps given back are claimed first.
      passes: Data epochs to read (None: endless).
      finish: Turns the dataset of a step's serialized records into a dataset of one element, its batch
        (default: ``records.batch(global_batch)``).
      index: The record index ``order`` and ``paths`` come from: names and byte offsets are read from it
        by range, a piece at a time (None: they travel in the graph).
      worker: The claiming worker's index (int64; :func:`~tfdist.data.order.ledger.current_worker`), which
        a ledger records.
    """
    import tensorflow as tf

    _check(order, global_batch, index)
    spp = steps_per_pass(order, global_batch)
    claims = claimed_indices(counter, None if passes is None else passes * spp, worker)
    pieces = claims.map(tf.autograph.experimental.do_not_convert(_step_pieces(order, global_batch, spp)))
    return read_steps(
        pieces, locator(order, paths, index), compression=compression, global_batch=global_batch, finish=finish
    )


def claimed_indices(counter: Any, steps: int | None, worker: Any = 0) -> Any:
    """An endless dataset of the global steps ``worker`` claims from ``counter`` (a variable, or a
    :class:`~tfdist.data.order.ledger.StepLedger`); ends at the first fresh step past ``steps`` (None: never)."""
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert
    if isinstance(counter, StepLedger):
        claims = counter.steps_for(worker)
    else:
        claims = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
        claims = claims.map(plain(lambda _: claim_next(counter)))
    return claims if steps is None else claims.take_while(plain(lambda g: g < steps))


def read_steps(
    pieces: Any,
    locate: Callable[..., Any],
    *,
    compression: str,
    global_batch: int,
    finish: Callable[[Any], Any] | None,
) -> Any:
    """Each step's batch from a dataset of its pieces, read in order after the claim (:func:`claim_options`).

    A step's element is a tuple of vectors, one entry per piece, the last the records to take; ``locate``
    turns the other entries of one piece (e.g. file and first record, see :func:`locator`) into
    ``(path, byte offset, records to skip there)``.
    """
    import tensorflow as tf

    from tfdist import _compat

    plain = tf.autograph.experimental.do_not_convert

    @plain
    def read_piece(*piece: Any) -> Any:
        path, offset, skip = locate(*piece[:-1])
        return _compat.tfrecord_reader_at(path, offset, compression, _BUFFER).skip(skip).take(piece[-1])

    @plain
    def read_step(*columns: Any) -> Any:
        records = tf.data.Dataset.from_tensor_slices(columns).flat_map(read_piece)
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
