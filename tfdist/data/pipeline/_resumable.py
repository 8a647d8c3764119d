"""Whether a pipeline reads in the resumable epoch order, and its records when it does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tfdist._compat import is_variable, single_device_functions
from tfdist.data.order import splitmix
from tfdist.data.order.claimed_draws import draw_grid
from tfdist.data.order.index import epoch_order
from tfdist.data.order.ledger import StepLedger
from tfdist.data.order.position import InputCursor
from tfdist.data.order.reader import StreamLayout, default_streams, ordered_records
from tfdist.data.order.strata import StrataOrder, draw_counts, graph_draws
from tfdist.data.pipeline import reading
from tfdist.data.pipeline._context import PipelineSlot
from tfdist.data.pipeline.state import InputState
from tfdist.data.pipeline.stratified import class_groups
from tfdist.data.records.files import Listing
from tfdist.data.sampling import resolve_weights
from tfdist.data.storage import remote
from tfdist.errors import DataError, invalid

_log = logging.getLogger("tfdist.data")


def _obstacle(pipeline: Any, *, groups: bool, listing: Listing, claimed: bool = False) -> tuple[str, Any, str] | None:
    """(option, value, why) of the first option that keeps the resumable order (``claimed``: the claimed steps
    of parameter servers) out; None when it applies."""
    import tensorflow as tf

    if pipeline.data_service is not None:
        return "data_service", pipeline.data_service, "the tf.data service hands out its own splits"
    weights = pipeline.class_weights
    if weights is not None and pipeline.order != "resumable" and not claimed:
        return "class_weights", weights, "stratified sampling draws its own order (order='resumable' replays it)"
    if weights is not None and not groups:
        return "class_weights", weights, "without class groups (partition_by) the mix is resampled by rejection"
    if weights is not None and is_variable(weights):
        why = (
            "the classes of a claimed step would depend on the mix in force at every step before it, which "
            "no worker knows"
            if claimed
            else "a mix that changes while training cannot be drawn again"
        )
        return "class_weights", "a tf.Variable", why
    if pipeline.shard_policy not in ("auto", "file", "data"):
        return "shard_policy", pipeline.shard_policy, "'hash' and 'off' keep no global order to seek in"
    if pipeline.cache:
        return "cache", pipeline.cache, "a cache replays one pass in its stored order"
    if not tf.executing_eagerly():
        return (
            "input_context",
            "a traced dataset function",
            "parameter-server workers build the dataset remotely; tfdist.keras.fit_input(pipeline) reads one "
            "pass per epoch there",
        )
    if any(remote.reader_for(f.path) == "boto3" for f in listing.files[:1]):
        return "files", listing.files[0].path, "s3:// objects read through boto3 are staged, not opened at an offset"
    uncounted = [f.path for f in listing.files if "://" in f.path and f.records is None]
    if uncounted:
        return "files", uncounted[0], "remote files without the writer's manifest would be read whole to count them"
    if pipeline.on_corrupt == "skip" and not listing.local:
        return "on_corrupt", "skip", "damaged remote or compressed files are cut where a reader finds the damage"
    return None


def layout_for(pipeline: Any, *, groups: dict[str, Any], listing: Listing, where: PipelineSlot) -> StreamLayout | None:
    """How this worker reads the resumable order; None for the 'buffer' order.

    'auto' reads resumably where it can and logs why not; 'resumable' raises a DataError instead. Under
    stratified draws (:func:`drawn`) the layout only says this pipeline's share of each step.
    """
    if pipeline.order == "buffer":
        return None
    obstacle = _obstacle(pipeline, groups=bool(groups), listing=listing)
    layout = None
    if obstacle is None and drawn(pipeline, groups):  # order_streams and 'data' sharding do not apply.
        _check_pipelines(pipeline.batch_size, where.count)
        return StreamLayout(
            global_batch=pipeline.batch_size,
            streams=where.count,
            num_workers=where.count,
            worker=where.index,
            policy="file",
        )
    if obstacle is None:
        policy = "file" if pipeline.shard_policy == "auto" else pipeline.shard_policy
        known = listing.records([f.path for f in listing.files])
        try:
            streams = pipeline.order_streams or default_streams(pipeline.batch_size, where.count, policy, records=known)
            if known is not None and streams > known:
                raise invalid(DataError, "order_streams", streams, f"at most the {known} records of the data")
            layout = StreamLayout(
                global_batch=pipeline.batch_size,
                streams=streams,
                num_workers=where.count,
                worker=where.index,
                policy=policy,
            )
        except DataError as err:
            if pipeline.order == "resumable":
                raise
            obstacle = (err.field or "order_streams", err.value, err.message)
    if obstacle is None:
        return layout
    field, value, why = obstacle
    if pipeline.order == "resumable":
        raise _refused(obstacle, "no exact resume")
    _log.info("Input order 'buffer' (no exact resume): %s %r: %s.", field, value, why)
    return None


def _refused(obstacle: tuple[str, Any, str], cost: str) -> DataError:
    """The DataError of an option that keeps the resumable order out under order='resumable'."""
    field, value, why = obstacle
    return invalid(
        DataError,
        field,
        value,
        f"a setting order='resumable' supports ({why})",
        f"Drop that option, or pass order='buffer' ({cost}).",
    )


def records(pipeline: Any, listing: Listing, layout: StreamLayout, state: InputState) -> tuple[Any, str]:
    """This worker's serialized records in the resumable order (told to ``state``), and the plan text to log."""
    import tensorflow as tf

    order = epoch_order(
        listing,
        block=pipeline.order_block,
        streams=layout.streams,
        window=pipeline.shuffle_buffer,
        seed=pipeline.seed or 0,
        shuffle=bool(pipeline.shuffle_buffer),
        compression=pipeline.compression,
    )
    paths = [f.path for f in listing.files]
    compression = reading.one_compression(paths, pipeline.source)
    state.reading(order, layout)
    local = bool(listing.local) and tf.executing_eagerly()  # Built here, read elsewhere (a ps worker): threads.
    # Shuffled streams read and gather whole windows: with a thread each they overlap (0.82x the buffer
    # order on 1 GB of 4 KB records, 0.56x without; BENCHMARKS.md). Unshuffled local streams only read.
    threads = bool(pipeline.shuffle_buffer) or reading.reads_in_threads(paths, pipeline.tuning, local)
    dataset = ordered_records(order, layout, state.cursor, paths, compression=compression, threads=threads)
    text = (
        f"resumable order: {order.num_records} records in {layout.streams} streams ({layout.policy}: "
        f"{len(layout.own)} read here, {layout.per_stream} records each per step)"
    )
    return dataset, text


