"""Records the data tests write and read: ``id`` (and ``label``) examples, and what one worker's pipeline reads."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
ID_ONLY = {"id": tf.io.FixedLenFeature([], tf.int64)}


def _feature(value: int | str | bytes) -> tf.train.Feature:
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def example(i: int, label: int | str | bytes | None = None, **extra: bytes) -> tf.train.Example:
    """An example with ``id`` = ``i``, a ``label`` unless it is None, and extra bytes features."""
    feature = {"id": _feature(i)}
    if label is not None:
        feature["label"] = _feature(label)
    feature.update({key: _feature(value) for key, value in extra.items()})
    return tf.train.Example(features=tf.train.Features(feature=feature))


def ids(pipeline: Any, workers: int, worker: int) -> list[int]:
    """The ids worker ``worker`` of ``workers`` reads from ``pipeline`` in one pass, in order."""
    context = tf.distribute.InputContext(
        num_input_pipelines=workers, input_pipeline_id=worker, num_replicas_in_sync=workers
    )
    return [int(v) for batch in pipeline.dataset(context) for v in batch["id"].numpy()]
