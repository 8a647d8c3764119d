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

The order is :class:`~tfdist.data.order.epoch.EpochOrder` without windows, its streams cut at block borders
(``aligned``): a step takes ``b`` consecutive records of every stream of the epoch's permuted blocks. It is computed in the graph (workers run no
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
_BUFFER = 1 << 18  # At most this many bytes read at once for a piece.
_SLACK = 1 << 10  # At least this many (and this many more than a piece's records hold by their mean size).
_SAMPLE = 1 << 16  # Offsets that the mean record size is taken from.


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


def graph_spans(file: Any, records: Any, gap: int) -> tuple[Any, Any, Any, Any]:
    """Spans of one file's records, each next record at most ``gap`` after the last: each span becomes one
    piece, read whole (the records between those wanted too). Returns the order that sorts the records by
    file and record, where spans start in that order (a bool mask), each span's length (int64), and each
    record's place among the spans' records read one span after the other (int64, in the input's order).

    Example:
        >>> import tensorflow as tf
        >>> order, fresh, take, place = graph_spans(tf.constant([1, 0, 1, 0]), tf.constant([9, 4, 7, 40]), 8)
        >>> fresh.numpy().tolist(), take.numpy().tolist(), place.numpy().tolist()
        ([True, True, True, False], [1, 1, 3], [4, 0, 2, 1])
    """
    import tensorflow as tf

    by_record = tf.argsort(records, stable=True)
    order = tf.gather(by_record, tf.argsort(tf.gather(file, by_record), stable=True))
    file, records = tf.gather(file, order), tf.gather(records, order)
    fresh = tf.concat([[True], (file[1:] != file[:-1]) | (records[1:] - records[:-1] > gap)], 0)
    span = tf.cumsum(tf.cast(fresh, tf.int64)) - 1
    first = tf.boolean_mask(records, fresh)
    take = tf.math.segment_max(records, span) - first + 1
    place = tf.gather(tf.cumsum(take, exclusive=True) - first, span) + records
    return order, fresh, take, tf.gather(place, tf.math.invert_permutation(order))


def _step_pieces(order: EpochOrder, global_batch: int, spp: int) -> Callable[[Any], Any]:
    """The map function: claimed step -> the step's pieces (file, first record in the listing, records)."""
    import numpy as np
    import tensorflow as tf

    per = global_batch // order.streams
    starts = tf.constant(order.starts, tf.int64)  # Each file's first record in the listing (and the total).
    lengths = np.asarray(order.stream_lengths, np.int64)
    bases = np.asarray(order.stream_bases[:-1], np.int64)
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


def record_bytes(order: EpochOrder) -> float:
    """Bytes per record of ``order``'s seekable files, from the byte offsets of its grid (90th percentile of
    the gaps within a file over the first entries; 0.0 where none is known).

    Example:
        >>> import numpy as np
        >>> order = EpochOrder(counts=(4, 4), block=2, streams=1, window=0, seed=0, offsets=np.array([0, 40, 0, 60]))
        >>> record_bytes(order)
        29.0
    """
    import numpy as np

    if order.offsets is None:
        return 0.0
    grid = order.offset_grid
    offsets = np.asarray(order.offsets[: _SAMPLE + 1], np.int64)
    file = np.searchsorted(order.starts, np.arange(len(offsets), dtype=np.int64) * grid, side="right")
    same = (file[1:] == file[:-1]) & (offsets[1:] >= 0) & (offsets[:-1] >= 0)
    gaps = (offsets[1:] - offsets[:-1])[same]
    return float(np.percentile(gaps, 90)) / grid if len(gaps) else 0.0


def locator(order: EpochOrder, paths: Sequence[str], index: RecordIndex | None) -> Callable[[Any, Any, Any], Any]:
    """A graph function over a step's pieces, ``(file, first record in the listing, records) -> (path, byte
    offset, records to skip there, records, bytes to read at once)``, 1-D each: names and byte offsets from
    constants, or read by range from the record index. A piece is read from the nearest known byte offset at
    or before its first record, in one read of its bytes where the next known offset in its file bounds them
    (else of about as many bytes as its records hold, at most :data:`_BUFFER`)."""
    import tensorflow as tf

    starts, grid = tf.constant(order.starts, tf.int64), order.offset_grid
    name_of, offset_of = _lookups(order, paths, index)
    guess = 1.25 * record_bytes(order)
    last = -1 if order.offsets is None else len(order.offsets) - 1

    def locate(file: Any, record: Any, take: Any) -> Any:
        first = record - tf.gather(starts, file)
        if order.offsets is None:  # Every file is read from its start.
            return (
                name_of(file),
                tf.zeros_like(record),
                first,
                take,
                tf.fill(tf.shape(record), tf.constant(_BUFFER, tf.int64)),
            )
        point = record // grid
        at = offset_of(point)
        seek = (first > 0) & (point * grid >= tf.gather(starts, file)) & (at >= 0)
        offset, skip = tf.where(seek, at, 0), tf.where(seek, record - point * grid, first)
        size = tf.cast(tf.math.ceil(tf.cast(skip + take, tf.float64) * guess), tf.int64) + _SLACK
        if index is None or len(order.offsets) <= MAX_BLOCKS:  # The next known offset: where the bytes end.
            after = (record + take + grid - 1) // grid
            bound = offset_of(tf.minimum(after, last))
            known = (after <= last) & (after * grid < tf.gather(starts, file + 1)) & (bound >= 0)
            size = tf.where(known, bound - offset, tf.where(guess > 0, size, _BUFFER))
        return name_of(file), offset, skip, take, tf.clip_by_value(size, tf.constant(_SLACK, tf.int64), _BUFFER)

    return locate


