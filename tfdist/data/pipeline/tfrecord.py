"""TFRecord input pipelines with per-worker sharding, stratified sampling and tuning.

``TFRecordPipeline`` takes its options in groups (or each as a flat keyword
argument) and puts the parts together; each part has one job and its own module: ``files``
(listing), ``verify`` (framing check, a report value), ``reading`` (one
worker's records), ``stratify`` (class mixes), ``parsing``, ``_batching``.

Example:
    >>> import os, tempfile
    >>> import tensorflow as tf
    >>> from tfdist.data import TFRecordPipeline, write_tfrecords
    >>> def example(i):
    ...     return tf.train.Example(features=tf.train.Features(feature={
    ...         "x": tf.train.Feature(float_list=tf.train.FloatList(value=[float(i)] * 8)),
    ...         "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2]))}))
    >>> prefix = os.path.join(tempfile.mkdtemp(), "train")
    >>> _ = write_tfrecords([example(i) for i in range(10)], prefix, num_shards=2)
    >>> pipeline = TFRecordPipeline(files=prefix + "-*", batch_size=4,
    ...                             features={"x": tf.io.FixedLenFeature([8], tf.float32),
    ...                                       "y": tf.io.FixedLenFeature([], tf.int64)},
    ...                             label_key="y", as_supervised=True)
    >>> [int(y.shape[0]) for _, y in pipeline.dataset()]  # Every record: the last batch is partial.
    [4, 4, 2]
    >>> [os.path.basename(p) for p in pipeline.worker_files(worker=1, num_workers=2)]
    ['train-00001-of-00002.tfrecord']
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from tfdist._options import GroupedOptions, group
from tfdist.data.order.position import DataPosition, InputCursor
from tfdist.data.pipeline import _batching, _checks, _context, _indexed, _resumable, parsing, reading
from tfdist.data.pipeline import stratified as stratify
from tfdist.data.pipeline.options import (
    EpochOptions,
    ParseOptions,
    SampleOptions,
    ShardOptions,
    SourceOptions,
    TuningOptions,
)
from tfdist.data.pipeline.state import InputState, PipelineRun
from tfdist.data.records.files import Listing, compression_of, list_files
from tfdist.data.records.verify import VerifyReport, verify_files
from tfdist.data.sharding import ShardPlan, plan_shards
from tfdist.errors import DataError, invalid

__all__ = ["TFRecordPipeline"]

_log = logging.getLogger("tfdist.data")


def _static_batches(dataset: Any, batch_size: int, *, endless: bool) -> Any:
    """Ends the pipeline in a plain ``batch``, so tf.distribute splits its batches at a fixed size.

    ``fit(dataset)`` under MultiWorkerMirroredStrategy asks ``compute_batch_size`` how to split each
    worker's global batches. Behind a ``map`` it cannot tell and splits every batch into one piece per
    replica, a partial batch into smaller pieces: a worker whose share of an epoch is not a multiple of
    the global batch then takes more, smaller steps at the end of the epoch, and the steps no longer
    match the resumable order's (a resume there would skip or repeat records). With a final ``batch``
    each step takes ``batch_size / replicas`` records of the worker's stream, as the order plans. An
    endless stream's batches are all full: they keep a static size.
    """
    from tfdist import _compat

    return _compat.unbatch_dense(dataset).batch(batch_size, drop_remainder=endless)


class TFRecordPipeline(GroupedOptions, error=DataError):
    """A validated TFRecord input pipeline; ``dataset()`` builds it for one worker.

    The options are declared, documented and validated in six groups
    (:mod:`tfdist.data.pipeline.options`), held as ``source``
    (:class:`~tfdist.data.pipeline.options.SourceOptions`: files, compression,
    on_corrupt, verify), ``epochs`` (``EpochOptions``: batch_size, num_epochs,
    shuffle_buffer, seed, drop_remainder), ``parsing`` (``ParseOptions``:
    features, parse_fn, label_key, image_key, image_size, augment,
    as_supervised), ``sharding`` (``ShardOptions``: shard_policy, shard_key),
    ``sampling`` (``SampleOptions``: class_weights, num_classes, sample_block)
    and ``tuning`` (``TuningOptions``: data_service, deterministic, prefetch,
    num_parallel_reads, cache, private_threadpool_size, ram_budget_bytes,
    autotune_model). Every one of those fields is a keyword argument and an
    attribute (``pipeline.batch_size``); a whole group may be passed by name
    instead (``tuning=TuningOptions(...)``). ``files`` and ``batch_size`` are
    required, and exactly one of ``features`` and ``parse_fn``.

    Example:
        >>> from tfdist.data import TuningOptions
        >>> pipeline = TFRecordPipeline(files="/data/train-*", batch_size=32, parse_fn=lambda record: record,
        ...                             tuning=TuningOptions(prefetch=2))
        >>> pipeline.batch_size, pipeline.epochs.batch_size, pipeline.prefetch, pipeline.shard_policy
        (32, 32, 2, 'auto')
        >>> TFRecordPipeline(files="/data/train-*", batch_size=32, parse_fn=len, shuffle_bufer=10)
        Traceback (most recent call last):
        ...
        tfdist.errors.DataError: Invalid value for `options`. Received: ['shuffle_bufer']. Expected keyword options \