class _Counted:
    """What the draws before a position took from each class, counted on from the last count (thread-safe).

    Keras starts a finite dataset again every epoch: each start counts only the draws since the last one.
    """

    def __init__(self, mix: list[float], *, seed: int, worker: int) -> None:
        import numpy as np

        self._mix, self._seed, self._worker = mix, seed, worker
        self._lock = threading.Lock()
        self._at, self._counts = 0, np.zeros(len(mix), np.int64)

    def upto(self, first: int) -> Any:
        with self._lock:
            if first < self._at:  # A restore went back: count from the start.
                self._at, self._counts = 0, self._counts * 0
            more = draw_counts(self._mix, seed=self._seed, worker=self._worker, upto=first - self._at, start=self._at)
            self._at, self._counts = first, self._counts + more
            return self._counts.copy()


def _check_pipelines(batch_size: int, count: int) -> None:
    """Stratified draws: each of ``count`` input pipelines draws the same share of every global batch."""
    if batch_size % count:
        raise invalid(
            DataError,
            "batch_size",
            batch_size,
            f"a global batch divisible by the {count} input pipelines for stratified draws with order='resumable'",
            f"Use a multiple of {count}, e.g. {max(count, batch_size // count * count)}.",
        )


def drawn(pipeline: Any, groups: dict[str, Any]) -> bool:
    """Whether the pipeline's records are stratified draws a resume replays (not: one pass in the plain order).

    'natural' with class groups reads the plain resumable order: the data's own mix, each record once.
    """
    return bool(groups) and pipeline.class_weights is not None and pipeline.class_weights != "natural"


def _too_small(pipeline: Any, label: str, records: int | None, count: int) -> DataError:
    held = f"{records} records" if records is not None else "fewer records"
    return invalid(
        DataError,
        "class_weights",
        pipeline.class_weights,
        f"class groups of at least {count} records each with order='resumable' (class {label!r} has {held}): "
        f"each of the {count} input pipelines draws from its own part of every class",
        "Write more records of that class, or pass order='auto' (the buffer sampler).",
    )


