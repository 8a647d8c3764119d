"""s3:// through boto3 for pipelines that run in a TF server, without a cluster: the tf.data service, traced datasets,
the staging agents' protocol (tfdist/data/storage/staging.py). Against a real S3-compatible server (moto) on 127.0.0.1.

The ParameterServerStrategy cluster test is tests/data/storage/test_s3_ps.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import IO, Any

import pytest

pytestmark = [pytest.mark.s3]


SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import boto3, tensorflow as tf
    import tfdist
    from tfdist.data import LocalDataService, TFRecordPipeline, write_tfrecords
    from tfdist.data.storage import staging

    def main():
        bucket = sys.argv[1]
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=bucket)
        def example(i):
            return tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}))
        write_tfrecords((example(i) for i in range(400)), f"s3://{bucket}/train/part", num_shards=8)
        features = {"id": tf.io.FixedLenFeature([], tf.int64)}
        out = {}
        def ids(dataset):
            return sorted(int(v) for batch in dataset for v in batch["id"].numpy())
        # No agent serves this process yet: a traced dataset waits, then fails naming the fix, after one
        # timeout: the first file to time out ends the waits of the others in flight (8 files here).
        os.environ["TFDIST_S3_STAGE_TIMEOUT"] = "1.5"
        pipeline = TFRecordPipeline(files=f"s3://{bucket}/train/part-*", features=features, batch_size=10)
        traced = tf.function(lambda: pipeline.dataset(tf.distribute.InputContext()))()
        start = time.monotonic()
        try:
            ids(traced)
        except tf.errors.InvalidArgumentError as err:
            out["no_agent"] = err.message
        out["no_agent_seconds"] = time.monotonic() - start
        # on_corrupt='skip' cuts a damaged file; a file that was never staged is an error all the same.
        skipping = TFRecordPipeline(files=f"s3://{bucket}/train/part-*", features=features, batch_size=10,
                                    on_corrupt="skip")
        try:
            out["no_agent_skip"] = ids(tf.function(lambda: skipping.dataset(tf.distribute.InputContext()))())
        except tf.errors.InvalidArgumentError as err:
            out["no_agent_skip"] = err.message
        os.environ["TFDIST_S3_STAGE_TIMEOUT"] = "120"
        # The tf.data service: its in-process workers read through this process's agent; each record once.
        with LocalDataService(num_workers=2) as service:
            served = TFRecordPipeline(files=f"s3://{bucket}/train/part-*", features=features, batch_size=10,
                                      data_service=service.address)
            out["service"] = ids(served.dataset())
        out["agent_staged"] = staging.ensure_agent().staged
        # Rewritten after the dataset was built (listed): the agent refuses other bytes than those listed.
        traced = tf.function(lambda: pipeline.dataset(tf.distribute.InputContext()))()
        write_tfrecords((example(i) for i in range(1000, 1010)), f"s3://{bucket}/train/part", num_shards=8)
        objects = os.path.join(staging.stage_root(), "objects")
        for name in os.listdir(objects):  # As if evicted: the listed version must be fetched again.
            os.unlink(os.path.join(objects, name))
        try:
            ids(traced)
        except tf.errors.InvalidArgumentError as err:
            out["changed"] = err.message
        print("RESULT", json.dumps(out), flush=True)
        return 0

    tfdist.exit_cleanly(main)
""")


@pytest.mark.timeout(300)
def test_data_service_and_traced_datasets_read_s3_through_an_agent(s3_server: dict[str, str], tmp_path: str) -> None:
    stage = os.path.join(str(tmp_path), "stage")
    env = dict(os.environ, **s3_server, TFDIST_S3_READER="boto3", TFDIST_S3_STAGE_DIR=stage)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "tfdist-service"], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert "was not staged within 1.5s" in result["no_agent"] and "tfdist-launch" in result["no_agent"]
    # One timeout, not one per file in flight (8 files: at least 12 s before the waits shared a give-up marker).
    assert result["no_agent_seconds"] < 6, result["no_agent_seconds"]
    assert "was not staged within 1.5s" in result["no_agent_skip"], result["no_agent_skip"]
    assert result["service"] == list(range(400))  # Dynamic sharding over 2 service workers: each record once.
    assert result["agent_staged"] == 8
    assert "changed since it was listed" in result["changed"], result["changed"]