among ... (did you mean 'shuffle_buffer'?).
    """

    _run: PipelineRun = dataclasses.field(default_factory=PipelineRun, init=False, repr=False, compare=False)
    source = group(SourceOptions)
    epochs = group(EpochOptions)
    parsing = group(ParseOptions)
    sharding = group(ShardOptions, prefix="shard_")
    sampling = group(SampleOptions)
    tuning = group(TuningOptions)

    def __post_init__(self) -> None:
        """Rules across groups (each group has checked its own fields)."""
        if self.shard_policy == "hash" and (self.features is None or self.shard_key not in self.features):
            raise invalid(
                DataError,
                "shard_key",
                self.shard_key,
                "a feature of `features` with shard_policy='hash'",
                "Name the id feature to hash, e.g. shard_key='user_id'.",
            )
        if self.class_weights is not None and not self.label_key:
            raise invalid(DataError, "label_key", None, "the label feature with as_supervised or class_weights")

    # ------------------------------------------------------------------ files
    def listing(self) -> Listing:
        """Every input file with its size and (from the writer's manifest) record count; read afresh per call."""
        return list_files(self.source.files, on_corrupt=self.on_corrupt)

    def plan(self, num_workers: int, listing: Listing | None = None) -> ShardPlan:
        """How the files split over ``num_workers`` input pipelines (logged by ``dataset``)."""
        listing = listing or self.listing()
        return plan_shards(listing.sizes, num_workers=num_workers, policy=self.shard_policy, shard_key=self.shard_key)

    def worker_files(self, worker: int, num_workers: int) -> tuple[str, ...]:
        """The files input pipeline ``worker`` of ``num_workers`` opens (all files under 'data'/'hash'/'off')."""
        return reading.worker_files(self.plan(num_workers), worker)

    def worker_records(
        self, worker: int, num_workers: int, *, plan: ShardPlan | None = None, listing: Listing | None = None
    ) -> tuple[Any, VerifyReport]:
        """The serialized records input pipeline ``worker`` reads in one pass, and its verification report.

        The same stream ``dataset()`` parses (before shuffling records, stratifying
        and batching; in the resumable order, epoch 0 as ``dataset()`` reads it;
        with ``class_weights``, the worker's planned files before stratifying):
        :func:`~tfdist.data.report.skew_report` counts it.
        """
        from tfdist import _compat

        listing = listing or self.listing()
        slot = _context.PipelineSlot(index=worker, count=num_workers, batch_size=self.batch_size, per_replica=True)
        planned = plan is not None or self.class_weights is not None
        layout = None if planned else _resumable.layout_for(self, groups={}, listing=listing, where=slot)
        if layout is not None:
            chunks, _ = _resumable.records(self, listing, layout, InputState(epochs_per_iteration=1))
            return _compat.unbatch_dense(chunks), self._verify_share(listing, slot)
        plan = plan or self.plan(num_workers, listing)
        return self._read(plan, worker, listing)

    def class_groups(self) -> dict[str, list[tuple[str, int]]]:
        """Class value -> its (path, size) files, from ``PREFIX-LABEL=VALUE-*`` names; {} if unpartitioned."""
        return stratify.class_groups(self.listing(), self.label_key)

    def _read(
        self,
        plan: ShardPlan,
        worker: int,
        listing: Listing,
        streams: int = 1,
        *,
        on_server: bool = False,
        local: bool | None = None,
    ) -> tuple[Any, VerifyReport]:
        report = verify_files(plan.files_for(worker), self.source, listing)
        records = reading.read_records(
            plan,
            worker,
            source=self.source,
            shard=self.sharding,
            features=self.features,
            epoch=self.epochs,
            tuning=self.tuning,
            limits=report.limits,
            streams=streams,
            on_server=on_server,
            local=local,
        )
        return records, report

    @property
    def last_report(self) -> dict[str, Any]:
        """What the last ``dataset()`` call checked and skipped (on_corrupt='skip')."""
        last = self._run.report
        return last.to_dict() if last is not None else {}

    # ---------------------------------------------------------------- resume
    def _state(self) -> InputState:
        return self._run.input(self.epochs)

    @property
    def cursor(self) -> InputCursor:
        """Where this pipeline's datasets start reading (``order='resumable'``); :meth:`seek` starts it."""
        return self._state().cursor

    def start_at(self, position: DataPosition) -> None:
        """Starts the next iteration of this pipeline's datasets at ``position`` (``order='resumable'``).

        Example:
            >>> from tfdist.data.order import DataPosition
            >>> pipeline = TFRecordPipeline(files="/data/train-*", batch_size=8, parse_fn=len)
            >>> pipeline.start_at(DataPosition(epoch=1, step=3)); pipeline.cursor.position
            DataPosition(epoch=1, step=3)
        """
        self._state().cursor.start(position)

    # ResumableInput (tfdist.data.pipeline.state): what tfdist's Keras callbacks ask and tell, for every strategy.
    def fingerprint(self) -> dict[str, Any] | None:
        """The order of the last dataset built, as a backup records it; None: not a resumable order."""
        return self._state().fingerprint()

    def check_fingerprint(self, saved: Mapping[str, Any], *, backup: str) -> bool:
        """Checks a backup's recorded fingerprint against this order; a change raises a DataError naming
        the option (:meth:`~tfdist.data.pipeline.state.ResumableInput.check_fingerprint`)."""
        return self._state().check_fingerprint(saved, backup=backup)

    def steps_per_epoch(self) -> int | None:
        """Global steps of one data epoch of the last dataset built (None: none built, or not resumable)."""
        return self._state().steps_per_epoch()

    def seek(self, *, epoch: int, step: int, steps_per_epoch: int | None) -> None:
        """Goes on at ``fit``'s epoch ``epoch``, step ``step`` (epochs of ``steps_per_epoch`` steps): the
        next iteration's position, or under parameter servers the next global step to claim."""
        self._state().seek(epoch=epoch, step=step, steps_per_epoch=steps_per_epoch)

    def claimed_steps(self) -> int | None:
        """Global steps the parameter-server workers claimed so far; None without claimed steps."""
        return self._state().claimed_steps()

    def claims_ledger(self) -> Any:
        """Under parameter servers: the ledger of the claimed steps (:mod:`tfdist.data.order.ledger`), which
        ``tfdist.keras.ResumeInput`` saves with the backup; None without claimed steps."""
        return self._state().claims_ledger()

    # ---------------------------------------------------------------- dataset
    def dataset_fn(self, input_context: Any) -> Any:
        """For ``strategy.distribute_datasets_from_function`` and ParameterServerStrategy ``fit``."""
        return self.dataset(input_context)

    def claimed_dataset_fn(self, strategy: Any) -> Any | None:
        """Under ParameterServerStrategy: a dataset function whose workers claim global steps (one pass per epoch).

        Every worker's dataset takes the next global step from one counter on a parameter server when a
        step asks for its batch, so each step of the epoch order is trained once, by whichever worker runs
        it (:mod:`tfdist.data.order.claims`); with ``class_weights`` over class groups each step trains the
        draws of that step of one stream of draws (:mod:`tfdist.data.order.claimed_draws`). None under the
        'buffer' order (logged once); an option that keeps the claims out raises a DataError naming its fix.
        ``tfdist.keras.fit_input`` calls it; call it on the coordinator, eagerly.
        """
        where = _context.PipelineSlot(index=0, count=1, batch_size=self.batch_size, per_replica=False)

        def finish(steps: Any) -> Any:  # Each step's serialized records (a vector) -> its parsed batch.
            if self.parse_fn is None:
                return steps.map(self._parse_batch)

            def parse(records: Any) -> Any:  # A parse_fn takes one record at a time.
                import tensorflow as tf

                records = tf.data.Dataset.from_tensor_slices(records)
                return parsing.parse_elements(records, self.parsing, seed=self.seed, deterministic=True).batch(
                    self.batch_size
                )

            batches = steps.flat_map(parse)
            return parsing.supervised(batches, self.label_key) if self.as_supervised else batches

        index = _indexed.index_of(self)
        if index is not None:  # Nothing listed or walked: the index's arrays (verified when it was built).
            dataset_fn, text = _indexed.claimed(self, index, strategy=strategy, finish=finish, state=self._state())
            self._run.report = VerifyReport()
            self._check_features(index.paths[0])
            _log.info("Input pipeline under parameter servers: %s.", text)
            return dataset_fn
        listing = self.listing()
        built = _resumable.claimed(self, listing, strategy=strategy, finish=finish, state=self._state())
        if built is None:
            return None
        self._run.report = self._verify_share(listing, where)
        self._check_features(listing.files[0].path if listing.files else None)
        _log.info("Input pipeline under parameter servers: %s.", built[1])
        return built[0]

    def dataset(self, input_context: Any | None = None, *, cluster: Any | None = None) -> Any:
        """This worker's ``tf.data.Dataset``.

        Args:
          input_context: A ``tf.distribute.InputContext`` (batches are then per
            replica); None derives this worker's share from ``cluster``, then
            TF_CONFIG, with global batches for ``model.fit``.
          cluster: The :class:`~tfdist.cluster.spec.ClusterSpec` this process runs in
            (default: from TF_CONFIG).
        """
        records, report, where, stratified, resumable = self._records_for(input_context, cluster)
        self._run.report = report
        return self._finish(records, where, stratified=stratified, resumable=resumable)

    def _verify_share(self, listing: Listing, where: _context.PipelineSlot) -> VerifyReport:
        """Verifies this worker's share of the files under the 'file' plan: each file is checked by one worker."""
        return verify_files(self.plan(where.count, listing).files_for(where.index), self.source, listing)

    def _records_for(
        self, input_context: Any | None, cluster: Any | None
    ) -> tuple[Any, VerifyReport, _context.PipelineSlot, bool, bool]:
        import tensorflow as tf

        where = _context.slot(input_context, self.batch_size, cluster=cluster)
        _checks.check_cache_path(self.cache)
        index = _indexed.index_of(self)
        if index is not None:
            return self._indexed_records(index, where)
        listing = self.listing()
        groups = stratify.class_groups(listing, self.label_key) if self.class_weights is not None else {}
        reports: list[VerifyReport] = []
        local = listing.local  # From the listing: the mount table is read once per build.

        def read_share(plan: ShardPlan, index: int, streams: int = 1) -> Any:
            records, report = self._read(
                plan, index, listing, streams, on_server=self.data_service is not None, local=local
            )
            reports.append(report)
            if len(reports) == 1 and plan.files_for(index):  # One file names a mismatch.
                self._check_features(plan.files_for(index)[0])
            return records

        layout = _resumable.layout_for(self, groups=groups, listing=listing, where=where)
        if layout is None:
            self._state().reading(None, None)  # ResumeInput then says the input cannot resume.
        if layout is not None:
            reports.append(self._verify_share(listing, where))
            records, plan_text = self._resumable_records(listing, groups, layout, where)
        elif self.data_service is not None:
            records, plan_text = read_share(self.plan(1, listing), 0), "tf.data service splits the work"
        elif groups:
            records, plan_text = stratify.stratified_records(
                groups,
                listing=listing,
                source=self.source,
                shard_policy=self.shard_policy,
                sample=self.sampling,
                epoch=self.epochs,
                index=where.index,
                count=where.count,
                read_share=lambda plan: read_share(plan, where.index, len(groups)),
            )
        else:
            plan = self.plan(where.count, listing)
            records, plan_text = read_share(plan, where.index), f"{plan.policy}: {plan.reason}"
            if self.class_weights is not None and tf.executing_eagerly():
                stratify.check_labels(
                    records,
                    parse=self.parsing,
                    num_classes=self.num_classes,
                    where=f"input pipeline {where.index}/{where.count}'s files",
                )
            self._warn_small_share(_checks.share_of(listing.records(plan.files_for(where.index)), plan, where), where)
        _log.info("Input pipeline %d/%d: %s.", where.index, where.count, plan_text)
        report = sum(reports[1:], reports[0]) if reports else VerifyReport()
        return records, report, where, bool(groups), layout is not None

    def _indexed_records(self, index: Any, where: _context.PipelineSlot) -> tuple[Any, VerifyReport, Any, bool, bool]:
        """Nothing listed or walked: the record index's arrays (verified when it was built)."""
        self._check_features(index.paths[0])
        records, plan_text = _indexed.records(self, index, where, self._state())
        _log.info("Input pipeline %d/%d: %s.", where.index, where.count, plan_text)
        return records, VerifyReport(), where, False, True

    def _resumable_records(
        self, listing: Listing, groups: dict[str, Any], layout: Any, where: _context.PipelineSlot
    ) -> tuple[Any, str]:
        """The resumable order's records (stratified draws when there are class groups) and its plan text."""
        self._check_features(listing.files[0].path if listing.files else None)
        if _resumable.drawn(self, groups):
            records, plan_text = _resumable.strata(self, listing, groups, layout, self._state())
        else:
            records, plan_text = _resumable.records(self, listing, layout, self._state())
        known = listing.records([f.path for f in listing.files])
        self._warn_small_share(None if known is None else known // where.count, where)
        return records, plan_text

    def _check_features(self, path: str | None) -> None:
        """Names a feature spec that does not match the records, from one record of ``path`` (eager builds)."""
        import tensorflow as tf

        if path is None or not tf.executing_eagerly():
            return
        parsing.check_features(
            path,
            compression_of(path, self.compression) or "",
            self.parsing,
            num_classes=self.num_classes if self.class_weights is not None else None,
        )

    def _warn_small_share(self, share: int | None, where: _context.PipelineSlot) -> None:
        _checks.warn_small_share(share, where, num_epochs=self.num_epochs, drop_remainder=self.drop_remainder)

    def _finish(self, records: Any, where: _context.PipelineSlot, *, stratified: bool, resumable: bool) -> Any:
        """Cache, shuffle, repeat, parse, batch, label, service, options, prefetch."""
        import tensorflow as tf

        if resumable:  # Ordered, shuffled and repeated by the epoch order already.
            pass
        elif self.cache:
            if stratified:
                raise invalid(
                    DataError,
                    "cache",
                    self.cache,
                    "False with stratified reading (class_weights over class groups)",
                    "A cache would replay one epoch's draw of the classes: put the "
                    "files on fast local disk instead, or read without class_weights.",
                )
            # The serialized records of one pass, before shuffle and repeat: every epoch is shuffled (and
            # augmented) anew, and an endless run (num_epochs=None) does not cache an endless stream.
            records = records.cache("" if self.cache is True else str(self.cache))
        if self.shuffle_buffer and not resumable:
            records = records.shuffle(self.shuffle_buffer, seed=self.seed)
        if not stratified and not resumable:
            records = records.repeat(self.num_epochs)
        fallback = self.class_weights is not None and not stratified
        batching = dict(
            drop_remainder=self.drop_remainder,
            finite=self.num_epochs is not None,
            where=f"{where.index}/{where.count}",
            # The drop count is taken in this process; not where the pipeline runs elsewhere.
            logged=self.data_service is None and tf.executing_eagerly(),
        )
        if resumable and self.parse_fn is not None:  # The order's chunks -> records, for a per-record parse_fn.
            from tfdist import _compat

            records = _compat.unbatch_dense(records)
        if self.parse_fn is not None or fallback:
            dataset = parsing.parse_elements(records, self.parsing, seed=self.seed, deterministic=self.deterministic)
            if fallback:
                dataset = stratify.resample(dataset, sample=self.sampling, parse=self.parsing, seed=self.seed)
            dataset = _batching.batch(
                dataset, where.batch_size, parallel=True, deterministic=self.deterministic, **batching
            )
        else:
            # Batch the serialized records first, then parse (and decode) a whole batch per map call: one
            # tf.data element per batch instead of per record (measured in BENCHMARKS.md).
            # (features, label) pairs are split in the same map: one traced function and one stage less.
            dataset = _batching.batch(records, where.batch_size, chunks=resumable, **batching).map(
                self._parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic
            )
            if resumable and not where.per_replica and where.count > 1:
                dataset = _static_batches(dataset, where.batch_size, endless=self.num_epochs is None)
        if self.as_supervised and (self.parse_fn is not None or fallback):
            dataset = parsing.supervised(dataset, self.label_key)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        options.deterministic = self.deterministic
        options.threading.private_threadpool_size = self.private_threadpool_size
        # Off unless asked: with the model on, deleting an iterator can wait up to 60 s (TuningOptions).
        options.autotune.enabled = self.tuning.autotune_enabled
        if self.ram_budget_bytes:
            options.autotune.ram_budget = self.ram_budget_bytes
        if self.data_service is not None:  # The service's workers run the graph as it is here: options first.
            dataset = dataset.with_options(options).apply(
                tf.data.experimental.service.distribute(
                    processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
                    service=self.data_service,
                    job_name=self._job_name(),
                )
            )
        dataset = dataset.with_options(options)
        return dataset.prefetch(tf.data.AUTOTUNE if self.prefetch == "autotune" else self.prefetch)

    def _parse_batch(self, batch: Any) -> Any:
        """A batch of serialized records parsed (and decoded); (features, label) when ``as_supervised``."""
        features = parsing.parse_batch(batch, self.parsing, seed=self.seed)
        return parsing.split_label(features, self.label_key) if self.as_supervised else features

    def _job_name(self) -> str:
        """The tf.data service job every consumer of this pipeline shares (stable across processes)."""
        digest = hashlib.sha1(repr((self.files, self.seed, self.batch_size, self.num_epochs)).encode()).hexdigest()
        return f"tfdist-{digest[:12]}"
