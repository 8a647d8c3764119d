"""TFRecord input pipelines with per-worker sharding, stratified sampling and tuning.

Example:
    >>> import tensorflow as tf
    >>> from tfdist.data import TFRecordPipeline
    >>> pipeline = TFRecordPipeline(files="/data/train-*.tfrecord", batch_size=256,
    ...                             features={"x": tf.io.FixedLenFeature([8], tf.float32),
    ...                                       "y": tf.io.FixedLenFeature([], tf.int64)},
    ...                             label_key="y", as_supervised=True)
    >>> # model.fit(pipeline.dataset()) or strategy.distribute_datasets_from_function(pipeline.dataset_fn)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

from tfdist._names import describe_choices
from tfdist.data import _batching, _context, _decode, _framing, remote
from tfdist.data.sampling import Weights, resolve_weights, stratified_sample
from tfdist.data.sharding import SHARD_POLICIES, ShardPlan, plan_shards
from tfdist.data.writer import CLASS_GROUP, prefix_of, read_manifest
from tfdist.errors import DataError, invalid, require_int

__all__ = ["TFRecordPipeline", "CORRUPT_POLICIES", "VERIFY_MODES"]

_log = logging.getLogger("tfdist.data")
CORRUPT_POLICIES = ("raise", "skip")
VERIFY_MODES = ("local", "all", "none")
_COMPRESSION_BY_SUFFIX = ((".gz", "GZIP"), (".gzip", "GZIP"), (".zz", "ZLIB"), (".zlib", "ZLIB"))
AUTOTUNE = -1
_HASH_BLOCK = 512  # Records per vectorized hash-key parse.


def _compression_of(path: str, given: Optional[str]) -> Optional[str]:
    if given not in (None, "auto"):
        return given
    for suffix, kind in _COMPRESSION_BY_SUFFIX:
        if path.endswith(suffix):
            return kind
    return None


@dataclasses.dataclass(frozen=True)
class TFRecordPipeline:
    """A validated TFRecord input pipeline; ``dataset()`` builds it for one worker.

    Args:
      files: A glob (or list of globs/paths); local, ``gs://``, or ``s3://``/
        ``hdfs://``/``az://`` through tensorflow-io.
      batch_size: The global batch size; split per replica under
        ``distribute_datasets_from_function``.
      features: Feature spec for ``tf.io.parse_example``.
      parse_fn: Instead of ``features``: serialized record -> features.
      shard_policy: 'auto', 'file' (files split across workers, byte-balanced),
        'data' (every N-th record), 'hash' (``hash(shard_key) % workers``) or 'off'.
      shard_key: The feature hashed by 'hash' (e.g. a user id).
      num_epochs: Passes over the data; None repeats forever.
      shuffle_buffer: Records in the shuffle buffer; 0 disables shuffling.
      seed: Seed for file order, shuffling, sampling and augmentation.
      label_key: The label feature (for ``as_supervised`` and stratification).
      class_weights: Stratify by ``label_key``: 'balanced', 'natural', 'sqrt',
        class -> weight, or a ``tf.Variable`` (one entry per class, in
        ``class_groups()`` order: integer labels ascending). Reads per-class shard groups
        written with ``write_tfrecords(partition_by=label_key)``; otherwise
        falls back to rejection resampling (reads more data to keep the mix).
        A finite epoch in the data's own mix ('natural') reads each record
        once; any other mix draws as many records as the worker's share,
        re-drawing small classes and leaving part of large ones unread.
      num_classes: Classes 0..n-1 for the unpartitioned fallback.
      sample_block: Records drawn per class choice when stratifying (see
        :func:`stratified_sample`). 4 (default) keeps stratified reading
        within 10% of plain reading (per-record sampling costs ~20% on 2
        cores, BENCHMARKS.md); 1 mixes per record.
      compression: None/'GZIP'/'ZLIB', or 'auto' to detect from the file name.
      on_corrupt: 'raise' a DataError naming the file, or 'skip' the damaged
        part and count what was lost (``last_report``).
      verify: Check file framing before reading: 'local' (local, uncompressed
        files: headers only, fast), 'all' (every file, reads compressed and
        remote files whole), 'none'.
      data_service: 'grpc://host:port' of a tf.data service dispatcher: parsing
        and decoding run on its workers; each element goes to one consumer.
      image_key: Decode this feature (JPEG/PNG) to float32 in [0, 1].
      image_size: (height, width) to resize decoded images to.
      augment: Random left-right flips (seeded) of decoded images.
      deterministic: Keep element order reproducible (slower interleave).
      as_supervised: Yield (features, label) pairs for ``fit``.
      drop_remainder: Drop the last partial batch for a static batch shape.
        Off by default: a finite epoch keeps every record (tf.distribute
        handles partial and uneven batches). When on, what is dropped is
        logged with its count.
      prefetch: Batches to prefetch, or 'autotune'.
      num_parallel_reads: Files read at once, or 'autotune'.
      cache: Cache parsed elements in memory (True) or in a file (a path).
      private_threadpool_size: tf.data threads for this pipeline (0: shared).
      ram_budget_bytes: Autotune RAM budget (None: TF's default).
    """

    files: Union[str, Sequence[str]]
    batch_size: int
    features: Optional[Mapping[str, Any]] = None
    parse_fn: Optional[Callable[[Any], Any]] = None
    shard_policy: str = "auto"
    shard_key: Optional[str] = None
    num_epochs: Optional[int] = 1
    shuffle_buffer: int = 0
    seed: Optional[int] = None
    label_key: Optional[str] = None
    class_weights: Optional[Weights] = None
    num_classes: Optional[int] = None
    sample_block: int = 4
    compression: Optional[str] = "auto"
    on_corrupt: str = "raise"
    verify: str = "local"
    data_service: Optional[str] = None
    image_key: Optional[str] = None
    image_size: Optional[tuple[int, int]] = None
    augment: bool = False
    deterministic: bool = True
    as_supervised: bool = False
    drop_remainder: bool = False
    prefetch: Union[int, str] = "autotune"
    num_parallel_reads: Union[int, str] = "autotune"
    cache: Union[bool, str] = False
    private_threadpool_size: int = 0
    ram_budget_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        files = [self.files] if isinstance(self.files, str) else list(self.files)
        if not files or not all(isinstance(f, str) and f for f in files):
            raise invalid(DataError, "files", self.files, "a glob or a non-empty list of paths")
        object.__setattr__(self, "files", tuple(files))
        for name in ("batch_size", "sample_block"):
            require_int(DataError, name, getattr(self, name), minimum=1)
        if self.num_epochs is not None:
            require_int(DataError, "num_epochs", self.num_epochs, minimum=1)
        for name in ("shuffle_buffer", "private_threadpool_size"):
            require_int(DataError, name, getattr(self, name), minimum=0)
        if (self.features is None) == (self.parse_fn is None):
            raise invalid(DataError, "features", self.features, "exactly one of `features` and `parse_fn`",
                          "Pass a feature spec dict, or a parse function of one serialized record.")
        for name, choices in (("shard_policy", SHARD_POLICIES), ("on_corrupt", CORRUPT_POLICIES),
                              ("verify", VERIFY_MODES), ("compression", ("auto", "GZIP", "ZLIB", None))):
            value = getattr(self, name)
            if value not in choices:
                raise invalid(DataError, name, value, describe_choices(str(value), [str(c) for c in choices]))
        if self.shard_policy == "hash" and (not self.shard_key or self.features is None
                                            or self.shard_key not in self.features):
            raise invalid(DataError, "shard_key", self.shard_key, "a feature of `features` with shard_policy='hash'",
                          "Name the id feature to hash, e.g. shard_key='user_id'.")
        for name in ("label_key", "image_key"):
            key = getattr(self, name)
            if key is not None and self.features is not None and key not in self.features:
                raise invalid(DataError, name, key, f"a feature of `features` ({sorted(self.features)})")
        if (self.as_supervised or self.class_weights is not None) and not self.label_key:
            raise invalid(DataError, "label_key", None, "the label feature with as_supervised or class_weights")
        if (self.image_key is None) != (self.image_size is None):
            raise invalid(DataError, "image_size", self.image_size, "image_key and image_size together")
        if self.image_size is not None:
            size = tuple(self.image_size)
            if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
                raise invalid(DataError, "image_size", self.image_size, "(height, width), positive integers")
            object.__setattr__(self, "image_size", size)
        if self.data_service is not None and not re.match(r"^grpc(\+local)?://[^/]+:\d+$", self.data_service):
            raise invalid(DataError, "data_service", self.data_service, "'grpc://host:port' of a dispatcher")
        for name in ("prefetch", "num_parallel_reads"):
            value = getattr(self, name)
            if value != "autotune":
                require_int(DataError, name, value, minimum=1)

    # ------------------------------------------------------------------ files
    @functools.cached_property
    def _listing(self) -> tuple[tuple[str, int], ...]:
        """(path, size) of every input file, sorted; the same on every worker."""
        import tensorflow as tf

        paths: list[str] = []
        for pattern in self.files:
            remote.ensure_filesystem(pattern)
            matched = remote.glob(pattern)
            if not matched:
                raise invalid(DataError, "files", pattern, "a pattern that matches at least one file",
                              "Check the path; globs need quotes in the shell.")
            paths.extend(matched)
        paths = sorted(set(p for p in paths if not p.endswith("-manifest.json")))
        with ThreadPoolExecutor(max_workers=min(32, len(paths))) as pool:
            sizes = list(pool.map(remote.size, paths))
        return tuple(zip(paths, sizes))

    @functools.cached_property
    def _manifest_records(self) -> dict[str, int]:
        """path -> records, from the writer manifests beside the input files (each read once)."""
        counts: dict[str, int] = {}
        for prefix in sorted({p for p in (prefix_of(path) for path, _ in self._listing) if p}):
            manifest = read_manifest(prefix)
            if manifest is not None:
                counts.update((path, info["records"]) for path, info in manifest["files"].items())
        return counts

    def plan(self, num_workers: int) -> ShardPlan:
        """How the files split over ``num_workers`` input pipelines (logged by ``dataset``)."""
        return plan_shards(self._listing, num_workers=num_workers, policy=self.shard_policy, shard_key=self.shard_key)

    def class_groups(self) -> dict[str, list[tuple[str, int]]]:
        """Class value -> its (path, size) files, from ``PREFIX-LABEL=VALUE-*`` names; {} if unpartitioned."""
        groups: dict[str, list[tuple[str, int]]] = {}
        for path, size in self._listing:
            match = CLASS_GROUP.search(path)
            if match is None or match.group("key") != self.label_key:
                return {}
            groups.setdefault(match.group("value"), []).append((path, size))
        # Integer labels in numeric order (2 before 10): the order of a tf.Variable of class weights.
        return dict(sorted(groups.items(), key=lambda kv: (0, int(kv[0]), "") if kv[0].lstrip("-").isdigit()
                           else (1, 0, kv[0])))

    def _checked(self, paths: Sequence[str]) -> dict[str, int]:
        """Framing-checks ``paths``; returns path -> records to take (-1: all). Raises or records losses."""
        def wanted(path: str) -> bool:
            local = "://" not in path and _compression_of(path, self.compression) is None
            return self.verify == "all" or (self.verify == "local" and local)

        todo = [p for p in paths if wanted(p)]
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(todo)))) as pool:
            checks = list(pool.map(lambda p: _framing.check_file(p, _compression_of(p, self.compression)), todo))
        limits: dict[str, int] = {}
        lost = {c.path: _lost_records(c, self._manifest_records.get(c.path)) for c in checks if not c.ok}
        for check in checks:
            if check.ok:
                continue
            if self.on_corrupt == "raise":
                raise DataError(f"Corrupt TFRecord file {check.path}: {check.problem}; {check.records} good records "
                                f"before it, {check.lost_bytes} bytes unreadable. Re-write the file, or pass "
                                "on_corrupt='skip' to train on the readable records.")
            limits[check.path] = check.records
            count, exact = lost[check.path]
            _log.warning("Skipping the damaged part of %s: %s; %s%d records lost.", check.path, check.problem,
                         "" if exact else "about ", count)
        report = getattr(self, "_last_report", None) or {"files_checked": 0, "corrupt_files": [],
                                                         "records_kept_from_corrupt": 0, "records_lost": 0,
                                                         "records_lost_exact": True}
        report["files_checked"] += len(checks)
        report["corrupt_files"] = sorted(report["corrupt_files"] + list(lost))
        report["records_kept_from_corrupt"] += sum(c.records for c in checks if not c.ok)
        report["records_lost"] += sum(count for count, _ in lost.values())
        report["records_lost_exact"] = report["records_lost_exact"] and all(exact for _, exact in lost.values())
        object.__setattr__(self, "_last_report", report)  # A diagnostic cache, not configuration.
        return limits

    @property
    def last_report(self) -> dict[str, Any]:
        """What the last ``dataset()`` call checked and skipped (on_corrupt='skip')."""
        return dict(getattr(self, "_last_report", {}))

    # ---------------------------------------------------------------- dataset
    def dataset_fn(self, input_context: Any) -> Any:
        """For ``strategy.distribute_datasets_from_function`` and ParameterServerStrategy ``fit``."""
        return self.dataset(input_context)

    def dataset(self, input_context: Optional[Any] = None) -> Any:
        """This worker's ``tf.data.Dataset``.

        Args:
          input_context: A ``tf.distribute.InputContext`` (batches are then per
            replica); None derives this worker's share from TF_CONFIG, with
            global batches for ``model.fit``.
        """
        import tensorflow as tf

        where = _context.slot(input_context, self.batch_size)
        object.__setattr__(self, "_last_report", None)  # Each dataset() call reports its own checks.
        groups = self.class_groups() if self.class_weights is not None else {}
        if self.data_service is not None:
            records, plan_text = self._records(self.plan(1), 0, None), "tf.data service splits the work"
        elif groups:
            records, plan_text = self._stratified(groups, where)
        else:
            plan = self.plan(where.count)
            records, plan_text = self._records(plan, where.index, None), f"{plan.policy}: {plan.reason}"
        _log.info("Input pipeline %d/%d: %s.", where.index, where.count, plan_text)
        if self.shuffle_buffer:
            records = records.shuffle(self.shuffle_buffer, seed=self.seed)
        if not groups:
            records = records.repeat(self.num_epochs)
        fallback = self.class_weights is not None and not groups
        batching = dict(drop_remainder=self.drop_remainder, finite=self.num_epochs is not None,
                        where=f"{where.index}/{where.count}",
                        # The drop count is taken in this process; not where the pipeline runs elsewhere.
                        logged=self.data_service is None and tf.executing_eagerly())
        if self.parse_fn is not None or fallback:
            dataset = self._parse_elements(records)
            if fallback:
                dataset = self._resample(dataset)
            dataset = _batching.batch(dataset, where.batch_size, parallel=True, deterministic=self.deterministic,
                                      **batching)
        else:
            # Batch the serialized records first, then parse (and decode) a whole batch per map call: one
            # tf.data element per batch instead of per record (measured in BENCHMARKS.md).
            dataset = _batching.batch(records, where.batch_size, **batching).map(
                self._parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)
        if self.cache:
            dataset = dataset.cache("" if self.cache is True else str(self.cache))
        if self.as_supervised:
            label = self.label_key
            dataset = dataset.map(lambda f: ({k: v for k, v in f.items() if k != label}, f[label]))
        if self.data_service is not None:
            dataset = dataset.apply(tf.data.experimental.service.distribute(
                processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=self.data_service,
                job_name=self._job_name()))
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        options.deterministic = self.deterministic
        options.threading.private_threadpool_size = self.private_threadpool_size
        if self.ram_budget_bytes:
            options.autotune.ram_budget = self.ram_budget_bytes
        dataset = dataset.with_options(options)
        return dataset.prefetch(tf.data.AUTOTUNE if self.prefetch == "autotune" else self.prefetch)

    def _job_name(self) -> str:
        """The tf.data service job every consumer of this pipeline shares (stable across processes)."""
        digest = hashlib.sha1(repr((self.files, self.seed, self.batch_size, self.num_epochs)).encode()).hexdigest()
        return f"tfdist-{digest[:12]}"

    def _records(self, plan: ShardPlan, index: int, limit: Optional[int]) -> Any:
        import tensorflow as tf

        paths = list(plan.files_for(index))
        limits = self._checked(paths) if self.verify != "none" else {}
        reads = min(len(paths), 16) if self.num_parallel_reads == "autotune" else self.num_parallel_reads
        compressions = {p: _compression_of(p, self.compression) or "" for p in paths}
        if len(set(compressions.values())) > 1:
            raise invalid(DataError, "compression", sorted(set(compressions.values())), "one compression for all files",
                          "Split compressed and uncompressed files into two pipelines.")
        compression = next(iter(compressions.values()))
        take = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(limits) or [""]), tf.constant(list(limits.values()) or [-1], tf.int64)), -1)
        files = tf.data.Dataset.from_tensor_slices(paths)
        if self.shuffle_buffer and plan.policy != "data":
            files = files.shuffle(len(paths), seed=self.seed)
        records = remote.staged_files(files, paths).interleave(
            lambda path, local: tf.data.TFRecordDataset(local, compression_type=compression, buffer_size=1 << 20)
            .take(take.lookup(path)), cycle_length=max(1, reads), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic or plan.policy == "data")
        if self.on_corrupt == "skip":
            records = records.ignore_errors(log_warning=True)
        if plan.policy == "data":
            records = records.shard(plan.num_workers, index)
        elif plan.policy == "hash":
            keep = _decode.key_mask(self.shard_key, self.features[self.shard_key],  # type: ignore[index]
                                    plan.num_workers, index)
            records = records.batch(_HASH_BLOCK).map(
                lambda block: tf.boolean_mask(block, keep(block)), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=self.deterministic).unbatch()
        return records.take(limit) if limit is not None else records

    def _stratified(self, groups: dict[str, list[tuple[str, int]]], where: Any) -> tuple[Any, str]:
        counts = {label: self._records_in(files) for label, files in groups.items()}
        per_class = {}
        # Each class group is split on its own: 'data'/'off' as asked, otherwise 'auto' (by file when the
        # group has enough balanced files, else by record). 'hash' needs parsed keys and is not applied here.
        policy = self.shard_policy if self.shard_policy in ("data", "off") else "auto"
        for label, files in groups.items():
            per_class[label] = self._records(plan_shards(files, num_workers=where.count, policy=policy),
                                             where.index, None)
        epoch = sum(counts.values()) // where.count
        weights = self.class_weights
        if isinstance(weights, Mapping):
            weights = {str(k): v for k, v in weights.items()}
        mix = resolve_weights(weights, counts=counts) if not _is_variable(weights) else "a tf.Variable"
        total = sum(counts.values())
        natural = isinstance(mix, dict) and all(abs(p - counts[k] / total) < 1e-9 for k, p in mix.items())
        if natural and self.num_epochs is not None:
            # The mix is the data's own: a finite epoch is one pass over this worker's share, each record once.
            per_class = {label: data.repeat(self.num_epochs) for label, data in per_class.items()}
            sampled = stratified_sample(per_class, weights, counts=counts, seed=self.seed,  # type: ignore[arg-type]
                                        block=self.sample_block, on_exhausted="drop")
            return sampled, f"stratified over {len(groups)} class shard groups, natural mix, each record once"
        # Any other mix re-draws small classes and leaves part of large ones unread in an epoch (its purpose).
        sampled = stratified_sample(per_class, weights, counts=counts, seed=self.seed,  # type: ignore[arg-type]
                                    block=self.sample_block)
        sampled = sampled.take(epoch * self.num_epochs) if self.num_epochs is not None else sampled
        return sampled, f"stratified over {len(groups)} class shard groups, mix {mix}, {epoch} records per epoch"

    def _records_in(self, files: Sequence[tuple[str, int]]) -> int:
        """Records in ``files``: from the writer's manifest when it covers them, else a framing walk."""
        if all(path in self._manifest_records for path, _ in files):
            return sum(self._manifest_records[path] for path, _ in files)
        return sum(_framing.check_file(path, _compression_of(path, self.compression)).records for path, _ in files)

    def _parse_elements(self, records: Any) -> Any:
        """Per record: the user's parse_fn, or parse (and decode) one example at a time."""
        import tensorflow as tf

        if self.parse_fn is not None:
            return records.map(self.parse_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)
        parsed = records.map(lambda r: tf.io.parse_single_example(r, self.features),
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)
        if self.image_key is not None:
            decode = _decode.image_decoder(self.image_key, self.image_size, self.augment, self.seed)  # type: ignore
            parsed = parsed.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)
        return parsed

    def _parse_batch(self, records: Any) -> Any:
        """A batch of serialized records -> a batch of features, images decoded."""
        import tensorflow as tf

        features = tf.io.parse_example(records, self.features)
        if self.image_key is not None:
            decode = _decode.image_decoder(self.image_key, self.image_size, self.augment, self.seed)  # type: ignore
            key = self.image_key
            features[key] = tf.map_fn(lambda image: decode({key: image})[key], features[key],
                                      fn_output_signature=tf.float32)
        return features

    def _resample(self, dataset: Any) -> Any:
        """Fallback for unpartitioned files: rejection resampling on the parsed label."""
        import tensorflow as tf

        if not self.num_classes:
            raise invalid(DataError, "num_classes", None, "the class count for stratifying unpartitioned files",
                          "Pass num_classes=..., or write files with write_tfrecords(partition_by=label_key).")
        classes = list(range(self.num_classes))
        if _is_variable(self.class_weights):
            raise invalid(DataError, "class_weights", "tf.Variable", "fixed weights for unpartitioned files",
                          "Adaptive weights need per-class shard groups (write_tfrecords(partition_by=...)).")
        weights = self.class_weights
        if isinstance(weights, Mapping):
            weights = {int(k): v for k, v in weights.items()}
        probabilities = resolve_weights(weights, classes=classes)  # type: ignore[arg-type]
        label = self.label_key
        target = tf.constant([probabilities[c] for c in classes], tf.float32)
        resampled = dataset.rejection_resample(lambda f: tf.cast(tf.reshape(f[label], []), tf.int32), target,
                                               seed=self.seed)
        return resampled.map(lambda _, features: features)


def _is_variable(value: object) -> bool:
    from tfdist._compat import is_variable

    return is_variable(value)


def _lost_records(check: _framing.FileCheck, written: Optional[int]) -> tuple[int, bool]:
    """(records lost, exact?): exact when the writer's count is known, else estimated from unreadable bytes."""
    if written is not None:
        return written - check.records, True
    mean = check.valid_bytes / check.records if check.records else 0
    return (round(check.lost_bytes / mean) if mean else 0), False
