"""One worker's serialized records: its files, read in parallel, cut to its share by the shard plan.

Example:
    >>> from tfdist.data.sharding import plan_shards
    >>> from tfdist.data.reading import worker_files
    >>> worker_files(plan_shards([("a", 10), ("b", 10)], num_workers=2, policy="file"), 1)
    ('b',)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.data import _decode, remote
from tfdist.data.files import compression_of, on_local_disk
from tfdist.data.options import EpochOptions, ShardOptions, SourceOptions, TuningOptions
from tfdist.data.sharding import ShardPlan
from tfdist.errors import DataError, invalid

__all__ = ["worker_files", "read_records", "HASH_BLOCK"]

HASH_BLOCK = 512  # Records per vectorized hash-key parse.
_BUFFER = 1 << 20  # Read buffer per open file.
_AUTOTUNE_READS = 16  # Files read at once with num_parallel_reads='autotune' (split among streams).


def worker_files(plan: ShardPlan, worker: int) -> tuple[str, ...]:
    """The files input pipeline ``worker`` opens under ``plan`` (under 'data'/'hash'/'off': every file)."""
    return plan.files_for(worker)


def _one_compression(paths: Sequence[str], source: SourceOptions) -> str:
    kinds = {compression_of(p, source.compression) or "" for p in paths}
    if len(kinds) > 1:
        raise invalid(DataError, "compression", sorted(kinds), "one compression for all files",
                      "Split compressed and uncompressed files into two pipelines.")
    return next(iter(kinds), "")


def _whole_files(files: Any, paths: Sequence[str], compression: str, reads: int, streams: int,
                 tuning: TuningOptions) -> Any:
    """Records of whole files TensorFlow opens itself: one traced function instead of three (~25 ms each).

    One stream reads ``reads`` files at once with TF's parallel reader (its interleave follows the
    pipeline's ``deterministic`` option). Several streams of local files under 'autotune' (the class groups
    of stratified reading) each read their files one after the other, without reader threads: the sampler
    pulls a few records from one class at a time, so per-class reader threads only handed records between
    threads (balanced 64 px: 0.156 vs 0.173 s of CPU per 1,000 records in a scratch run; BENCHMARKS.md).
    Each class then yields its records file by file. Files on network or FUSE mounts (NFS, Lustre,
    gcsfuse, ...) keep the parallel reader: there a read can cost a round trip.
    """
    import tensorflow as tf

    sequential = streams > 1 and tuning.num_parallel_reads == "autotune" and on_local_disk(paths)
    return tf.data.TFRecordDataset(files, compression_type=compression, buffer_size=_BUFFER,
                                   num_parallel_reads=None if sequential else reads)


def read_records(plan: ShardPlan, worker: int, *, source: SourceOptions, shard: ShardOptions,
                 features: Mapping[str, Any] | None, epoch: EpochOptions, tuning: TuningOptions,
                 limits: Mapping[str, int], streams: int = 1, on_server: bool = False) -> Any:
    """The serialized records input pipeline ``worker`` reads, once (no repeat, no shuffle of records).

    Args:
      plan: The shard plan over every input file.
      worker: This input pipeline's index in ``plan``.
      source: Compression and damaged-file handling.
      shard: The policy (from ``plan``) and the hash key.
      features: The feature spec, for hashing ``shard.key``.
      epoch: The seed and whether to shuffle the file order.
      tuning: Parallel reads and determinism.
      limits: Damaged file -> records to take (from :func:`~tfdist.data.verify.verify_files`).
      streams: How many such streams the pipeline reads at once (one per
        class group when stratifying): 'autotune' reads each stream's local
        files one after the other, and splits its 16 parallel reads among
        remote streams (8 classes x 16 files in flight, each with a 1 MB
        buffer, read ~10% slower on 2 cores; BENCHMARKS.md).
      on_server: The pipeline runs in a TF server (the tf.data service), not
        here: ``s3://`` objects read through boto3 are staged there.

    Returns:
      A ``tf.data.Dataset`` of serialized records.
    """
    import tensorflow as tf

    paths = list(worker_files(plan, worker))
    compression = _one_compression(paths, source)
    reads = min(len(paths), max(1, _AUTOTUNE_READS // streams)) if tuning.num_parallel_reads == "autotune" \
        else tuning.num_parallel_reads
    files = tf.data.Dataset.from_tensor_slices(tf.constant(paths, tf.string))
    if epoch.shuffle_buffer and plan.policy != "data":
        files = files.shuffle(len(paths), seed=epoch.seed)
    deterministic = tuning.deterministic or plan.policy == "data"
    if not limits and deterministic == tuning.deterministic and (not paths or remote.reader_for(paths[0]) != "boto3"):
        records = _whole_files(files, paths, compression, max(1, reads), streams, tuning)
        if source.on_corrupt == "skip":
            records = records.ignore_errors(log_warning=True)
    else:
        take = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(list(limits) or [""]), tf.constant(list(limits.values()) or [-1], tf.int64)), -1)
        staged, ready = remote.staged_files(files, paths, ahead=max(1, reads), on_server=on_server)

        def open_one(path: Any, local: Any) -> Any:
            # `ready` runs here, outside the file's records: a failed staging (timeout, changed object, agent
            # error) stays an error; 'skip' only cuts one file at its last whole record.
            one = tf.data.TFRecordDataset(ready(path, local), compression_type=compression,
                                          buffer_size=_BUFFER).take(take.lookup(path))
            return one.ignore_errors(log_warning=True) if source.on_corrupt == "skip" else one

        records = staged.interleave(open_one, cycle_length=max(1, reads), block_length=1,
                                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if plan.policy == "data":
        records = records.shard(plan.num_workers, worker)
    elif plan.policy == "hash":
        keep = _decode.key_mask(shard.key, features[shard.key],  # type: ignore[arg-type,index]
                                plan.num_workers, worker)
        records = records.batch(HASH_BLOCK).map(
            lambda block: tf.boolean_mask(block, keep(block)), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=tuning.deterministic).unbatch()
    return records
