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

import dataclasses
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from tfdist.data.records._examples import COMPRESSIONS, group_prefix, label_of, serialized, shard_name
from tfdist.data.records._staging import Staging
from tfdist.errors import DataError, Error, StorageError, invalid, require_int

__all__ = ["read_manifest", "write_tfrecords"]

_log = logging.getLogger("tfdist.data")
# A per-class group: PREFIX-label=VALUE-00000-of-00004.tfrecord[.gz]
_SUFFIXES = "|".join(re.escape(suffix) for suffix in COMPRESSIONS.values() if suffix)
CLASS_GROUP = re.compile(rf"-(?P<key>[A-Za-z0-9_]+)=(?P<value>[^/]+?)-\d{{5}}-of-\d{{5}}\.tfrecord(?:{_SUFFIXES})?$")
Example = bytes | Any  # serialized bytes or a tf.train.Example
Progress = Callable[[int], None]


_SHARD_SUFFIX = re.compile(rf"-\d{{5}}-of-\d{{5}}\.tfrecord(?:{_SUFFIXES})?$")
# A class group's '-KEY=VALUE' right before the shard suffix (an encoded label has no '=' and no '/').
_GROUP_TAIL = re.compile(r"-[A-Za-z0-9_]+=[^/=]+$")


def prefixes_of(path: str) -> tuple[str, ...]:
    """The ``path_prefix`` values a shard written by :func:`write_tfrecords` can come from; () for other names.

    A name with a ``-KEY=VALUE`` group before its shard number is ambiguous: a
    class group of a partitioned write, or a prefix that itself ends in
    ``-KEY=VALUE`` (``part-v=2``). Both are returned, the longer first.

    Example:
        >>> prefixes_of("/d/part-v=2-00000-of-00002.tfrecord.gz")
        ('/d/part-v=2', '/d/part')
        >>> prefixes_of("/d/train-00003-of-00016.tfrecord"), prefixes_of("/d/notes.txt")
        (('/d/train',), ())
    """
    match = _SHARD_SUFFIX.search(path)
    if match is None:
        return ()
    prefix = path[: match.start()]
    group = _GROUP_TAIL.search(prefix)
    return (prefix, prefix[: group.start()]) if group and group.start() else (prefix,)


def _manifest_path(prefix: str) -> str:
    """Where ``write_tfrecords`` records what it wrote (counts per file and class)."""
    return f"{prefix}-manifest.json"


def read_manifest(prefix: str, *, on_corrupt: str = "raise") -> dict[str, Any] | None:
    """The manifest next to ``prefix``, or None when there is none.

    Args:
      prefix: The ``path_prefix`` given to :func:`write_tfrecords`.
      on_corrupt: A manifest that is not the writer's JSON: 'raise' a
        DataError naming it, or 'skip' it (log a warning and return None).
    """
    from tfdist.data.storage import remote

    path = _manifest_path(prefix)
    if not remote.exists(path):
        return None
    try:
        with remote.open_file(path, "rb") as f:
            raw = f.read()
    except Error:
        raise
    except Exception as err:
        raise StorageError(f"Cannot read {path}: {err}. Check that it is readable.") from err
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or not all(
            isinstance(info, dict) and isinstance(info.get("records"), int) for info in manifest["files"].values()
        ):
            raise ValueError("no per-file record counts")
        return manifest
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        if on_corrupt == "skip":
            _log.warning("Ignoring the corrupt manifest %s (%s): record counts are unknown.", path, err)
            return None
        raise invalid(
            DataError,
            "manifest",
            path,
            f"the JSON manifest write_tfrecords writes ({err})",
            "Delete it (reading works without it), re-write the data, or pass on_corrupt='skip'.",
        ) from err


def label_of_name(name: str) -> str:
    """The label a shard-name label stands for (exact unless it was cut: then read the manifest's ``class``)."""
    return urllib.parse.unquote(name)