def _bucket_of_objects(
    client: Any, s3_server: dict[str, str], tmp_path: str, bucket: str, count: int
) -> tuple[Any, str]:
    """Puts objects obj-0 .. obj-<count-1> of 1,000 bytes each; returns an S3Store and a stage root in tmp_path."""
    from tfdist.data.storage.s3 import S3Store

    client.create_bucket(Bucket=bucket)
    for i in range(count):
        client.put_object(Bucket=bucket, Key=f"obj-{i}", Body=bytes([i]) * 1000)
    store = S3Store(cache_dir=os.path.join(str(tmp_path), "cache"), env=dict(s3_server))
    return store, os.path.join(str(tmp_path), "stage")


def _serve_until(condition: Callable[..., bool], timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the agents did not serve the requests in time"
        time.sleep(0.05)


def test_agents_of_one_host_share_copies_keep_the_budget_and_report_errors(
    s3_server: dict[str, str], s3_client: Any, tmp_path: str
) -> None:
    from tfdist.data.storage import staging

    store, root = _bucket_of_objects(s3_client, s3_server, tmp_path, "tfdist-agents", 6)
    urls = [f"s3://tfdist-agents/obj-{i}" for i in range(6)]
    versions = {url: store.version(url) for url in urls}
    names = {url: staging.staged_name(url, *versions[url]) for url in urls}

    def want(url: str, version: tuple[int, str]) -> str:
        name = staging.staged_name(url, *version)
        with open(os.path.join(root, "want", name), "w") as f:
            f.write(f"{url}\n{version[0]}\n{version[1]}\n")
        return os.path.join(root, "objects", name + staging.SUFFIX)

    # Two agents on one stage root, a budget of 3 copies: each object is downloaded once, the oldest evicted
    # (but the last one requested, which a reader may be about to open).
    f: IO[Any]  # Opened in binary mode, then in text mode.
    with (
        staging.StagingAgent(root=root, cache_bytes=3000, store=lambda: store, keep_recent=1, keep_recent_s=0) as one,
        staging.StagingAgent(root=root, cache_bytes=3000, store=lambda: store, keep_recent=1, keep_recent_s=0) as two,
    ):
        for url in urls:
            local = want(url, versions[url])
            _serve_until(lambda local=local: os.path.exists(local))
            with open(local, "rb") as f:
                assert f.read() == bytes([urls.index(url)]) * 1000
        assert one.staged + two.staged == 6
        kept = sorted(name for name in os.listdir(os.path.join(root, "objects")) if name.endswith(".staged"))
        assert kept == sorted(names[url] + ".staged" for url in urls[3:])
        # A version other than the object's, and a missing object: an error file the reader shows.
        stale = want(urls[0], (1000, '"not-the-etag"'))
        missing = want("s3://tfdist-agents/no-such-object", (5, '"x"'))
        _serve_until(lambda: os.path.exists(stale + ".error") and os.path.exists(missing + ".error"))
        with open(stale + ".error") as f:
            assert "changed since it was listed" in f.read()
        with open(missing + ".error") as f:
            assert "Cannot stat s3://tfdist-agents/no-such-object through boto3" in f.read()
        _serve_until(lambda: not os.listdir(os.path.join(root, "want")))  # Every request answered.


SERVER = textwrap.dedent("""
    import json, logging, sys, threading
    from tfdist import ClusterSpec
    from tfdist.cluster import address as _address
    from tfdist.data.storage import staging
    from tfdist.launch import run_server

    logging.basicConfig(level=logging.INFO)
    ports = _address.free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    started = {}
    for task in ("ps", "worker"):  # The same process: the ps server first, then the worker's.
        stop = threading.Event()
        stop.set()  # Serve, then return at once.
        run_server(ClusterSpec.from_tf_config({"cluster": cluster, "task": {"type": task, "index": 0}}), stop=stop)
        started[task] = staging._AGENT is not None
    print("RESULT", json.dumps(started), flush=True)
""")


@pytest.mark.timeout(120)
def test_run_server_starts_the_staging_agent_on_worker_tasks_only(tmp_path: str) -> None:
    env = dict(os.environ, TFDIST_S3_STAGE_DIR=os.path.join(str(tmp_path), "stage"))
    done = subprocess.run([sys.executable, "-c", SERVER], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line[len("RESULT ") :]) == {"ps": False, "worker": True}
    # Started, but asked for nothing: it says nothing (issue 26 item 4: PS workers that never read s3://).
    assert "Staging agent serving" not in done.stderr, done.stderr[-3000:]


def test_eviction_spares_recent_copies_counts_partial_downloads_and_budget_is_checked(
    s3_server: dict[str, str], s3_client: Any, tmp_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tfdist.data.storage import staging
    from tfdist.errors import DataError

    for bad in ("4g", "-1", "0"):
        with pytest.raises(DataError, match="TFDIST_S3_CACHE_MB"):
            staging._cache_bytes({"TFDIST_S3_CACHE_MB": bad})
    assert staging._cache_bytes({}) == 4096 << 20
    store, root = _bucket_of_objects(s3_client, s3_server, tmp_path, "tfdist-evict", 4)

    def stage_all(keys: range) -> list[str]:
        staged = []
        for i in keys:
            url = f"s3://tfdist-evict/obj-{i}"
            version = store.version(url)
            name = staging.staged_name(url, *version)
            with open(os.path.join(root, "want", name), "w") as f:
                f.write(f"{url}\n{version[0]}\n{version[1]}\n")
            staged.append(os.path.join(root, "objects", name + staging.SUFFIX))
            _serve_until(lambda: os.path.exists(staged[-1]))
        return staged

    # Default grace: copies requested just now (ahead of a reader) are kept over the budget, with a warning.
    with staging.StagingAgent(root=root, cache_bytes=1500, store=lambda: store):
        with caplog.at_level("WARNING", logger="tfdist.data"):
            kept = stage_all(range(3))
        assert all(os.path.exists(path) for path in kept)
        assert "over TFDIST_S3_CACHE_MB" in caplog.text
    # No grace: a partial download (another agent's, in flight) counts toward the budget.
    with open(os.path.join(root, "objects", ".part-abc-1"), "wb") as f:
        f.write(b"x" * 1500)
    with staging.StagingAgent(root=root, cache_bytes=2600, store=lambda: store, keep_recent=1, keep_recent_s=0):
        last = stage_all(range(3, 4))
    staged = sorted(name for name in os.listdir(os.path.join(root, "objects")) if name.endswith(".staged"))
    assert staged == [os.path.basename(last[0])]  # 1500 + 1000 fit 2600; one more copy would not.


EXITS = textwrap.dedent("""
    import os, sys, time
    from tfdist.data.storage import staging

    root, marker = sys.argv[1], sys.argv[2]
    def store():  # A download that never ends (an object far too large for this run).
        open(marker, "w").close()
        time.sleep(3600)
    agent = staging.StagingAgent(root=root, store=store).start()
    with open(os.path.join(root, "want", staging.staged_name("s3://b/k", 1, "e")), "w") as f:
        f.write("s3://b/k\\n1\\ne\\n")
    while not os.path.exists(marker):
        time.sleep(0.05)
    print("DONE", flush=True)
""")


@pytest.mark.timeout(120)
def test_a_download_in_flight_does_not_keep_the_process_alive(tmp_path: str) -> None:
    marker = os.path.join(str(tmp_path), "downloading")
    done = subprocess.run(
        [sys.executable, "-c", EXITS, os.path.join(str(tmp_path), "stage"), marker],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]


def test_requests_build_without_warnings(tmp_path: str) -> None:
    import warnings

    import tensorflow as tf

    from tfdist.data.storage.staging import StagedReads

    reads = StagedReads({"s3://b/k": (1, '"e"')}, root=str(tmp_path), timeout=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # A `deterministic` without parallel calls warns on every build.
        reads.request(tf.data.Dataset.from_tensor_slices(["s3://b/k"]), ahead=2)
    # On Python 3.13, TF's autograph passes its own keyword to ast nodes, which Python deprecates
    # ("... got an unexpected keyword argument '___pyct_anno'"): TensorFlow's warning, not the build's.
    ours = [w for w in caught if "___pyct_anno" not in str(w.message)]
    assert not ours, [str(warning.message) for warning in ours]


def test_stage_root_must_be_private_and_other_users_requests_are_ignored(tmp_path: str) -> None:
    import time

    from tfdist.data.storage import staging
    from tfdist.errors import StorageError

    fresh = os.path.join(str(tmp_path), "fresh")
    staging.StagingAgent(root=fresh).start().stop()
    assert os.stat(fresh).st_mode & 0o777 == 0o700
    shared = os.path.join(str(tmp_path), "shared")
    os.makedirs(shared)
    os.chmod(shared, 0o777)  # Like a predictable $TMPDIR name another user created first.
    with pytest.raises(StorageError, match="TFDIST_S3_STAGE_DIR") as err:
        staging.StagingAgent(root=shared).start()
    assert "chmod 700" in str(err.value)
    if os.getuid() == 0:  # Only root can give a file away: another user's request is not served, not retried.
        calls = []
        with staging.StagingAgent(root=fresh, store=lambda: calls.append(1)):
            want = os.path.join(fresh, "want", staging.staged_name("s3://b/k", 1, "e"))
            with open(want, "w") as f:
                f.write("s3://b/k\n1\ne\n")
            os.chown(want, 12345, 12345)
            time.sleep(0.5)
        assert calls == [] and os.path.exists(want)


def test_an_agent_removes_what_dead_servers_left(tmp_path: str) -> None:
    from tfdist.data.storage import staging

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=30
    )
    gone, alive = int(dead.stdout), os.getpid()
    objects = os.path.join(str(tmp_path), "stage", "objects")
    os.makedirs(objects)
    left = {f".part-{'a' * 32}-{gone}": "x", f".part-error-{gone}-7": "x", f".lock-{'b' * 32}": str(gone)}
    kept = {f".part-{'c' * 32}-{alive}": "x", f".lock-{'d' * 32}": str(alive), "e" * 32 + ".staged": "x"}
    for name, text in {**left, **kept}.items():
        with open(os.path.join(objects, name), "w") as f:
            f.write(text)
    staging.StagingAgent(root=os.path.join(str(tmp_path), "stage")).start().stop()
    assert sorted(os.listdir(objects)) == sorted(kept)


def test_a_successful_stage_removes_an_earlier_error(s3_server: dict[str, str], s3_client: Any, tmp_path: str) -> None:
    from tfdist.data.storage import staging

    store, root = _bucket_of_objects(s3_client, s3_server, tmp_path, "tfdist-retry", 1)
    url = "s3://tfdist-retry/obj-0"
    version = store.version(url)
    name = staging.staged_name(url, *version)
    local = os.path.join(root, "objects", name + staging.SUFFIX)
    with staging.StagingAgent(root=root, store=lambda: store):
        with open(local + ".error", "w") as f:  # A failed attempt a moment ago (e.g. a network error).
            f.write("Cannot read: connection reset")
        with open(os.path.join(root, "want", name), "w") as f:
            f.write(f"{url}\n{version[0]}\n{version[1]}\n")
        _serve_until(lambda: os.path.exists(local))
        assert not os.path.exists(local + ".error")  # A reader's next wait must not fail on it.


def test_a_lock_being_claimed_is_not_taken_over(tmp_path: str) -> None:
    from tfdist.data.storage import _stage_files

    lock = os.path.join(str(tmp_path), ".lock-x")
    open(lock, "w").close()  # Another agent created it and has not written its pid yet.
    assert not _stage_files.claim(lock)
    assert os.path.exists(lock)
    old = time.time() - 60
    os.utime(lock, (old, old))  # Empty for a minute: its claimer died between the two steps.
    assert _stage_files.claim(lock)
    with open(lock) as f:
        assert f.read() == str(os.getpid())
    with open(lock, "w") as f:
        f.write("999999999")  # A pid that cannot be alive.
    assert _stage_files.claim(lock)
    assert not _stage_files.claim(lock)  # Ours now, and we are alive.
