"""One worker's records in the epoch order of :mod:`tfdist.data.order.epoch`, from the cursor's position.

Each stream's windows (computed by :class:`EpochOrder` in Python) reach a ``tf.data`` graph through
``numpy_function`` calls; the graph opens each piece at its byte offset, orders a window and drops what was
trained already. A finite iteration gets all its windows in one call when it begins (every new iterator
would otherwise instantiate the per-window stages again); an endless or very long one gets them one after
the other. A shuffled window is read into one tensor and gathered in its order once. The stream function
of a finite iteration is traced once per process, not once per build: it finds its build's windows through
the id of the build's window source (a pipeline built again every epoch skips ~15 ms of tracing).

A stream comes out in **chunks** of ``b`` records (``b = global_batch // streams``: its share of one global
step), and a worker interleaves its streams a chunk at a time, so each global step takes ``b`` records of
every stream whatever the number of workers. A chunk is one tf.data element: past the reader, the order adds
no per-record stage (BENCHMARKS.md has what the order costs against the buffer order).

Example:
    >>> StreamLayout(global_batch=24, streams=12, num_workers=2, worker=1, policy="file").own
    (1, 3, 5, 7, 9, 11)
    >>> StreamLayout(global_batch=30, streams=6, num_workers=5, worker=0, policy="file")
    Traceback (most recent call last):
    ...
    tfdist.errors.DataError: Invalid value for `order_streams`. Received: 6. Expected a multiple of the 5 \
workers under shard_policy='file'. ...
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from tfdist import _compat
from tfdist.data.order.epoch import CHUNK, EpochOrder, Window, joined, stream_position
from tfdist.data.order.position import DataPosition, InputCursor, StreamStarts
from tfdist.errors import DataError, invalid

__all__: list[str] = []

_BUFFER = 1 << 18
# A finite iteration computes its windows when it begins (one call; no per-window stages to instantiate for
# every iterator) up to this many pieces and shuffled records per stream (a few MB of arrays).
# Past that an epoch is long enough for windows computed one after the other to cost nothing that shows.
_AT_ONCE_PIECES = 1 << 16
_AT_ONCE_RECORDS = 1 << 18
_POLICIES = ("file", "data")


def default_streams(global_batch: int, num_workers: int, policy: str, *, records: int | None = None) -> int:
    """Streams when ``order_streams`` is not given: the most, up to 12 (or the worker count), dividing the batch.

    Under 'file' a multiple of the worker count; never more than ``records`` (tiny data). 12 streams
    serve 1, 2, 3, 4, 6 and 12 workers with the same order; an elastic job between other sizes names its
    own (``order_streams``).

    Example:
        >>> default_streams(24, 2, "file"), default_streams(24, 3, "file"), default_streams(256, 4, "file")
        (12, 12, 8)
    """
    step = num_workers if policy == "file" else 1
    fits = [k for k in range(step, max(12, num_workers) + 1, step) if global_batch % k == 0]
    if fits and records is not None and records < max(fits):
        fits = [k for k in fits if k <= records] or [min(fits)]  # The order then names what is too few.
    if not fits:
        raise invalid(
            DataError,
            "batch_size",
            global_batch,
            f"a global batch divisible by the {num_workers} workers for resumable input",
            f"Use a multiple of {num_workers}, e.g. {max(num_workers, global_batch // num_workers * num_workers)}.",
        )
    return max(fits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamLayout:
    """How ``streams`` streams are read by worker ``worker`` of ``num_workers`` each global step.

    'file': the worker reads streams ``worker, worker + N, ...`` (each record read once over the cluster);
    'data': every worker reads every stream and keeps its slice of each step (any worker count).
    """

    global_batch: int
    streams: int
    num_workers: int
    worker: int
    policy: str

    def __post_init__(self) -> None:
        if self.policy not in _POLICIES:
            raise invalid(
                DataError,
                "shard_policy",
                self.policy,
                "'file', 'data' or 'auto' with order='resumable'",
                "'hash' and 'off' keep no global order a resume can seek in: use shard_policy='file' or 'data'.",
            )
        if self.global_batch % self.streams:
            raise invalid(
                DataError,
                "order_streams",
                self.streams,
                f"a divisor of the global batch {self.global_batch}",
                "Each step takes the same number of records from every stream.",
            )
        if self.global_batch % self.num_workers:
            raise invalid(
                DataError,
                "batch_size",
                self.global_batch,
                f"a global batch divisible by the {self.num_workers} workers with order='resumable'",
            )
        if self.policy == "file" and self.streams % self.num_workers:
            raise invalid(
                DataError,
                "order_streams",
                self.streams,
                f"a multiple of the {self.num_workers} workers under shard_policy='file'",
                "Every world size of the job must divide it (e.g. 12 for 2, 3, 4 or 6 workers), or use "
                "shard_policy='data'.",
            )

    @property
    def per_stream(self) -> int:
        """Records each stream gives a global step."""
        return self.global_batch // self.streams

    @property
    def own(self) -> tuple[int, ...]:
        """The streams this worker reads."""
        if self.policy == "data":
            return tuple(range(self.streams))
        return tuple(range(self.worker, self.streams, self.num_workers))


def _iteration(order: EpochOrder, layout: StreamLayout, starts: StreamStarts, stream: int, at: int) -> Any:
    """Stream ``stream``'s :class:`~tfdist.data.order.epoch.Window` s for one iteration, from the cursor's
    position; ``at`` >= 0 starts it ``at`` steps into epoch 0 instead, endless (a class of stratified draws)."""
    if at >= 0:
        start, per = DataPosition(step=at), None
    else:
        start, per = starts.iteration(stream=stream), starts.epochs_per_iteration
    epoch, at = stream_position(order, stream, start.step * layout.per_stream, epochs_per_pass=per)
    while per is None or epoch < per:
        yield from order.windows(epoch=start.epoch + epoch, stream=stream, start=at)
        epoch, at = epoch + 1, 0


def _columns(window: Window, paths: Sequence[str]) -> tuple[Any, ...]:
    """A window as arrays: its pieces (paths, byte offsets, records to skip, records to take) and, shuffled,
    the order of the records it keeps (the first ``skip`` of a resumed window dropped)."""
    import numpy as np

    pieces = window.pieces
    return (
        np.asarray([paths[p.file] for p in pieces], dtype=object),
        np.asarray([p.offset for p in pieces], dtype=np.int64),
        np.asarray([p.skip for p in pieces], dtype=np.int64),
        np.asarray([p.take for p in pieces], dtype=np.int64),
        np.asarray(window.order if window.order is not None else [], dtype=np.int64)[window.skip :],
    )


def _joined(windows: Sequence[Window]) -> list[Window]:
    """Unshuffled windows as one: a file's run cut at a window border is one piece again."""
    pieces = joined(p for w in windows for p in w.pieces)
    return [Window(pieces=pieces, order=None, skip=0)] if pieces else []