def _existing(path_prefix: str, partition_by: str | None) -> list[str]:
    """The shards and manifest a previous ``write_tfrecords(..., path_prefix)`` left.

    The previous manifest names its shards exactly. Without one (lost, or corrupt), a file counts only when its
    name is this prefix's own shard name: ``PREFIX-NNNNN-of-NNNNN``, or ``PREFIX-KEY=VALUE-NNNNN-of-NNNNN`` with
    KEY this write's ``partition_by``. Another dataset whose prefix merely starts with ``PREFIX-`` (such as
    ``PREFIX-v=2``) is never taken for an old version of this one.
    """
    from tfdist.data.storage import remote

    if any(c in path_prefix for c in "*?["):
        return []  # A prefix with wildcards cannot be globbed for itself alone; nothing is removed.
    try:
        found = remote.glob(f"{path_prefix}-*")
    except Error:
        raise
    except Exception:
        return []
    manifest = _manifest_path(path_prefix)
    previous = read_manifest(path_prefix, on_corrupt="skip") if manifest in found else None
    if previous is not None:
        listed = set(previous["files"])
        return [p for p in found if p in listed or p == manifest]
    group = rf"(?:-{re.escape(partition_by)}=[^/]+?)?" if partition_by else ""
    own = re.compile(re.escape(path_prefix) + group + r"-\d{5}-of-\d{5}\.tfrecord(?:\.gz|\.zz)?")
    return [p for p in found if own.fullmatch(p) or p == manifest]


def write_tfrecords(
    examples: Iterable[Example] | Any,
    path_prefix: str,
    *,
    num_shards: int | None = None,
    compression: str | None = None,
    partition_by: str | None = None,
    progress: Progress | None = None,
    log_every: int = 100_000,
    to_example: Callable[[Any], Example] | None = None,
) -> list[str]:
    """Writes examples round-robin into ``num_shards`` balanced TFRecord files, or a Spark DataFrame's rows
    one shard per partition.

    Writing is all or nothing: shards are staged in a hidden directory beside
    ``path_prefix`` and moved into place only when every example is written.
    A failed write leaves the previous dataset of ``path_prefix`` as it was; a
    successful one replaces it whole (old shards of another shard count are
    removed).

    A Spark DataFrame is written by its executors: partition ``i`` of ``P``
    writes shard ``i`` of ``P`` (per class with ``partition_by``) straight
    into the staging directory, which they must reach (a shared or remote
    path: hdfs://, gs://, s3:// through tensorflow-io; a local path only
    when the executors run on this machine). See docs/spark.md.

    Args:
      examples: ``tf.train.Example`` protos or serialized bytes, or a
        ``pyspark.sql.DataFrame``.
      path_prefix: Path prefix, local or any ``tf.io.gfile`` scheme (``s3://``
        needs tensorflow-io).
      num_shards: Files to write (per class with ``partition_by``). For a
        DataFrame: None or its number of partitions (repartition it to
        change that).
      compression: None, 'GZIP' or 'ZLIB'.
      partition_by: A label feature: write one group of ``num_shards`` files
        per class, named ``PREFIX-KEY=VALUE-00000-of-0000N.tfrecord``, which
        stratified reading needs. VALUE is the label percent-encoded (see
        :func:`label_name`); the manifest keeps the real value.
      progress: Called with the running count of records written.
      log_every: Log progress every this many records.
      to_example: For a DataFrame: turns a Row into an example. Default
        :func:`~tfdist.data.records.dataframe.row_example`, one feature per
        column.

    Returns:
      The paths written, sorted.

    Raises:
      DataError: Bad arguments, an item that is not an example, or a label
        that cannot be a class (nothing is written then).
      StorageError: The files cannot be written or moved into place.
    """
    import tensorflow as tf

    from tfdist.data.records import dataframe

    frame = dataframe.is_dataframe(examples)
    if frame:
        num_shards = _check_frame(examples, path_prefix, num_shards, progress)
    elif to_example is not None:
        raise invalid(DataError, "to_example", to_example, "None unless `examples` is a Spark DataFrame")
    layout = _check_options(num_shards, compression, partition_by, path_prefix, log_every)
    _prepare_parent(path_prefix)
    staging = Staging(path_prefix)
    try:
        files, counters, written, seconds = _stage(
            examples, frame, staging, layout, progress=progress, log_every=log_every, to_example=to_example
        )
        manifest = layout.manifest(files, counters, written)
        _replace(path_prefix, staging, manifest)
    except tf.errors.OpError as err:
        raise StorageError(
            f"Writing {path_prefix} failed: {err.message}. The previous files are unchanged unless "
            "the error came while moving the new ones into place."
        ) from err
    finally:
        staging.discard()
    _log.info("Wrote %d records to %d files under %s in %.1fs.", written, len(files), path_prefix, seconds)
    return sorted(files)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Layout:
    """The shards of one write: their prefix, how many (per class), their compression, the label they split by."""

    path_prefix: str
    num_shards: int
    compression: str | None
    partition_by: str | None

    def manifest(self, files: dict[str, dict[str, Any]], counters: dict[str, int], written: int) -> dict[str, Any]:
        """What the manifest beside the shards records: the layout, and the records per file and class."""
        return {
            "prefix": self.path_prefix,
            "compression": self.compression,
            "partition_by": self.partition_by,
            "num_shards": self.num_shards,
            "records": written,
            "files": files,
            "classes": dict(counters) if self.partition_by else None,
        }