def _strata_order(
    pipeline: Any, listing: Listing, groups: dict[str, Any], count: int, *, drawn: bool = False
) -> tuple[StrataOrder, list[list[str]]]:
    """The stratified order of ``count`` input pipelines over the class groups, and each class's files.

    Each class group is its own resumable epoch order, cut into one stream per pipeline; ``drawn`` (claimed
    draws, read a draw at a time): with the byte offsets of a finer grid of records (:func:`draw_grid`).
    """
    seed = pipeline.seed or 0
    labels = list(groups)
    orders, files = [], []
    for i, label in enumerate(labels):
        paths = {path for path, _ in groups[label]}
        members = tuple(f for f in listing.files if f.path in paths)
        known = listing.records([f.path for f in members])
        if known is not None and known < count:
            raise _too_small(pipeline, label, known, count)
        try:
            order = epoch_order(
                Listing(files=members, local=listing.local),
                block=pipeline.order_block,
                streams=count,
                window=pipeline.shuffle_buffer,
                seed=splitmix.key(seed, i) >> 1,
                shuffle=bool(pipeline.shuffle_buffer),
                compression=pipeline.compression,
                grid=draw_grid(known, pipeline.order_block, len(labels)) if drawn else 0,
            )
        except DataError as err:
            if err.field != "streams":
                raise
            raise _too_small(pipeline, label, None, count) from None
        files.append([f.path for f in members])
        orders.append(order)
    counts = {label: order.num_records for label, order in zip(labels, orders)}
    weights = pipeline.class_weights
    if isinstance(weights, dict):
        weights = {str(k): v for k, v in weights.items()}
    mix = resolve_weights(weights, counts=counts)
    drawn_order = StrataOrder(
        labels=tuple(labels),
        counts=tuple(counts.values()),
        mix=tuple(mix[label] for label in labels),
        seed=seed,
        num_workers=count,
        share=sum(counts.values()) // count,
        orders=tuple(orders),
    )
    return drawn_order, files


def strata(
    pipeline: Any, listing: Listing, groups: dict[str, Any], layout: StreamLayout, state: InputState
) -> tuple[Any, str]:
    """This pipeline's stratified draws in a replayable order (:mod:`tfdist.data.order.strata`), as chunks.

    Each class group is its own resumable epoch order, one stream per pipeline, read endlessly; the
    classes of the draws come from :func:`~tfdist.data.order.strata.graph_draws`. A chunk is the
    pipeline's ``batch_size / pipelines`` draws of one global step. ``layout`` is :func:`layout_for`'s; the
    order is told to ``state``.
    """
    import tensorflow as tf

    count, index, seed = layout.num_workers, layout.worker, pipeline.seed or 0
    drawn_order, files = _strata_order(pipeline, listing, groups, count)
    labels, probabilities, share = drawn_order.labels, list(drawn_order.mix), drawn_order.share
    one = StreamLayout(global_batch=count, streams=count, num_workers=count, worker=index, policy="file")
    readers = [
        (order, one, names, reading.one_compression(names, pipeline.source))
        for order, names in zip(drawn_order.orders, files)
    ]
    per_step = layout.per_stream
    state.reading(drawn_order, layout)
    starts, epochs = state.cursor.reads(), state.cursor.epochs_per_iteration
    counted = _Counted(probabilities, seed=seed, worker=index)

    def begin() -> Any:  # Python, once per iteration: the first draw, how many to take, where each class stands.
        import numpy as np

        position = starts.iteration(stream=0)
        first = position.epoch * share + position.step * per_step
        take = -1 if epochs is None else max(0, (position.epoch + epochs) * share - first)
        return np.int64(first), np.int64(take), counted.upto(first)

    plain = tf.autograph.experimental.do_not_convert

    @plain
    def draws(_: Any) -> Any:
        first, take, at = tf.numpy_function(begin, [], [tf.int64, tf.int64, tf.int64], stateful=True)
        at = tf.reshape(at, [len(labels)])
        members = [
            ordered_records(
                order, one, InputCursor(epochs_per_iteration=None), names, compression=kind, at=at[i], single=True
            )
            for i, (order, one, names, kind) in enumerate(readers)
        ]
        picks = graph_draws(probabilities, seed=seed, worker=index, start=tf.reshape(first, []))
        return tf.data.Dataset.choose_from_datasets(members, picks).take(tf.reshape(take, []))

    with single_device_functions():  # Host-CPU input functions (see ordered_records).
        dataset = tf.data.Dataset.from_tensors(0).flat_map(draws).batch(per_step, drop_remainder=epochs is None)
    shown = dict(zip(labels, (round(p, 3) for p in probabilities)))
    text = (
        f"resumable stratified draws over {len(labels)} class groups, mix {shown}, {share} draws per epoch "
        f"({per_step} per step here), replayed after a resume"
    )
    return dataset, text