class _WindowSource:
    """The Python side of the streams: one generator of windows per live stream iteration, by token.

    Pulled through ``tf.numpy_function`` calls (no ``from_generator``, whose iterators log a C++ warning
    each when the process exits with them alive, as an endless input's does).
    """

    _LIVE = 256  # Iterations kept at most; the oldest (abandoned: never read to the end) go first.

    def __init__(self, order: EpochOrder, layout: StreamLayout, starts: StreamStarts, paths: Sequence[str]) -> None:
        # A source outlives its build (below): builds over the same data share one order and one list of paths.
        self._order, self._paths = _shared(order), _shared(paths if isinstance(paths, Hashable) else tuple(paths))
        self._layout, self._starts = layout, starts
        self._live: dict[int, Any] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()

    def registered(self) -> int:
        """The id by which a reader traced once per process finds this source (kept for the process's life)."""
        with _REGISTRY_LOCK:
            ident = next(_SOURCE_IDS)
            _SOURCES[ident] = self
        return ident

    def begin(self, stream: Any, at: Any) -> Any:
        import numpy as np

        with self._lock:
            token = next(self._tokens)
            windows = _iteration(self._order, self._layout, self._starts, int(stream), int(at))
            self._live[token] = (_columns(w, self._paths) for w in windows)
            while len(self._live) > self._LIVE:
                self._live.pop(next(iter(self._live)))
        return np.int64(token)

    def iteration(self, stream: Any) -> tuple[Any, ...]:
        """Every window of a new (finite) iteration of stream ``stream`` at once: the five columns of
        :func:`_columns` joined, and per window where its pieces and its order begin and end."""
        import numpy as np

        windows = list(_iteration(self._order, self._layout, self._starts, int(stream), -1))
        if not (self._order.shuffle and self._order.window):
            windows = _joined(windows)  # One reader per run of a file, whatever the window borders.
            if self._starts.epochs_per_iteration == 1:  # Read as one run (ordered_records): files from their start.
                assert all(p.skip == 0 and p.first == 0 for w in windows for p in w.pieces[1:]), windows
        elif self._starts.epochs_per_iteration == 1:
            # Cut into windows by ``batch`` (ordered_records): every window but the last is full.
            assert all(sum(p.take for p in w.pieces) == self._order.window for w in windows[:-1]), windows
        windows = [_columns(w, self._paths) for w in windows]
        empty = np.zeros(0, np.int64)
        firsts = (np.zeros(0, dtype=object), empty, empty, empty, empty)
        columns = tuple(np.concatenate([first, *(w[i] for w in windows)]) for i, first in enumerate(firsts))
        sizes = np.asarray([[len(w[0]), len(w[4])] for w in windows], np.int64).reshape(-1, 2)
        ends = np.cumsum(sizes, axis=0)
        bounds = np.stack([ends - sizes, ends], axis=2).reshape(-1, 4)  # lo, hi of pieces, lo, hi of order.
        return (*columns, bounds)

    def next(self, token: Any) -> tuple[Any, ...]:
        import numpy as np

        with self._lock:
            windows = self._live.get(int(token))
        window = next(windows, None) if windows is not None else None
        if window is None:
            with self._lock:
                self._live.pop(int(token), None)
            empty = np.zeros(0, np.int64)
            return (np.zeros(0, dtype=object), empty, empty, empty, empty)  # No pieces: the end.
        return window