def _check_options(
    num_shards: int | None, compression: str | None, partition_by: str | None, path_prefix: str, log_every: int
) -> _Layout:
    """Checks the arguments that say what to write where."""
    require_int(DataError, "num_shards", num_shards, minimum=1, maximum=99_999)
    assert num_shards is not None
    if compression not in COMPRESSIONS:
        raise invalid(DataError, "compression", compression, "None, 'GZIP' or 'ZLIB'")
    if partition_by is not None and not (
        isinstance(partition_by, str) and re.fullmatch(r"[A-Za-z0-9_]+", partition_by)
    ):
        raise invalid(DataError, "partition_by", partition_by, "a feature name of letters, digits and _")
    if not isinstance(path_prefix, str) or not path_prefix or path_prefix.endswith("/"):
        raise invalid(DataError, "path_prefix", path_prefix, "a path prefix such as '/data/train'")
    require_int(DataError, "log_every", log_every, minimum=1)
    return _Layout(path_prefix=path_prefix, num_shards=num_shards, compression=compression, partition_by=partition_by)


def _prepare_parent(path_prefix: str) -> None:
    """Checks that a file system serves ``path_prefix``, and creates its local parent directory."""
    import tensorflow as tf

    from tfdist.data.storage import remote

    remote.ensure_filesystem(path_prefix)
    parent = path_prefix.rpartition("/")[0] or "."
    if "://" not in parent:
        try:
            tf.io.gfile.makedirs(parent)
        except tf.errors.OpError as err:
            raise StorageError(
                f"Cannot create {parent}: {err.message}. Check the path and permissions.",
                field="path_prefix",
                value=path_prefix,
            ) from err


def _replace(path_prefix: str, staging: Staging, manifest: dict[str, Any]) -> None:
    """Moves the staged shards and ``manifest`` into place, then removes the previous dataset's other files."""
    from tfdist.data.storage import remote

    files = manifest["files"]
    old = _existing(path_prefix, manifest["partition_by"])
    staging.commit(sorted(files), manifest, _manifest_path(path_prefix))
    for stale in sorted(set(old) - set(files) - {_manifest_path(path_prefix)}):
        remote.remove(stale)