# Under parameter servers: how to make each option that keeps the claimed steps out work with them.
_CLAIM_FIXES = {
    "data_service": "Drop data_service: the claimed steps read each step's records on the worker that claims it.",
    "shard_policy": "Drop shard_policy (or pass 'auto'): the claimed steps split the data by step, not by worker.",
    "cache": "Drop cache: each claimed step reads its records at their byte offsets.",
    "on_corrupt": "Pass on_corrupt='raise' (verify='all' names a damaged file up front), or copy the files to a "
    "local disk.",
}


def _claim_fix(field: str, value: Any, why: str) -> str:
    """How to make the option ``field`` work with parameter-server steps claimed from a counter."""
    if field == "class_weights" and value == "a tf.Variable":
        return "Pass fixed class_weights (a name or a dict): each step's draws are then a function of its step."
    if field == "class_weights":
        return "Write the files with write_tfrecords(..., partition_by=label_key): one group of files per class."
    if field == "files" and "boto3" in why:
        return "Read s3:// through tensorflow-io (TFDIST_S3_READER=tfio) or copy the files to a file system TF opens."
    if field == "files":
        return "Write the files with tfdist.data.write_tfrecords, whose manifest holds every file's record count."
    return _CLAIM_FIXES.get(field, "")


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def _warn_once(message: str, *args: Any) -> None:
    """Logs ``message`` as a warning the first time this process asks."""
    with _WARNED_LOCK:
        if message in _WARNED:
            return
        _WARNED.add(message)
    _log.warning(message, *args)


def claimed(
    pipeline: Any, listing: Listing, *, strategy: Any, finish: Any, state: InputState
) -> tuple[Any, str] | None:
    """Under parameter servers: a dataset function whose workers claim global steps (None: 'buffer' order).

    Built eagerly on the coordinator: the listing, the order (record counts and byte offsets) and the
    ledger of claims (:mod:`tfdist.data.order.ledger`, on a ps, told to ``state``) are made here, and every worker's traced dataset reads the steps it claims
    (:mod:`tfdist.data.order.claims`; stratified draws: :mod:`tfdist.data.order.claimed_draws`). An option
    that keeps the claims out raises a DataError naming its fix; ``order='buffer'`` warns once that every
    worker then reads the whole data.
    """
    if pipeline.order == "buffer":
        _warn_once(
            "Input order 'buffer' under parameter servers: every worker reads the whole data, so an epoch of "
            "steps trains some records more than once and others not at all. Drop order='buffer' to claim "
            "each step from a counter (each record once per data epoch)."
        )
        return None
    groups = class_groups(listing, pipeline.label_key) if pipeline.class_weights is not None else {}
    obstacle = _obstacle(pipeline, groups=bool(groups), listing=listing, claimed=True)
    if obstacle is not None:
        field, value, why = obstacle
        raise invalid(
            DataError,
            field,
            value,
            f"a setting parameter-server steps can claim ({why})",
            f"{_claim_fix(field, value, why)} Or pass order='buffer': every worker then reads the whole data, "
            "and an epoch of steps trains some records more than once and others not at all.",
        )
    if drawn(pipeline, groups):
        return _claimed_draws(pipeline, listing, groups, strategy=strategy, finish=finish, state=state)
    return _claimed_steps(pipeline, listing, strategy=strategy, finish=finish, state=state)


