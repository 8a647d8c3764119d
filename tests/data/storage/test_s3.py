"""TFRecords on s3:// against a real S3-compatible server (moto) on 127.0.0.1, through both readers.

``tensorflow`` is tensorflow-io's file system (TF 2.17 only); ``boto3`` is tfdist's own reader
(tfdist/data/storage/s3.py), which every TF version uses where tensorflow-io cannot load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tfdist.runtime.versions import tfio_unavailable_reason

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]
READERS = [
    pytest.param("boto3", id="boto3"),
    pytest.param(
        "tensorflow",
        id="tensorflow_io",
        marks=pytest.mark.skipif(tfio_unavailable_reason() is not None, reason=str(tfio_unavailable_reason())),
    ),
]

SCRIPT = textwrap.dedent("""
    import collections, json, logging, sys
    import boto3, tensorflow as tf
    import tfdist
    from tfdist.data import TFRecordPipeline, write_tfrecords, read_manifest
    from tfdist.data.report import skew_report

    def main():
        logging.basicConfig(level=logging.INFO)
        boto3.client("s3", endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])
        def example(i):
            return tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3]))}))
        paths = write_tfrecords((example(i) for i in range(500)), f"s3://{sys.argv[2]}/train/part", num_shards=4,
                                compression="GZIP")
        features = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}
        seen = []
        for worker in range(2):
            context = tf.distribute.InputContext(2, worker, 2)
            pipeline = TFRecordPipeline(files=f"s3://{sys.argv[2]}/train/part-*", features=features, batch_size=10,
                                        verify="all", drop_remainder=False)
            seen += [int(v) for b in pipeline.dataset(context) for v in b["id"].numpy()]
        report = skew_report(f"s3://{sys.argv[2]}/train/part-*", label_key="label", num_workers=2)
        manifest_records = read_manifest(f"s3://{sys.argv[2]}/train/part")["records"]
        # A rewrite with fewer shards replaces the dataset whole; a failed one leaves it as it was.
        write_tfrecords((example(i) for i in range(500, 600)), f"s3://{sys.argv[2]}/train/part", num_shards=2)
        def failing():
            yield example(900)
            raise OSError("source went away")
        try:
            write_tfrecords(failing(), f"s3://{sys.argv[2]}/train/part", num_shards=3)
        except OSError:
            pass
        objects = sorted(o["Key"] for o in boto3.client("s3", endpoint_url=sys.argv[1]).list_objects_v2(
            Bucket=sys.argv[2])["Contents"])
        rewritten = TFRecordPipeline(files=f"s3://{sys.argv[2]}/train/part-*", features=features, batch_size=10)
        print("RESULT", json.dumps({"paths": paths, "ids": sorted(seen), "checked": pipeline.last_report,
                                    "manifest_records": manifest_records, "report": report.worker_records,
                                    "objects": objects, "rewritten": sorted(int(v) for b in rewritten.dataset()
                                                                            for v in b["id"].numpy())}), flush=True)
        return 0

    tfdist.exit_cleanly(main)
""")


@pytest.mark.parametrize("reader", READERS)
def test_write_and_read_sharded_tfrecords_on_s3(s3_server: dict[str, str], reader: str) -> None:
    import json

    # The boto3 run sees only tensorflow-io's S3_ENDPOINT (host:port), as a tensorflow-io user's job would.
    env = dict(os.environ, **s3_server, TFDIST_S3_READER=reader, TFDIST_S3_CACHE_MB="1")
    if reader == "boto3":
        env.pop("AWS_ENDPOINT_URL")
        env["S3_ENDPOINT"] = env["S3_ENDPOINT"].split("://")[1]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, s3_server["S3_ENDPOINT"], f"tfdist-{reader}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("Reading s3:// through boto3" in done.stderr) == (reader == "boto3"), done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["paths"] == [f"s3://tfdist-{reader}/train/part-0000{i}-of-00004.tfrecord.gz" for i in range(4)]
    assert result["ids"] == list(range(500))  # Two workers, file sharding, each record once.
    assert result["checked"]["files_checked"] == 2 and result["checked"]["corrupt_files"] == []
    assert result["manifest_records"] == 500
    assert result["report"] == [250, 250]
    assert result["objects"] == [
        "train/part-00000-of-00002.tfrecord",
        "train/part-00001-of-00002.tfrecord",
        "train/part-manifest.json",
    ]
    assert result["rewritten"] == list(range(500, 600))