# Sources by id: a whole-iteration reader is traced once per process (_compat.cached_interleave) and finds its
# build's source through the id it is given. Kept for the life of the process, as TF keeps the callable of
# every numpy_function (on the outermost graph; a window-by-window reader's source is kept that way): an
# iterator may outlive its Python dataset (DTensor's input keeps only what it rebuilt from it). What a kept
# source holds of its own is small: its order and paths are shared with every build over the same data.
_SOURCES: dict[int, _WindowSource] = {}
_SOURCE_IDS = itertools.count()
_SHARED: dict[Any, Any] = {}
_REGISTRY_LOCK = threading.Lock()


def _shared(value: Any) -> Any:
    """``value``, or the equal one a build before kept (equal orders and paths are kept once)."""
    with _REGISTRY_LOCK:
        return _SHARED.setdefault(value, value)


def _iteration_of(source: Any, stream: Any) -> tuple[Any, ...]:
    return _SOURCES[int(source)].iteration(stream)


def _at_once(order: EpochOrder, epochs: int | None) -> bool:
    """Whether a stream's windows of one (finite) iteration are few enough to compute when it begins."""
    if epochs is None:  # Endless: read window by window.
        return False
    blocks = -(-order.num_records // order.block) + len(order.counts)  # Blocks, plus a cut per file at most.
    records = max(order.stream_lengths) if order.shuffle and order.window else 0  # An order index each.
    return epochs * (blocks // order.streams + 2) <= _AT_ONCE_PIECES and epochs * records <= _AT_ONCE_RECORDS


def _shaped(tensor: Any, shape: list[int | None]) -> Any:
    """A ``numpy_function`` output (of that shape) with its static shape set: no op to trace and instantiate."""
    tensor.set_shape(shape)
    return tensor


def _share(step: Any, begin: int, share: int) -> Any:
    """Records ``[begin, begin + share)`` of a step (fewer at the end of the data), as a new tensor."""
    import tensorflow as tf

    size = tf.shape(step, out_type=tf.int64)[0]
    return tf.gather(step, tf.range(tf.minimum(size, begin), tf.minimum(size, begin + share)))


def _piece_reader(compression: str) -> Any:
    """The function reading one piece: ``take`` records of a file from its byte ``offset``, ``skip`` first."""
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def read_piece(path: Any, offset: Any, skip: Any, take: Any) -> Any:
        return _compat.tfrecord_reader_at(path, offset, compression, _BUFFER).skip(skip).take(take)

    return read_piece


def _ordered_reader(read_piece: Any, whole: int) -> Any:
    """The function reading a shuffled window: its records (``whole`` at most) as one tensor in file order,
    then gathered in the window's order (one copy)."""
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert

    @plain
    def read_ordered(paths: Any, offsets: Any, skips: Any, takes: Any, ordering: Any) -> Any:
        block = tf.data.Dataset.from_tensor_slices((paths, offsets, skips, takes)).flat_map(read_piece).batch(whole)
        return block.map(plain(lambda records: tf.gather(records, ordering)))

    return read_ordered


def _chunked(records: Any, per: int, single: bool) -> Any:
    """A stream's records as its chunks of ``b`` (records split from windows are copies: no slices)."""
    return records if single else records.batch(per)


def _whole_iteration(
    shuffled: bool, one_epoch: bool, window: int, whole: int, per: int, single: bool, compression: str
) -> Any:
    """The stream function of a finite iteration whose windows come in one call when it begins.

    A function of (stream, source id) that depends on its arguments alone (no build's objects), so
    :func:`tfdist._compat.cached_interleave` traces it once per process and shape.
    """
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert
    read_piece = _piece_reader(compression)
    read_ordered = _ordered_reader(read_piece, whole)

    @plain
    def stream(index: Any, source: Any) -> Any:
        types = [tf.string, tf.int64, tf.int64, tf.int64, tf.int64, tf.int64]
        parts = tf.numpy_function(_iteration_of, [source, index], types, stateful=True)
        columns = [_shaped(p, [None]) for p in parts[:5]]
        if not shuffled and one_epoch:
            # One unshuffled epoch of a stream is one run of the listing: whole files but the first (read
            # from its block's offset) and the last (cut by the count). One reader reads them all, with
            # no function of its own to instantiate for every iterator (BENCHMARKS.md).
            paths_, offsets, skips, takes = columns[:4]
            reader = _compat.tfrecord_reader_at(paths_, offsets, compression, _BUFFER)
            return _chunked(reader.skip(tf.reduce_sum(skips[:1])).take(tf.reduce_sum(takes)), per, single)

        def pieces() -> Any:  # The iteration's pieces read one after the other.
            return tf.data.Dataset.from_tensor_slices(tuple(columns[:4])).flat_map(read_piece)

        if not shuffled:  # The pieces alone: no per-window stage.
            return _chunked(pieces(), per, single)
        if one_epoch:
            # One epoch: all windows but the last hold ``window`` records, read whole (a resumed one too),
            # so the pieces read one after the other are cut into windows by ``batch``, each zipped with
            # its order. The only functions are the piece reader's and the gather: each function of a
            # nested dataset is instantiated for every iterator (BENCHMARKS.md).
            limits = _shaped(parts[5], [None, 4])[:, 3]
            orders = tf.data.Dataset.from_tensor_slices(
                tf.RaggedTensor.from_row_limits(columns[4], limits, validate=False)
            )
            windows = tf.data.Dataset.zip((pieces().batch(window), orders)).map(plain(tf.gather))
            return _chunked(_compat.unbatch_dense(windows), per, single)
        bounds = tf.data.Dataset.from_tensor_slices(_shaped(parts[5], [None, 4]))
        windows = bounds.flat_map(
            plain(lambda b: read_ordered(*(c[b[0] : b[1]] for c in columns[:4]), columns[4][b[2] : b[3]]))
        )
        return _chunked(_compat.unbatch_dense(windows), per, single)

    return stream


def _window_by_window(
    source: _WindowSource, *, shuffled: bool, whole: int, per: int, single: bool, compression: str, at: Any
) -> Any:
    """The stream function of an endless or very long iteration: its windows pulled one after the other
    from ``source`` (traced with every build: it calls this build's source)."""
    import tensorflow as tf

    plain = tf.autograph.experimental.do_not_convert  # No control flow: autograph would only cost ~1 s per build.
    read_piece = _piece_reader(compression)
    read_ordered = _ordered_reader(read_piece, whole)

    @plain
    def next_window(token: Any) -> Any:
        types = [tf.string, tf.int64, tf.int64, tf.int64, tf.int64]
        parts = tf.numpy_function(source.next, [token], types, stateful=True)
        return tuple(_shaped(p, [None]) for p in (parts if shuffled else parts[:4]))

    @plain
    def stream(index: Any) -> Any:
        where = tf.constant(-1, tf.int64) if at is None else tf.cast(at, tf.int64)
        token = _shaped(tf.numpy_function(source.begin, [index, where], tf.int64, stateful=True), [])
        windows = (
            tf.data.Dataset.from_tensors(token)
            .repeat()
            .map(next_window)
            .take_while(plain(lambda paths, *_: tf.size(paths) > 0))
        )
        if not shuffled:  # Read from the position on, nothing to reorder: the pieces one after the other.
            return _chunked(_compat.unbatch_dense(windows).flat_map(read_piece), per, single)
        return _chunked(_compat.unbatch_dense(windows.flat_map(read_ordered)), per, single)

    return stream


def ordered_records(
    order: EpochOrder,
    layout: StreamLayout,
    cursor: InputCursor,
    paths: Sequence[str],
    *,
    compression: str,
    at: Any = None,
    single: bool = False,
    threads: bool = True,
) -> Any:
    """This worker's serialized records in the epoch order, from ``cursor``'s position, as **chunks**.

    A ``tf.data.Dataset`` of 1-D string tensors: each is the ``b`` records one stream gives a global step
    (fewer only where a stream ends), in step order. ``dataset.rebatch(n)`` makes batches of ``n``
    records: a chunk is one tf.data element, so the order costs no per-record stage past the reader.
    ``at`` (an int64 scalar tensor) starts every iteration that many steps into epoch 0, endlessly,
    instead of at the cursor's position. ``single``: single records instead of chunks (a layout of one
    stream read here, one record per step: a class of stratified draws). ``threads``: each stream read
    on a thread of its own (remote files); False interleaves them on the consumer's thread, cheaper for
    local files on cores busy decoding (BENCHMARKS.md).
    """
    # Every function below is a host-CPU input function: instantiated on one device, each new iterator skips
    # TF's multi-device instantiation of it (~5-15 ms per function and iterator, BENCHMARKS.md).
    with _compat.single_device_functions():
        return _ordered_records(order, layout, cursor, paths, compression, at, single, threads)


def _ordered_records(
    order: EpochOrder,
    layout: StreamLayout,
    cursor: InputCursor,
    paths: Sequence[str],
    compression: str,
    at: Any,
    single: bool,
    threads: bool,
) -> Any:
    import tensorflow as tf

    shuffled = bool(order.shuffle and order.window)
    source = _WindowSource(order, layout, cursor.reads(), paths)
    whole = max(order.window, CHUNK) if shuffled else CHUNK  # Records of one window at most.
    per = layout.per_stream
    own = tf.constant(layout.own, tf.int64)
    # The caller's layout with ``single``: one stream read here, one record a step.
    assert not single or (len(layout.own) == 1 and per == 1), layout
    if at is None and _at_once(order, cursor.epochs_per_iteration):
        shape = (shuffled, cursor.epochs_per_iteration == 1, order.window, whole, per, single, compression)
        ident = tf.constant(source.registered(), tf.int64)
        if single:
            return _whole_iteration(*shape)(own[0], ident)
        # One chunk of every stream read here per global step, in stream order.
        streams = tf.data.Dataset.from_tensor_slices((own, tf.fill(tf.shape(own), ident)))
        key = ("tfdist.ordered_records", _BUFFER, *shape)
        chunks = _compat.cached_interleave(
            streams, _whole_iteration(*shape), key=key, cycle_length=len(layout.own), parallel=threads
        )
    else:
        stream = _window_by_window(
            source, shuffled=shuffled, whole=whole, per=per, single=single, compression=compression, at=at
        )
        if single:
            return stream(own[0])
        parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True} if threads else {}
        streams = tf.data.Dataset.from_tensor_slices(own)
        chunks = streams.interleave(stream, cycle_length=len(layout.own), block_length=1, **parallel)
    plain = tf.autograph.experimental.do_not_convert
    if layout.policy == "data":  # Every stream read here: keep this worker's slice of each step.
        share = layout.global_batch // layout.num_workers
        begin = layout.worker * share
        return _compat.rebatch_dense(chunks, layout.global_batch).map(plain(lambda step: _share(step, begin, share)))
    return chunks