def _lookups(order: EpochOrder, paths: Sequence[str], index: RecordIndex | None) -> tuple[Any, Any]:
    """Graph functions ``files -> paths`` and ``grid points -> byte offsets`` (1-D): gathers from constants,
    or reads by range from the record index (a piece at a time)."""
    import tensorflow as tf

    if index is None or order.offsets is None or len(order.offsets) <= MAX_BLOCKS:  # Small enough: constants.
        names = tf.constant(list(paths), tf.string)
        table = tf.constant(order.offsets if order.offsets is not None else [-1], tf.int64)
        return (lambda file: tf.gather(names, file)), (lambda point: tf.gather(table, point))
    (names_at, width), (offsets_at, _) = index.places["names"], index.places["offsets"]
    directory = index.root + "/" if index.root else ""

    def entry(at: Any, size: int) -> Any:  # ``size`` bytes of the index from byte ``at``: one record.
        read = tf.data.FixedLengthRecordDataset(
            index.path, size, header_bytes=at, footer_bytes=index.nbytes - at - size, buffer_size=size
        )
        return read.get_single_element()

    def name_of(file: Any) -> Any:
        def one(at: Any) -> Any:
            return tf.strings.join(
                [directory, tf.strings.regex_replace(entry(names_at + at * width, width), "\x00+$", "")]
            )

        return tf.map_fn(one, file, fn_output_signature=tf.string)

    def offset_of(point: Any) -> Any:
        def one(at: Any) -> Any:
            return tf.reshape(tf.io.decode_raw(entry(offsets_at + at * 8, 8), tf.int64, little_endian=True), [])

        return tf.map_fn(one, point, fn_output_signature=tf.int64)

    return name_of, offset_of


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
      finish: Turns the dataset of the steps' serialized records (one vector per step) into their batches,
        one element per step, e.g. parsed by a ``map`` (default: the vectors).
      index: The record index ``order`` and ``paths`` come from: names and byte offsets are read from it
        by range, a piece at a time (None: they travel in the graph).
      worker: The claiming worker's index (int64; :func:`~tfdist.data.order.ledger.current_worker`), which
        a ledger records.
    """
    import tensorflow as tf

    _check(order, global_batch, index)
    spp = steps_per_pass(order, global_batch)
    claims = claimed_indices(counter, None if passes is None else passes * spp, worker)
    step, locate = _step_pieces(order, global_batch, spp), locator(order, paths, index)
    pieces = claims.map(tf.autograph.experimental.do_not_convert(lambda claimed: locate(*step(claimed))))
    return read_steps(pieces, compression=compression, global_batch=global_batch, finish=finish)


def claimed_indices(counter: Any, steps: int | None, worker: Any = 0, *, also: Any = None) -> Any:
    """An endless dataset of the global steps ``worker`` claims from ``counter`` (a variable, or a
    :class:`~tfdist.data.order.ledger.StepLedger`); ends at the first fresh step past ``steps`` (None: never).
    With ``also`` (an int64 variable beside the counter), each step and that variable's value, read in the
    claim's own call to the ps."""
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert

    def claim(_: Any) -> Any:
        step = claim_next(counter)
        return step if also is None else (step, tf.raw_ops.ReadVariableOp(resource=also.handle, dtype=tf.int64))

    if isinstance(counter, StepLedger):
        claims = counter.steps_for(worker, also=also)
    else:
        claims = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat().map(plain(claim))
    if steps is None:
        return claims
    return claims.take_while(plain(lambda g, *_: g < steps))


def read_steps(pieces: Any, *, compression: str, global_batch: int, finish: Callable[[Any], Any] | None) -> Any:
    """Each step's batch from a dataset of its located pieces, read in order after the claim
    (:func:`claim_options`).

    A step's element is a tuple of vectors, one entry per piece: (path, byte offset, records to skip there,
    records to take, bytes to read at once), as :func:`locator` gives them, and optionally a sixth: the step's
    records as places among the pieces' records (pieces that are spans, :func:`graph_spans`). Each step's
    records become one vector, which ``finish`` turns into its batch (None: the vector is the batch).
    """
    import tensorflow as tf

    from tfdist import _compat

    plain = tf.autograph.experimental.do_not_convert
    spans = len(pieces.element_spec) == 6

    @plain
    def read_piece(path: Any, offset: Any, skip: Any, take: Any, size: Any) -> Any:
        return _compat.tfrecord_reader_at(path, offset, compression, size).skip(skip).take(take)

    @plain
    def read_step(*columns: Any) -> Any:
        records = tf.data.Dataset.from_tensor_slices(columns[:5]).flat_map(read_piece)
        if not spans:
            return records.batch(global_batch)  # One element.
        whole = records.batch(tf.reduce_sum(columns[3]))  # Every record of the spans: one element.
        return tf.data.Dataset.zip((whole, tf.data.Dataset.from_tensors(columns[5])))

    steps = pieces.flat_map(read_step)
    if spans:
        steps = steps.map(plain(tf.gather))  # The wanted records of the spans, in the step's order.
    return (steps if finish is None else finish(steps)).with_options(claim_options())


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
