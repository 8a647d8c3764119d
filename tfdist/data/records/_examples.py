"""What one TFRecord example and one shard are called: shard names, class labels, serialized records.

Shared by :mod:`tfdist.data.records.writer` (one process writes) and :mod:`tfdist.data.records.dataframe`
(a Spark DataFrame's executors write).
"""

from __future__ import annotations

import hashlib
import urllib.parse
from typing import Any

from tfdist.errors import DataError, invalid

COMPRESSIONS = {None: "", "GZIP": ".gz", "ZLIB": ".zz"}
_MAX_LABEL_NAME = 100


def shard_name(prefix: str, index: int, count: int, compression: str | None = None) -> str:
    """``PREFIX-00003-of-00016.tfrecord`` (plus ``.gz``/``.zz`` when compressed)."""
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord{COMPRESSIONS[compression]}"


def label_name(value: str) -> str:
    """``value`` as it appears in a shard name: percent-encoded (no ``/``, no control characters), at most 100
    characters (longer values are cut and get a hash; the manifest keeps the real value).

    Example:
        >>> label_name("cat"), label_name("/../x"), label_name("a b\\n")
        ('cat', '%2F..%2Fx', 'a%20b%0A')
    """
    encoded = urllib.parse.quote(value, safe="_.").replace("~", "%7E")
    if len(encoded) > _MAX_LABEL_NAME:
        encoded = f"{encoded[:80]}~{hashlib.sha1(value.encode()).hexdigest()[:12]}"
    return encoded


def label_of(record: bytes, key: str, index: int) -> str:
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    try:
        feature = tf.train.Example.FromString(record).features.feature
    except DecodeError as err:
        raise invalid(
            DataError,
            f"examples[{index}]",
            record[:40],
            "a serialized tf.train.Example with partition_by",
            "Pass tf.train.Example protos or their SerializeToString().",
        ) from err
    if key not in feature:
        raise invalid(DataError, "partition_by", key, f"a feature of every example (found {sorted(feature)})")
    value = feature[key]
    kind = value.WhichOneof("kind")
    items = list(getattr(value, kind).value) if kind else []
    if len(items) != 1:
        raise invalid(DataError, "partition_by", key, "a feature with exactly one value per example")
    item = items[0]
    if isinstance(item, bytes):
        try:
            item = item.decode()
        except UnicodeDecodeError as err:
            raise invalid(
                DataError,
                f"examples[{index}].{key}",
                item[:40],
                "a UTF-8 label with partition_by",
                "Map the labels to integers or text first.",
            ) from err
    label = str(item)
    if not label:
        raise invalid(DataError, f"examples[{index}].{key}", label, "a non-empty label with partition_by")
    return label


def serialized(example: Any, index: int) -> bytes:
    if isinstance(example, bytes):
        return example
    serialize = getattr(example, "SerializeToString", None)
    if not callable(serialize):
        raise invalid(
            DataError,
            f"examples[{index}]",
            example,
            "a tf.train.Example or serialized bytes",
            "Build tf.train.Example protos (or pass bytes you serialized yourself).",
        )
    record = serialize()
    if not isinstance(record, bytes):
        raise invalid(DataError, f"examples[{index}]", type(example).__name__, "a protocol buffer message")
    return record


def group_prefix(path_prefix: str, partition_by: str | None, group: str) -> str:
    """The prefix of a class group's shards (``PREFIX-KEY=VALUE``), or ``path_prefix`` without ``partition_by``."""
    return f"{path_prefix}-{partition_by}={label_name(group)}" if partition_by else path_prefix