def _check_frame(frame: Any, path_prefix: str, num_shards: int | None, progress: Progress | None) -> int:
    """The DataFrame's partition count (its shards); DataError for what a DataFrame write cannot do."""
    from tfdist.data.records.dataframe import partition_count
    from tfdist.data.storage import remote

    partitions = partition_count(frame)
    if num_shards is not None and num_shards != partitions:
        raise invalid(
            DataError,
            "num_shards",
            num_shards,
            f"None or the DataFrame's number of partitions ({partitions}): each partition writes one shard",
            f"Pass df.repartition({num_shards}) (or coalesce) instead.",
        )
    if progress is not None:
        raise invalid(DataError, "progress", progress, "None with a DataFrame (its executors write the records)")
    if isinstance(path_prefix, str) and remote.reader_for(path_prefix) == "boto3":
        raise invalid(
            DataError,
            "path_prefix",
            path_prefix,
            "a path TensorFlow's file systems write, where the executors write their shards",
            "s3:// goes through boto3 here, which stages on this machine: install tensorflow-io (TF 2.17), "
            "or write to hdfs://, gs:// or a shared directory.",
        )
    return partitions


def _stage(
    examples: Any,
    frame: bool,
    staging: Staging,
    layout: _Layout,
    *,
    progress: Progress | None,
    log_every: int,
    to_example: Callable[[Any], Example] | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, int], int, float]:
    """Writes every example into ``staging``: a DataFrame's partitions by its executors, else here.

    Returns what :func:`_write_all` does; DataError when there was no example.
    """
    from tfdist.data.records import dataframe

    if frame:
        start = time.monotonic()
        files, counters, written = dataframe.write_partitions(
            examples,
            layout.num_shards,
            layout.path_prefix,
            staging.dir,
            compression=layout.compression,
            partition_by=layout.partition_by,
            to_example=to_example,
        )
        staged = files, counters, written, time.monotonic() - start
    else:
        staged = _write_all(examples, staging, layout, progress=progress, log_every=log_every)
    if not staged[2]:
        raise invalid(DataError, "examples", [], "at least one example")
    return staged


def _write_all(
    examples: Iterable[Example], staging: Staging, layout: _Layout, *, progress: Progress | None, log_every: int
) -> tuple[dict[str, dict[str, Any]], dict[str, int], int, float]:
    """Writes every example into ``staging``; returns (final path -> info, class -> records, records, seconds)."""
    import tensorflow as tf

    num_shards, partition_by = layout.num_shards, layout.partition_by
    options = tf.io.TFRecordOptions(compression_type=layout.compression or "")
    writers: dict[str, list[Any]] = {}
    names: dict[str, list[str]] = {}
    counters: dict[str, int] = {}
    files: dict[str, dict[str, Any]] = {}
    start, written = time.monotonic(), 0
    try:
        for index, example in enumerate(examples):
            record = serialized(example, index)
            group = label_of(record, partition_by, index) if partition_by else ""
            if group not in writers:
                prefix = group_prefix(layout.path_prefix, partition_by, group)
                names[group] = [shard_name(prefix, i, num_shards, layout.compression) for i in range(num_shards)]
                if len({n for g in names.values() for n in g}) != sum(len(g) for g in names.values()):
                    raise invalid(
                        DataError,
                        f"examples[{index}].{partition_by}",
                        group,
                        "labels whose shortened file names differ",
                        "Shorten the labels.",
                    )
                writers[group] = [tf.io.TFRecordWriter(staging.path(n), options) for n in names[group]]
                for name in names[group]:
                    files[name] = {"records": 0, "bytes": 0, "class": group if partition_by else None}
                counters[group] = 0
            shard = counters[group] % num_shards
            counters[group] += 1
            writers[group][shard].write(record)
            info = files[names[group][shard]]
            info["records"] += 1
            info["bytes"] += len(record) + 16
            written += 1
            if progress is not None:
                progress(written)
            if written % log_every == 0:
                _log.info("Wrote %d records (%.0f/s).", written, written / max(1e-9, time.monotonic() - start))
    finally:
        for group_writers in writers.values():
            for writer in group_writers:
                writer.close()
    return files, counters, written, time.monotonic() - start
