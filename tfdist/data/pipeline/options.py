"""The options of a TFRecord pipeline, in groups: each group validated on its own, one job each.

The groups are where each option is declared, with its default and its documentation.
``TFRecordPipeline(...)`` takes every field of every group as a flat keyword argument (``ShardOptions``'
with a ``shard_`` prefix: ``shard_policy``, ``shard_key``), or a whole group by name (``tuning=...``), and
hands each part of the pipeline only its group (:mod:`tfdist._options`).

Example:
    >>> from tfdist.data import EpochOptions, SourceOptions
    >>> SourceOptions(files="/data/train-*").files
    ('/data/train-*',)
    >>> EpochOptions(batch_size=0)
    Traceback (most recent call last):
    ...
    tfdist.errors.DataError: Invalid value for `batch_size`. Received: 0. Expected an integer >= 1 and <= 16777216.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist._names import describe_choices
from tfdist.data.sampling import Weights
from tfdist.data.sharding import SHARD_POLICIES
from tfdist.errors import DataError, invalid, require_bool, require_int

__all__ = ["EpochOptions", "ParseOptions", "SampleOptions", "ShardOptions", "SourceOptions", "TuningOptions"]

CORRUPT_POLICIES = ("raise", "skip")
ORDERS = ("auto", "resumable", "buffer")
VERIFY_MODES = ("local", "all", "none")
COMPRESSION_CHOICES = ("auto", "GZIP", "ZLIB", None)
# Bounds that keep TensorFlow from aborting the process (std::bad_alloc, a segfault) on absurd values.
MAX_BATCH = 1 << 24
MAX_THREADS = 4096


def _choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise invalid(DataError, name, value, describe_choices(value, [str(c) for c in choices]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Which files, how they are compressed, and how damaged files are handled.

    Attributes:
      files: A glob (or list of globs/paths); local, ``gs://``, or ``s3://``/
        ``hdfs://``/``az://`` through tensorflow-io. A single string is one glob.
        A path ending in ``.tfindex`` is a record index (``tfdist index``): its files,
        read in the resumable order without listing them or walking their headers.
      compression: None/'GZIP'/'ZLIB', or 'auto' to detect from the file name.
      on_corrupt: 'raise' a DataError naming the file, or 'skip' the damaged
        part and count what was lost (``TFRecordPipeline.last_report``).
      verify: Check file framing before reading: 'local' (local, uncompressed
        files: headers only, fast; other files: their first 12 bytes must
        match the compression), 'all' (every file, reads compressed and
        remote files whole), 'none'.
    """

    files: str | Sequence[str]
    compression: str | None = "auto"
    on_corrupt: str = "raise"
    verify: str = "local"

    def __post_init__(self) -> None:
        files = (
            [self.files]
            if isinstance(self.files, str)
            else list(self.files)
            if isinstance(self.files, Sequence)
            else None
        )
        if not files or not all(isinstance(f, str) and f for f in files):
            raise invalid(DataError, "files", self.files, "a glob or a non-empty list of paths")
        object.__setattr__(self, "files", tuple(files))
        _choice("on_corrupt", self.on_corrupt, CORRUPT_POLICIES)
        _choice("verify", self.verify, VERIFY_MODES)
        _choice("compression", self.compression, COMPRESSION_CHOICES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardOptions:
    """How records are split over workers; the pipeline's ``shard_policy`` and ``shard_key``.

    Attributes:
      policy: 'auto', 'file' (files split across workers, byte-balanced),
        'data' (every N-th record), 'hash' (``hash(key) % workers``) or 'off'.
      key: The feature hashed by 'hash' (e.g. a user id).
    """

    policy: str = "auto"
    key: str | None = None

    def __post_init__(self) -> None:
        _choice("policy", self.policy, SHARD_POLICIES)
        if self.policy == "hash" and not self.key:
            raise invalid(
                DataError,
                "key",
                self.key,
                "a feature to hash with the 'hash' policy",
                "Name the id feature to hash, e.g. 'user_id'.",
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParseOptions:
    """How a serialized record becomes features: a spec or a function, a label, an image to decode.

    Attributes:
      features: Feature spec for ``tf.io.parse_example``.
      parse_fn: Instead of ``features``: serialized record -> features.
      label_key: The label feature (for ``as_supervised`` and stratification).
      image_key: Decode this feature (JPEG/PNG) to float32 in [0, 1].
      image_size: (height, width) to resize decoded images to.
      augment: Random left-right flips (seeded) of decoded images.
      as_supervised: Yield (features, label) pairs for ``fit``.
    """

    features: Mapping[str, Any] | None = None
    parse_fn: Callable[[Any], Any] | None = None
    label_key: str | None = None
    image_key: str | None = None
    image_size: tuple[int, int] | None = None
    augment: bool = False
    as_supervised: bool = False

    def __post_init__(self) -> None:
        for name in ("augment", "as_supervised"):
            require_bool(DataError, name, getattr(self, name))
        if (self.features is None) == (self.parse_fn is None):
            raise invalid(
                DataError,
                "features",
                self.features,
                "exactly one of `features` and `parse_fn`",
                "Pass a feature spec dict, or a parse function of one serialized record.",
            )
        if self.features is not None and not isinstance(self.features, Mapping):
            raise invalid(DataError, "features", self.features, "a dict of feature name -> tf.io feature spec")
        if self.parse_fn is not None and not callable(self.parse_fn):
            raise invalid(DataError, "parse_fn", self.parse_fn, "a function of one serialized record")
        for name in ("label_key", "image_key"):
            key = getattr(self, name)
            if key is not None and self.features is not None and key not in self.features:
                raise invalid(DataError, name, key, f"a feature of `features` ({sorted(self.features)})")
        if self.as_supervised and not self.label_key:
            raise invalid(DataError, "label_key", None, "the label feature with as_supervised or class_weights")
        if (self.image_key is None) != (self.image_size is None):
            raise invalid(DataError, "image_size", self.image_size, "image_key and image_size together")
        if self.image_size is not None:
            size = tuple(self.image_size) if isinstance(self.image_size, Sequence) else ()
            if len(size) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 15 for v in size
            ):
                raise invalid(DataError, "image_size", self.image_size, "(height, width), integers from 1 to 32768")
            object.__setattr__(self, "image_size", size)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleOptions:
    """Stratified reading: the class mix, the class count for unpartitioned files, the draw block.

    Attributes:
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
        :func:`~tfdist.data.sampling.stratified_sample`). 4 (default) draws a
        class per 4 records, a quarter of the sampler's per-record cost; 1
        mixes per record. Stratified reading is within 10% of plain reading
        for large images, slower for small ones (BENCHMARKS.md).
    """

    class_weights: Weights | None = None
    num_classes: int | None = None
    sample_block: int = 4

    def __post_init__(self) -> None:
        require_int(DataError, "sample_block", self.sample_block, minimum=1, maximum=MAX_BATCH)
        if self.num_classes is not None:
            require_int(DataError, "num_classes", self.num_classes, minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpochOptions:
    """Batches and passes: batch size, epochs, shuffling, seed, static batches.

    Attributes:
      batch_size: The global batch size; split per replica under
        ``distribute_datasets_from_function``.
      num_epochs: Passes over the data; None repeats forever.
      shuffle_buffer: Records in the shuffle buffer; 0 disables shuffling.
      seed: Seed for file order, shuffling, sampling and augmentation.
      drop_remainder: Drop the last partial batch for a static batch shape.
        Off by default: a finite epoch keeps every record (tf.distribute
        handles partial and uneven batches). When on, what is dropped is
        logged with its count.
      order: 'resumable': each epoch's order is a function of (seed, epoch,
        files) alone, the same on any number of workers, and a restored
        backup resumes at the next record (:mod:`tfdist.data.order`):
        ``shuffle_buffer`` is then the shuffle window of each stream.
        'buffer': TF's shuffle buffer over each worker's own files (no
        resume position). 'auto' (default): 'resumable' where it applies
        (shard_policy 'file', 'data' or 'auto'; no class_weights, tf.data
        service or parameter-server workers), else 'buffer'. With
        ``class_weights`` over class groups, 'resumable' draws each record's
        class from (seed, worker, draw) so a resume replays the same draws
        (:mod:`tfdist.data.order.strata`); 'auto' keeps the faster sampler.
      order_streams: Streams each epoch is cut into under 'resumable' (None:
        up to 12, dividing the global batch, a multiple of the workers under
        'file'). Fixed for a job: an elastic job names one every world size
        divides.
      order_block: Records per block, the unit the epoch order permutes.
    """

    batch_size: int
    num_epochs: int | None = 1
    shuffle_buffer: int = 0
    seed: int | None = None
    drop_remainder: bool = False
    order: str = "auto"
    order_streams: int | None = None
    order_block: int = 256

    def __post_init__(self) -> None:
        require_bool(DataError, "drop_remainder", self.drop_remainder)
        require_int(DataError, "batch_size", self.batch_size, minimum=1, maximum=MAX_BATCH)
        if self.num_epochs is not None:
            require_int(DataError, "num_epochs", self.num_epochs, minimum=1)
        require_int(DataError, "shuffle_buffer", self.shuffle_buffer, minimum=0, maximum=MAX_BATCH)
        _choice("order", self.order, ORDERS)
        if self.order_streams is not None:
            require_int(DataError, "order_streams", self.order_streams, minimum=1, maximum=MAX_BATCH)
        require_int(DataError, "order_block", self.order_block, minimum=1, maximum=MAX_BATCH)
        if self.seed is not None:
            require_int(DataError, "seed", self.seed, minimum=-(1 << 63), maximum=(1 << 63) - 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuningOptions:
    """Where and how fast: tf.data service, determinism, prefetch, parallel reads, cache, threads, autotuning, RAM.

    ``autotune_model`` (None: on only with ``ram_budget_bytes``) runs tf.data's autotuning model for the
    pipeline: a background thread that re-tunes parallelism and buffers and enforces the RAM budget.
    Off, every ``"autotune"`` parallelism starts and stays at min(16, the size of the tf.data thread pool:
    the cores, or ``private_threadpool_size``), TF's own starting value, and prefetch buffers still grow by
    themselves. It is off by default because of a stall in TF 2.17-2.21: with it, deleting an iterator
    (each epoch of ``fit``, each ``evaluate``) waits out the model's current optimization period in about
    half the cases, and that period doubles up to 60 s (BENCHMARKS.md).

    Attributes:
      data_service: 'grpc://host:port' of a tf.data service dispatcher: parsing
        and decoding run on its workers; each element goes to one consumer.
      deterministic: Keep element order reproducible (slower interleave).
      prefetch: Batches to prefetch, or 'autotune'.
      num_parallel_reads: Files read at once (TF's parallel reader, with
        reader threads), or 'autotune': up to 16 files in turn; on local file
        systems without reader threads (the same record order), each class
        group of stratified reading file by file; elsewhere (URLs, network or
        FUSE mounts) TF's parallel reader, which reads ahead.
      cache: Cache the serialized records of one pass in memory (True) or in a
        file (a path in an existing directory); shuffling, augmentation and
        epochs still run anew on every pass. Not with stratified reading.
      private_threadpool_size: tf.data threads for this pipeline (0: shared).
      ram_budget_bytes: RAM budget of tf.data's autotuning model (None: TF's
        default); setting it turns the model on.
      autotune_model: Run tf.data's autotuning model (None: only with
        ram_budget_bytes), as above.
    """

    data_service: str | None = None
    deterministic: bool = True
    prefetch: int | str = "autotune"
    num_parallel_reads: int | str = "autotune"
    cache: bool | str = False
    private_threadpool_size: int = 0
    ram_budget_bytes: int | None = None
    autotune_model: bool | None = None

    def __post_init__(self) -> None:
        require_bool(DataError, "deterministic", self.deterministic)
        if self.autotune_model is not None:
            require_bool(DataError, "autotune_model", self.autotune_model)
        if self.data_service is not None and not (
            isinstance(self.data_service, str) and re.match(r"^grpc(\+local)?://[^/]+:\d+$", self.data_service)
        ):
            raise invalid(DataError, "data_service", self.data_service, "'grpc://host:port' of a dispatcher")
        for name in ("prefetch", "num_parallel_reads"):
            value = getattr(self, name)
            if value != "autotune":
                require_int(DataError, name, value, minimum=1, maximum=MAX_THREADS)
        require_int(DataError, "private_threadpool_size", self.private_threadpool_size, minimum=0, maximum=MAX_THREADS)
        if self.ram_budget_bytes is not None:
            require_int(DataError, "ram_budget_bytes", self.ram_budget_bytes, minimum=1)
            if self.autotune_model is False:
                raise invalid(
                    DataError,
                    "autotune_model",
                    False,
                    "True or None with ram_budget_bytes",
                    "TF enforces the RAM budget in its autotuning model: drop ram_budget_bytes, or "
                    "leave autotune_model unset.",
                )
        if not isinstance(self.cache, (bool, str)) or self.cache == "":
            raise invalid(DataError, "cache", self.cache, "True (memory), False, or a file path")

    @property
    def autotune_enabled(self) -> bool:
        """Whether tf.data's autotuning model runs: as asked, else only to enforce ``ram_budget_bytes``.

        Example:
            >>> TuningOptions().autotune_enabled, TuningOptions(ram_budget_bytes=1 << 30).autotune_enabled
            (False, True)
        """
        return self.autotune_model if self.autotune_model is not None else self.ram_budget_bytes is not None
