"""TFRecords from a Spark DataFrame: every partition writes its own shard, on its executor.

:func:`tfdist.data.write_tfrecords` hands a ``pyspark.sql.DataFrame`` here. Partition ``i`` of ``P`` writes
``PREFIX-0000i-of-0000P.tfrecord`` (with ``partition_by``: one such shard per class it holds) into the
write's staging directory, first under a name of its own task attempt, renamed when complete: a retried or
speculative attempt never leaves half a file. The driver then adds empty shards where a partition held none
of a class (so every class group is complete), and the writer commits them with the manifest in one step,
as for any other write.

Rows become examples by :func:`row_example` (one feature per column) unless ``to_example`` is given. An
error in a row comes back as the same tfdist error on the driver, naming the partition and row, without
Spark retrying the task.

Example:
    >>> row_example({"id": 3, "x": [0.5, 1.5], "name": "cat"}).features.feature["x"].float_list.value
    [0.5, 1.5]
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from tfdist.data.records._examples import group_prefix, label_of, serialized, shard_name
from tfdist.errors import DataError, Error, invalid

__all__ = ["row_example"]

ToExample = Callable[[Any], Any]


def is_dataframe(value: Any) -> bool:
    """Whether ``value`` is a Spark DataFrame (classic or Spark Connect), without importing pyspark."""
    kind = type(value)
    return kind.__name__ == "DataFrame" and kind.__module__.startswith("pyspark.sql")


def partition_count(frame: Any) -> int:
    """How many partitions (so shards) ``frame`` has; DataError for a DataFrame without RDDs (Spark Connect)."""
    if not hasattr(frame, "rdd"):
        raise invalid(
            DataError,
            "examples",
            type(frame).__name__,
            "a classic Spark DataFrame (Spark Connect has no RDDs)",
            "Write from a classic SparkSession, or collect the rows and pass tf.train.Example protos.",
        )
    return int(frame.rdd.getNumPartitions())


def _feature(column: str, value: Any) -> Any:
    import tensorflow as tf

    if hasattr(value, "toArray"):  # pyspark.ml.linalg vectors
        value = value.toArray().tolist()
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if value is None or any(item is None for item in items):
        raise invalid(DataError, column, None, "a value in every row", "Fill or drop the nulls, or pass to_example.")
    if all(isinstance(item, (bool, int)) for item in items):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(item) for item in items]))
    if all(isinstance(item, (bool, int, float)) for item in items):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[float(item) for item in items]))
    if all(isinstance(item, (str, bytes, bytearray)) for item in items):
        encoded = [item.encode() if isinstance(item, str) else bytes(item) for item in items]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=encoded))
    raise invalid(
        DataError,
        column,
        value,
        "numbers, text, bytes, a vector, or a list of one of those",
        "Flatten nested columns first, or pass to_example.",
    )


def row_example(row: Any) -> Any:
    """A ``tf.train.Example`` with one feature per column of ``row`` (a Row or a mapping).

    Integers and booleans become ``int64_list``, floats ``float_list``, text (UTF-8) and bytes ``bytes_list``;
    arrays and ML vectors become lists of those. Nulls and nested structures are refused, naming the column.
    """
    import tensorflow as tf

    fields: Mapping[str, Any] = row if isinstance(row, Mapping) else row.asDict()
    return tf.train.Example(
        features=tf.train.Features(feature={str(name): _feature(str(name), value) for name, value in fields.items()})
    )


def _write_partition(
    index: int,
    rows: Iterable[Any],
    *,
    staging_dir: str,
    path_prefix: str,
    count: int,
    compression: str | None,
    partition_by: str | None,
    to_example: ToExample | None,
) -> Iterator[tuple[str, Any]]:
    """Runs on an executor: writes partition ``index``; yields ('files', {final: info}) or ('error', ...)."""
    import tensorflow as tf
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = f"attempt-{context.taskAttemptId() if context is not None else 0}"  # unique per task attempt
    options = tf.io.TFRecordOptions(compression_type=compression or "")
    writers: dict[str, Any] = {}
    files: dict[str, dict[str, Any]] = {}

    def _open(group: str) -> str:
        final = shard_name(group_prefix(path_prefix, partition_by, group), index, count, compression)
        if final not in writers:
            writers[final] = tf.io.TFRecordWriter(f"{staging_dir}/{final.rpartition('/')[2]}.{attempt}", options)
            files[final] = {"records": 0, "bytes": 0, "class": group if partition_by else None}
        return final

    try:
        if not partition_by:
            _open("")  # An empty partition still writes its (empty) shard: the set stays complete.
        for row_index, row in enumerate(rows):
            where = f"partition {index}, row {row_index}"
            try:
                record = serialized(to_example(row) if to_example else row_example(row), row_index)
                group = label_of(record, partition_by, row_index) if partition_by else ""
            except DataError as err:
                raise type(err)(f"In {where}: {err}", field=err.field, value=err.value) from None
            final = _open(group)
            writers[final].write(record)
            files[final]["records"] += 1
            files[final]["bytes"] += len(record) + 16
    except Error as err:
        yield ("error", (type(err).__name__, str(err), err.field))
        return
    finally:
        for writer in writers.values():
            writer.close()
    for final in files:
        name = f"{staging_dir}/{final.rpartition('/')[2]}"
        tf.io.gfile.rename(f"{name}.{attempt}", name, overwrite=True)
    yield ("files", files)


def write_partitions(
    frame: Any,
    count: int,
    path_prefix: str,
    staging_dir: str,
    *,
    compression: str | None,
    partition_by: str | None,
    to_example: ToExample | None,
) -> tuple[dict[str, dict[str, Any]], dict[str, int], int]:
    """Writes every partition of ``frame`` (``count``, from :func:`partition_count`) into ``staging_dir``; returns
    (final path -> info, class -> records, records), as the writer's own loop does."""
    import tensorflow as tf

    from tfdist import errors

    rdd = frame.rdd
    if count > 99_999:
        raise invalid(DataError, "examples", count, "a DataFrame of at most 99999 partitions", "Coalesce it.")
    write = functools.partial(
        _write_partition,
        staging_dir=staging_dir,
        path_prefix=path_prefix,
        count=count,
        compression=compression,
        partition_by=partition_by,
        to_example=to_example,
    )
    files: dict[str, dict[str, Any]] = {}
    for kind, value in rdd.mapPartitionsWithIndex(write).collect():
        if kind == "error":
            name, message, field = value
            cls = getattr(errors, name, DataError)
            raise cls(message, field=field)
        files.update(value)
    counters: collections.Counter[str] = collections.Counter()
    for info in files.values():
        counters[info["class"] or ""] += info["records"]
    for group in counters if partition_by else ():
        prefix = group_prefix(path_prefix, partition_by, group)
        for index in range(count):
            final = shard_name(prefix, index, count, compression)
            if final not in files:  # This partition held none of the class: an empty shard completes the group.
                empty = f"{staging_dir}/{final.rpartition('/')[2]}"
                tf.io.TFRecordWriter(empty, tf.io.TFRecordOptions(compression_type=compression or "")).close()
                files[final] = {"records": 0, "bytes": 0, "class": group}
    return files, dict(counters), sum(counters.values())
