"""Sharded TFRecord writing: balanced shards, optional per-class shard groups, a manifest.

Example:
    >>> import tempfile, os
    >>> from tfdist.data import write_tfrecords
    >>> prefix = os.path.join(tempfile.mkdtemp(), "train")
    >>> paths = write_tfrecords([b"a", b"b", b"c"], prefix, num_shards=2)
    >>> [os.path.basename(p) for p in paths]
    ['train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord']
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from typing import Any, Optional, Union

from tfdist.errors import DataError, Error, StorageError, invalid, require_int

__all__ = ["write_tfrecords", "shard_name", "prefix_of", "manifest_path", "read_manifest", "COMPRESSIONS",
           "CLASS_GROUP"]

_log = logging.getLogger("tfdist.data")
COMPRESSIONS = {None: "", "GZIP": ".gz", "ZLIB": ".zz"}
# A per-class group: PREFIX-label=VALUE-00000-of-00004.tfrecord[.gz]
CLASS_GROUP = re.compile(r"-(?P<key>[A-Za-z0-9_]+)=(?P<value>[^/]+?)-\d{5}-of-\d{5}\.tfrecord(?:\.gz|\.zz)?$")
Example = Union[bytes, Any]  # serialized bytes or a tf.train.Example
Progress = Callable[[int], None]


def shard_name(prefix: str, index: int, count: int, compression: Optional[str] = None) -> str:
    """``PREFIX-00003-of-00016.tfrecord`` (plus ``.gz``/``.zz`` when compressed)."""
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord{COMPRESSIONS[compression]}"


_SHARD_SUFFIX = re.compile(r"(?:-[A-Za-z0-9_]+=[^/]+?)?-\d{5}-of-\d{5}\.tfrecord(?:\.gz|\.zz)?$")


def prefix_of(path: str) -> Optional[str]:
    """The ``path_prefix`` a shard written by :func:`write_tfrecords` came from, or None."""
    match = _SHARD_SUFFIX.search(path)
    return path[: match.start()] if match else None


def manifest_path(prefix: str) -> str:
    """Where ``write_tfrecords`` records what it wrote (counts per file and class)."""
    return f"{prefix}-manifest.json"


def read_manifest(prefix: str, *, on_corrupt: str = "raise") -> Optional[dict[str, Any]]:
    """The manifest next to ``prefix``, or None when there is none.

    Args:
      prefix: The ``path_prefix`` given to :func:`write_tfrecords`.
      on_corrupt: A manifest that is not the writer's JSON: 'raise' a
        DataError naming it, or 'skip' it (log a warning and return None).
    """
    from tfdist.data import remote

    path = manifest_path(prefix)
    if not remote.exists(path):
        return None
    try:
        with remote.open_file(path, "rb") as f:
            raw = f.read()
    except Error:
        raise
    except Exception as err:  # noqa: BLE001 - OSError or TF's OpError: the file is there but unreadable.
        raise StorageError(f"Cannot read {path}: {err}. Check that it is readable.") from err
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or not all(isinstance(info, dict) and isinstance(info.get("records"), int)
                                                     for info in manifest["files"].values()):
            raise ValueError("no per-file record counts")
        return manifest
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        if on_corrupt == "skip":
            _log.warning("Ignoring the corrupt manifest %s (%s): record counts are unknown.", path, err)
            return None
        raise invalid(DataError, "manifest", path, f"the JSON manifest write_tfrecords writes ({err})",
                      "Delete it (reading works without it), re-write the data, or pass on_corrupt='skip'.") from err


def _label_of(record: bytes, key: str) -> str:
    import tensorflow as tf

    feature = tf.train.Example.FromString(record).features.feature
    if key not in feature:
        raise invalid(DataError, "partition_by", key, f"a feature of every example (found {sorted(feature)})")
    value = feature[key]
    kind = value.WhichOneof("kind")
    items = list(getattr(value, kind).value) if kind else []
    if len(items) != 1:
        raise invalid(DataError, "partition_by", key, "a feature with exactly one value per example")
    item = items[0]
    return item.decode() if isinstance(item, bytes) else str(item)


def write_tfrecords(examples: Iterable[Example], path_prefix: str, *, num_shards: int,
                    compression: Optional[str] = None, partition_by: Optional[str] = None,
                    progress: Optional[Progress] = None, log_every: int = 100_000) -> list[str]:
    """Writes examples round-robin into ``num_shards`` balanced TFRecord files.

    Args:
      examples: ``tf.train.Example`` protos or serialized bytes.
      path_prefix: Path prefix, local or any ``tf.io.gfile`` scheme (``s3://``
        needs tensorflow-io).
      num_shards: Files to write (per class with ``partition_by``).
      compression: None, 'GZIP' or 'ZLIB'.
      partition_by: A label feature: write one group of ``num_shards`` files
        per class, named ``PREFIX-KEY=VALUE-00000-of-0000N.tfrecord``, which
        stratified reading needs.
      progress: Called with the running count of records written.
      log_every: Log progress every this many records.

    Returns:
      The paths written, sorted.
    """
    import tensorflow as tf

    from tfdist.data import remote

    require_int(DataError, "num_shards", num_shards, minimum=1)
    if compression not in COMPRESSIONS:
        raise invalid(DataError, "compression", compression, "None, 'GZIP' or 'ZLIB'")
    remote.ensure_filesystem(path_prefix)
    parent = path_prefix.rsplit("/", 1)[0] if "/" in path_prefix else "."
    if "://" not in parent:
        tf.io.gfile.makedirs(parent)
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    writers: dict[str, list[Any]] = {}
    finishers: list[Any] = []
    counters: dict[str, int] = {}
    files: dict[str, dict[str, Any]] = {}
    start, written = time.monotonic(), 0
    try:
        for example in examples:
            record = example if isinstance(example, bytes) else example.SerializeToString()
            group = _label_of(record, partition_by) if partition_by else ""
            if group not in writers:
                prefix = f"{path_prefix}-{partition_by}={group}" if partition_by else path_prefix
                names = [shard_name(prefix, i, num_shards, compression) for i in range(num_shards)]
                targets = [remote.writable_path(name) for name in names]  # Uploaded on close where needed.
                finishers.extend(finish for _, finish in targets)
                writers[group] = [tf.io.TFRecordWriter(local, options) for local, _ in targets]
                for name in names:
                    files[name] = {"records": 0, "bytes": 0, "class": group if partition_by else None}
                counters[group] = 0
            shard = counters[group] % num_shards
            counters[group] += 1
            writers[group][shard].write(record)
            name = shard_name(f"{path_prefix}-{partition_by}={group}" if partition_by else path_prefix, shard,
                              num_shards, compression)
            files[name]["records"] += 1
            files[name]["bytes"] += len(record) + 16
            written += 1
            if progress is not None:
                progress(written)
            if written % log_every == 0:
                _log.info("Wrote %d records (%.0f/s).", written, written / max(1e-9, time.monotonic() - start))
    finally:
        for group_writers in writers.values():
            for writer in group_writers:
                writer.close()
    _upload_all(finishers)
    if not written:
        raise invalid(DataError, "examples", [], "at least one example")
    manifest = {"prefix": path_prefix, "compression": compression, "partition_by": partition_by,
                "num_shards": num_shards, "records": written, "files": files,
                "classes": {g: n for g, n in counters.items()} if partition_by else None}
    with remote.open_file(manifest_path(path_prefix), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    _log.info("Wrote %d records to %d files under %s in %.1fs.", written, len(files), path_prefix,
              time.monotonic() - start)
    return sorted(files)


def _upload_all(finishers: list[Any]) -> None:
    """Runs the upload-on-close steps of the shards (boto3-served objects), in parallel."""
    from concurrent.futures import ThreadPoolExecutor

    if finishers:
        with ThreadPoolExecutor(max_workers=min(8, len(finishers))) as pool:
            list(pool.map(lambda finish: finish(), finishers))
