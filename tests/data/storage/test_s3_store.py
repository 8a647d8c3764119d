"""tfdist's boto3 reader (tfdist/data/storage/s3.py) against the moto server: listing, staging cache, writing, errors."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tfdist.data.storage.s3 import S3Store, endpoint_from_env, glob_regex
from tfdist.errors import DataError, StorageError

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]


def test_endpoint_comes_from_either_variable() -> None:
    assert endpoint_from_env({"AWS_ENDPOINT_URL": "http://a:1", "S3_ENDPOINT": "b:2"}) == ("http://a:1", True)
    assert endpoint_from_env({"S3_ENDPOINT": "b:2", "S3_USE_HTTPS": "0", "S3_VERIFY_SSL": "0"}) == ("http://b:2", False)
    assert endpoint_from_env({"S3_ENDPOINT": "b:2"}) == ("https://b:2", True)
    assert endpoint_from_env({}) == (None, True)


def test_glob_keeps_wildcards_within_one_level() -> None:
    regex = glob_regex("d/part-[0-1]?-*.gz")
    assert regex.match("d/part-01-x.gz") and not regex.match("d/part-21-x.gz") and not regex.match("d/part-01-a/b.gz")


def test_store_lists_stages_within_budget_and_writes(
    s3_server: dict[str, str], s3_client: Any, tmp_path: os.PathLike[str]
) -> None:
    env = dict(s3_server)
    env.pop("AWS_ENDPOINT_URL")  # S3_ENDPOINT alone must do.
    s3_client.create_bucket(Bucket="store")
    store = S3Store(cache_dir=str(tmp_path), cache_bytes=2500, env=env)
    for i in range(4):
        with store.open(f"s3://store/d/obj-{i}", "wb") as f:
            f.write(bytes([i]) * 1000)
    with store.open("s3://store/d/sub/deeper", "w") as f:
        f.write("not matched by d/*")
    assert store.glob("s3://store/d/obj-*") == [f"s3://store/d/obj-{i}" for i in range(4)]
    assert store.glob("s3://store/d/*") == [f"s3://store/d/obj-{i}" for i in range(4)]
    assert store.size("s3://store/d/obj-2") == 1000 and store.exists("s3://store/d/sub/deeper")
    assert not store.exists("s3://store/d/none")

    copies = [store.stage(f"s3://store/d/obj-{i}") for i in range(4)]
    for i, copy in enumerate(copies[-2:], start=2):
        assert open(copy, "rb").read() == bytes([i]) * 1000
    kept = [p for p in copies if os.path.exists(p)]
    assert kept == copies[-2:]  # 2500 bytes hold two 1000-byte objects: the oldest were deleted.
    assert store.stage("s3://store/d/obj-3") == copies[3]  # A cache hit, no second download.
    with store.open("s3://store/d/obj-0", "rb") as f:
        assert f.read() == bytes([0]) * 1000  # Evicted, so fetched again.


def test_a_rewritten_object_is_staged_again(s3_server: dict[str, str], tmp_path: os.PathLike[str]) -> None:
    # Another process rewrites the object with the same size: the next listing shows a new ETag, and the
    # reader fetches the new bytes instead of serving its old copy.
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=s3_server["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_server["AWS_SECRET_ACCESS_KEY"],
    )
    client.create_bucket(Bucket="rewrite")
    client.put_object(Bucket="rewrite", Key="d/obj", Body=b"a" * 100)
    store = S3Store(cache_dir=str(tmp_path), env=dict(s3_server))
    assert store.glob("s3://rewrite/d/*") == ["s3://rewrite/d/obj"]
    first = store.stage("s3://rewrite/d/obj")
    assert open(first, "rb").read() == b"a" * 100
    assert store.stage("s3://rewrite/d/obj") == first  # Unchanged: a cache hit.
    client.put_object(Bucket="rewrite", Key="d/obj", Body=b"b" * 100)
    store.glob("s3://rewrite/d/*")  # What every dataset() call does first.
    again = store.stage("s3://rewrite/d/obj")
    assert open(again, "rb").read() == b"b" * 100
    assert not os.path.exists(first) or first == again


def test_missing_objects_and_bad_urls_are_clear(s3_server: dict[str, str], tmp_path: os.PathLike[str]) -> None:
    store = S3Store(cache_dir=str(tmp_path), env=dict(s3_server))
    with pytest.raises(StorageError, match=r"Cannot read s3://no-such-bucket/x through boto3 \(endpoint http://"):
        store.stage("s3://no-such-bucket/x")
    with pytest.raises(DataError, match="an s3://bucket/key URL"):
        store.size("gs://x/y")
