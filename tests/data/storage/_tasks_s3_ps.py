"""The chief of a ParameterServerStrategy cluster that fits from s3:// through boto3 (tests/data/storage/test_s3_ps.py).

The model counts every id it trains on in a variable on the ps, so the test sees which records the
workers' input pipelines (staged by the workers' own staging agents) delivered.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

NUM_IDS = 600
BATCH = 20


def _example(i: int) -> Any:
    import tensorflow as tf

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }
        )
    )


def _write_truncated(bucket: str, key: str, ids: range, keep_records: int) -> None:
    """Uploads a TFRecord object cut in the middle of record ``keep_records``."""
    import boto3

    from tfdist.data import write_tfrecords

    prefix = os.path.join(tempfile.mkdtemp(), "bad")
    (path,) = write_tfrecords((_example(i) for i in ids), prefix, num_shards=1)
    with open(path, "rb") as f:
        data = f.read()
    record = len(data) // len(ids)  # Equal-length records: ids < 1000 encode in the same number of bytes.
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data[: keep_records * record + record // 2])


def fit_from_s3(bucket: str) -> dict[str, Any]:
    import boto3
    import tensorflow as tf

    import tfdist
    from tfdist import keras
    from tfdist.data import TFRecordPipeline, write_tfrecords

    boto3.client("s3").create_bucket(Bucket=bucket)
    write_tfrecords((_example(i) for i in range(NUM_IDS)), f"s3://{bucket}/train/part", num_shards=12)
    # Damaged data: shard 1 of 3 is cut in its 6th record (ids 1005..1009 good, 1010..1014 lost).
    write_tfrecords((_example(i) for i in range(1000, 1005)), f"s3://{bucket}/bad/part-a", num_shards=1)
    _write_truncated(bucket, "bad/part-b", range(1005, 1015), keep_records=5)
    write_tfrecords((_example(i) for i in range(1015, 1020)), f"s3://{bucket}/bad/part-c", num_shards=1)
    features = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
    strategy = tfdist.build_strategy("auto")

    class Counting(keras.Model):
        """A tiny classifier that also counts the ids it trains on (a variable on the ps)."""

        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1, activation="sigmoid")
            self.seen = tf.Variable(tf.zeros([1100]), trainable=False)

        def call(self, inputs: Any) -> Any:
            return self.dense(tf.cast(inputs["id"][:, None], tf.float32) / 1000.0)

        def train_step(self, data: Any) -> Any:
            self.seen.scatter_add(tf.IndexedSlices(tf.ones_like(data[0]["id"], tf.float32), data[0]["id"]))
            return super().train_step(data)

    def fit(files: str, steps: int, **options: Any) -> list[int]:
        pipeline = TFRecordPipeline(
            files=files,
            features=features,
            label_key="label",
            as_supervised=True,
            batch_size=BATCH,
            shuffle_buffer=0,
            num_epochs=None,
            order="buffer",  # boto3's staged objects are read whole: every worker reads every object.
            **options,
        )
        with strategy.scope():
            model = Counting()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
        model.fit(
            keras.fit_input(pipeline, strategy=strategy, steps_per_epoch=steps),
            epochs=1,
            steps_per_epoch=steps,
            verbose=0,
        )
        return [int(v) for v in model.seen.numpy()]

    result: dict[str, Any] = {}
    # 60 steps of 20: 1200 records over 2 workers that each read every object in the same order.
    result["train"] = fit(f"s3://{bucket}/train/part-*", 60)
    # Damaged object, checked on the coordinator: the workers read only its whole records.
    result["skip"] = fit(f"s3://{bucket}/bad/part-*", 10, verify="all", on_corrupt="skip")
    try:
        fit(f"s3://{bucket}/bad/part-*", 10, verify="all", on_corrupt="raise")
    except Exception as err:
        result["raise"] = f"{type(err).__name__}: {err}"
    try:  # Not checked up front: TensorFlow's own framing check fails on the worker, and fit raises it.
        fit(f"s3://{bucket}/bad/part-*", 10, verify="none")
    except tf.errors.OpError as err:
        result["unchecked"] = f"{type(err).__name__}: {err.message}"
    return result
