"""One worker's serialized records: its files, read (in parallel where that pays), cut to its share.

Example:
    >>> from tfdist.data import plan_shards
    >>> from tfdist.data.pipeline.reading import worker_files
    >>> worker_files(plan_shards([("a", 10), ("b", 10)], num_workers=2, policy="file"), 1)
    ('b',)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist.data.pipeline import _decode
from tfdist.data.pipeline.options import EpochOptions, ShardOptions, SourceOptions, TuningOptions
from tfdist.data.records.files import compression_of, on_local_disk
from tfdist.data.sharding import ShardPlan
from tfdist.data.storage import remote
from tfdist.errors import DataError, invalid

_HASH_BLOCK = 512  # Records per vectorized hash-key parse.
_BUFFER = 1 << 20  # Read buffer per open file.
_LOCAL_BUFFER = 1 << 18  # Local files read without threads: TF's default; 16 open files fill 4 MB, not 16, at start.
_AUTOTUNE_READS = 16  # Files read at once with num_parallel_reads='autotune' (split among streams).


def worker_files(plan: ShardPlan, worker: int) -> tuple[str, ...]:
    """The files input pipeline ``worker`` opens under ``plan`` (under 'data'/'hash'/'off': every file)."""
    return plan.files_for(worker)


def one_compression(paths: Sequence[str], source: SourceOptions) -> str:
    """The one compression of ``paths`` ('' for none); a DataError when they mix compressions."""
    kinds = {compression_of(p, source.compression) or "" for p in paths}
    if len(kinds) > 1:
        raise invalid(
            DataError,
            "compression",
            sorted(kinds),
            "one compression for all files",
            "Split compressed and uncompressed files into two pipelines.",
        )
    return next(iter(kinds), "")


def _how_to_read(
    paths: Sequence[str], streams: int, tuning: TuningOptions, local: bool | None, policy: str
) -> tuple[str, int]:
    """How one worker's stream reads its files, and how many it reads at once: the one place that decides.

    - 'parallel': TF's parallel reader, ``reads`` files at once on reader threads: an int
      ``num_parallel_reads``, and under 'autotune' files that are not local (URLs, network or FUSE
      mounts, and pipelines that run elsewhere: ``local`` False), where threads that read ahead hide
      round trips. Under 'autotune', several streams (class groups) share the 16 reads.
    - 'interleave': local files under 'autotune': the same record order as 'parallel' (one record per
      file in turn, ``reads`` files open, a file taking the slot of one that ended), without reader
      threads: on 2 cores busy decoding they only handed records between threads (BENCHMARKS.md).
      'data' sharding always reads this way or 'parallel', whatever the stream count, so every host
      sees the same order and ``shard`` keeps each record once even when hosts see different mounts.
    - 'sequential': local files of one of several streams (stratified class groups, which the sampler
      pulls a few records at a time; not under 'data'), or a single file: one file after the other.
    """
    if isinstance(tuning.num_parallel_reads, int):  # Else 'autotune' (TuningOptions checks).
        return "parallel", max(1, min(len(paths), tuning.num_parallel_reads))
    reads = max(1, min(len(paths), _AUTOTUNE_READS // streams))
    if local is None:
        local = on_local_disk(paths)
    if not local:
        return "parallel", reads
    if reads == 1 or (streams > 1 and policy != "data"):
        return "sequential", 1
    return "interleave", reads


def reads_in_threads(paths: Sequence[str], tuning: TuningOptions, local: bool) -> bool:
    """Whether readers of ``paths`` run on threads of their own (an int ``num_parallel_reads``, or files not
    local: threads that read ahead hide round trips), as :func:`_how_to_read` decides for one stream."""
    return _how_to_read(paths, 1, tuning, local, "file")[0] == "parallel"


def _whole_files(
    file_names: Callable[[], Any], paths: Sequence[str], compression: str, how: str, reads: int, shuffled: bool
) -> Any:
    """Records of whole files TensorFlow opens itself, as :func:`_how_to_read` decided.

    An unshuffled sequential read takes the file names as one tensor: no traced function (~7 ms each; a
    stratified pipeline builds one reader per class). The interleave opens each file with the bare reader:
    ``TFRecordDataset`` there would nest a second function per file, which cost more than the reader
    threads it replaces (BENCHMARKS.md).
    """
    import tensorflow as tf

    from tfdist import _compat

    if how == "sequential" and not shuffled:
        return _compat.tfrecord_reader(tf.constant(list(paths), tf.string), compression, _LOCAL_BUFFER)
    if how == "interleave":
        return file_names().interleave(
            lambda path: _compat.tfrecord_reader(path, compression, _LOCAL_BUFFER), cycle_length=reads, block_length=1
        )
    sequential = how == "sequential"  # Shuffled file order: a traced reader over the shuffled names.
    return tf.data.TFRecordDataset(
        file_names(),
        compression_type=compression,
        buffer_size=_LOCAL_BUFFER if sequential else _BUFFER,
        num_parallel_reads=None if sequential else reads,
    )


def read_records(
    plan: ShardPlan,
    worker: int,
    *,
    source: SourceOptions,
    shard: ShardOptions,
    features: Mapping[str, Any] | None,
    epoch: EpochOptions,
    tuning: TuningOptions,
    limits: Mapping[str, int],
    streams: int = 1,
    on_server: bool = False,
    local: bool | None = None,
) -> Any:
    """The serialized records input pipeline ``worker`` reads, once (no repeat, no shuffle of records).

    Args:
      plan: The shard plan over every input file.
      worker: This input pipeline's index in ``plan``.
      source: Compression and damaged-file handling.
      shard: The policy (from ``plan``) and the hash key.
      features: The feature spec, for hashing ``shard.key``.
      epoch: The seed and whether to shuffle the file order.
      tuning: Parallel reads and determinism.
      limits: Damaged file -> records to take (from :func:`~tfdist.data.records.verify.verify_files`).
      streams: How many such streams the pipeline reads at once (one per
        class group when stratifying): under 'autotune' they share the 16
        reads (8 classes x 16 remote files in flight, each with a 1 MB
        buffer, read ~10% slower on 2 cores; BENCHMARKS.md), and local
        class groups are read file by file (:func:`_how_to_read`).
      on_server: The pipeline runs in a TF server (the tf.data service), not
        here: ``s3://`` objects read through boto3 are staged there.
      local: Whether every file of the pipeline is on a local file system
        (:func:`~tfdist.data.records.files.on_local_disk`; None: looked up here).
        Ignored (False) where the pipeline runs elsewhere: ``on_server``, or
        a dataset built inside a traced function.

    Returns:
      A ``tf.data.Dataset`` of serialized records.
    """
    import tensorflow as tf

    paths = list(worker_files(plan, worker))
    compression = one_compression(paths, source)
    if on_server or not tf.executing_eagerly():
        local = False  # Built here, read on other hosts (tf.data service, parameter-server workers): keep threads.
    how, reads = _how_to_read(paths, streams, tuning, local, plan.policy)
    shuffled = bool(epoch.shuffle_buffer) and plan.policy != "data"

    def file_names() -> Any:  # Built only where needed: eager dataset ops cost ~1 ms each, per class group.
        files = tf.data.Dataset.from_tensor_slices(tf.constant(paths, tf.string))
        return files.shuffle(len(paths), seed=epoch.seed) if shuffled else files

    deterministic = tuning.deterministic or plan.policy == "data"
    if not limits and deterministic == tuning.deterministic and (not paths or remote.reader_for(paths[0]) != "boto3"):
        records = _whole_files(file_names, paths, compression, how, reads, shuffled)
        if source.on_corrupt == "skip":
            records = records.ignore_errors(log_warning=True)
    else:
        records = _opened_files(
            file_names(), paths, compression, reads, source, limits, on_server=on_server, deterministic=deterministic
        )
    return _worker_share(records, plan, worker, shard, features, tuning)


def _opened_files(
    file_names: Any,
    paths: Sequence[str],
    compression: str,
    reads: int,
    source: SourceOptions,
    limits: Mapping[str, int],
    *,
    on_server: bool,
    deterministic: bool,
) -> Any:
    """Records of files opened one by one, ``reads`` at a time: each damaged file cut to its ``limits``, and
    each ``s3://`` object read through boto3 staged first (:func:`~tfdist.data.storage.remote.staged_files`)."""
    import tensorflow as tf

    take = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(limits) or [""]), tf.constant(list(limits.values()) or [-1], tf.int64)
        ),
        -1,
    )
    staged, ready = remote.staged_files(file_names, paths, ahead=reads, on_server=on_server)

    def open_one(path: Any, local: Any) -> Any:
        # `ready` runs here, outside the file's records: a failed staging (timeout, changed object, agent
        # error) stays an error; 'skip' only cuts one file at its last whole record.
        one = tf.data.TFRecordDataset(ready(path, local), compression_type=compression, buffer_size=_BUFFER).take(
            take.lookup(path)
        )
        return one.ignore_errors(log_warning=True) if source.on_corrupt == "skip" else one

    return staged.interleave(
        open_one,
        cycle_length=reads,
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )


def _worker_share(
    records: Any,
    plan: ShardPlan,
    worker: int,
    shard: ShardOptions,
    features: Mapping[str, Any] | None,
    tuning: TuningOptions,
) -> Any:
    """``records`` cut to ``worker``'s share: every n-th record under 'data', its hash keys under 'hash'.

    Under the other policies the worker's files are its share already.
    """
    import tensorflow as tf

    if plan.policy == "data":
        return records.shard(plan.num_workers, worker)
    if plan.policy != "hash":
        return records
    # TFRecordPipeline requires a key that names a feature of ``features`` with the 'hash' policy.
    assert shard.key is not None and features is not None
    keep = _decode.key_mask(
        shard.key,
        features[shard.key],
        plan.num_workers,
        worker,
    )
    return (
        records.batch(_HASH_BLOCK)
        .map(
            lambda block: tf.boolean_mask(block, keep(block)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=tuning.deterministic,
        )
        .unbatch()
    )