def _claimed_draws(
    pipeline: Any, listing: Listing, groups: dict[str, Any], *, strategy: Any, finish: Any, state: InputState
) -> tuple[Any, str]:
    """Stratified draws under parameter servers: global step ``g`` claims draws ``g*B .. (g+1)*B`` of the
    draws one pipeline makes (the order of one process reading the pipeline)."""
    import tensorflow as tf

    from tfdist.data.order.claimed_draws import base_counts, claimed_draws

    order, files = _strata_order(pipeline, listing, groups, 1, drawn=True)
    compression = reading.one_compression([path for names in files for path in names], pipeline.source)
    batch = pipeline.batch_size
    layout = StreamLayout(global_batch=batch, streams=1, num_workers=1, worker=0, policy="file")
    ledger = StepLedger.of(strategy)
    with strategy.scope(), strategy.extended.colocate_vars_with(ledger.counter):  # Read with each claim.
        base = tf.Variable(base_counts(order, 0, batch), dtype=tf.int64, trainable=False, name="tfdist_claimed_draws")
    state.claiming(order, layout, ledger, on_seek=lambda step: base.assign(base_counts(order, step, batch)))
    dataset_fn = ledger.dataset_fn(
        strategy,
        claimed_draws,
        order,
        files,
        compression=compression,
        global_batch=batch,
        base=base,
        passes=pipeline.num_epochs,
        finish=finish,
    )

    shown = dict(zip(order.labels, (round(p, 3) for p in order.mix)))
    text = (
        f"claimed stratified draws over {len(order.labels)} class groups, mix {shown}: {order.share} draws "
        f"per data epoch, {-(-order.share // batch)} steps of {batch}; each step is claimed by the worker that "
        "runs it and trains the draws of that step"
    )
    return dataset_fn, text


def claimed_layout(pipeline: Any, records: int | None) -> tuple[StreamLayout, int, bool]:
    """The one reader of claimed steps for the whole cluster (sizes a step's share of a stream), the order's
    block (at most that share), and whether the streams start at block borders: when the block divides the
    share, each share is whole blocks (one piece each) and a data epoch keeps its ceil(records / batch) steps;
    else they are cut by records (a share then spans one block more)."""
    streams = pipeline.order_streams or default_streams(pipeline.batch_size, 1, "data", records=records)
    layout = StreamLayout(global_batch=pipeline.batch_size, streams=streams, num_workers=1, worker=0, policy="data")
    block = min(pipeline.order_block, layout.per_stream)
    return layout, block, layout.per_stream % block == 0


def _claimed_steps(
    pipeline: Any, listing: Listing, *, strategy: Any, finish: Any, state: InputState
) -> tuple[Any, str]:
    """The plain resumable order under parameter servers: each global step reads its records of every stream."""
    from tfdist.data.order.claims import steps_per_pass

    known = listing.records([f.path for f in listing.files])
    layout, block, aligned = claimed_layout(pipeline, known)
    order = epoch_order(
        listing,
        block=block,
        streams=layout.streams,
        window=0,
        seed=pipeline.seed or 0,
        shuffle=bool(pipeline.shuffle_buffer),
        compression=pipeline.compression,
        aligned=aligned,
    )
    paths = [f.path for f in listing.files]
    compression = reading.one_compression(paths, pipeline.source)
    dataset_fn = claiming_steps(
        pipeline, order, layout, paths, compression, strategy=strategy, finish=finish, state=state
    )

    text = (
        f"claimed steps: {order.num_records} records, {steps_per_pass(order, pipeline.batch_size)} steps per "
        f"data epoch of {layout.streams} streams ({layout.per_stream} record(s) of each per step); each step "
        "is claimed by the worker that runs it"
    )
    return dataset_fn, text


def claiming_steps(
    pipeline: Any,
    order: Any,
    layout: StreamLayout,
    paths: list[str],
    compression: str,
    *,
    strategy: Any,
    finish: Any,
    state: InputState,
    index: Any = None,
) -> Callable[..., Any]:
    """The dataset function of the workers claiming the steps of ``order`` from a ledger made on ``strategy``
    (told to ``state``); ``index``: the record index names and offsets are read from."""
    from tfdist.data.order.claims import claimed_steps

    ledger = StepLedger.of(strategy)
    state.claiming(order, layout, ledger)
    return ledger.dataset_fn(
        strategy,
        claimed_steps,
        order,
        paths,
        compression=compression,
        global_batch=pipeline.batch_size,
        passes=pipeline.num_epochs,
        finish=finish,
        index=index,
    )
