"""Shared fixtures: a real S3-compatible server on loopback, process-leak checks, fork servers kept for the
session (every local run with ``preload`` forks its tasks from an interpreter that imported TF already)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tfdist.cluster import address as _address
from tfdist.cluster.probe import can_connect

S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "tfdist",
    "AWS_SECRET_ACCESS_KEY": "tfdist-secret",
    "AWS_REGION": "us-east-1",
    "S3_USE_HTTPS": "0",
    "S3_VERIFY_SSL": "0",
}


@pytest.fixture(scope="session", autouse=True)
def _fork_servers() -> Iterator[None]:
    from tfdist import testing

    with testing.shared_fork_servers():
        yield


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """Starts the moto S3 server on 127.0.0.1; yields the env that points S3 clients at it."""
    server = shutil.which("moto_server") or os.path.join(os.path.dirname(sys.executable), "moto_server")
    port = _address.free_ports(1)[0]
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert can_connect(f"127.0.0.1:{port}", timeout=30), "moto_server did not start"
        yield dict(S3_KEYS, S3_ENDPOINT=f"http://127.0.0.1:{port}", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def s3_client(s3_server: dict[str, str]) -> Any:
    """A boto3 S3 client of the moto server (needs boto3: the test extra installs it)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_server["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id=s3_server["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s3_server["AWS_SECRET_ACCESS_KEY"],
    )


def _script(name: str) -> ModuleType:
    """scripts/NAME.py, a local cluster users can start too (slurm_local, spark_local)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_tfdist_{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real single-node Slurm cluster (munged, slurmctld, slurmd) on 127.0.0.1, installed with apt-get if missing.

    Skips only when the packages cannot be installed here (no apt-get, not root, or apt-get failed).
    """
    slurm_local = _script("slurm_local")
    reason = slurm_local.ensure_installed()
    if reason:
        pytest.skip(reason)
    with _id_range("slurm") as first_job_id:
        cluster = slurm_local.start(str(tmp_path_factory.mktemp("slurm")), first_job_id=first_job_id)
        try:
            yield cluster
        finally:
            cluster.stop()


@contextlib.contextmanager
def _id_range(name: str, ranges: int = 8, width: int = 100) -> Iterator[int]:
    """The first id of a range no other test session on this machine holds now (pytest-xdist workers, or two checkouts).

    A tfdist Slurm job takes its port slot from its job id (``tfdist.cluster.slurm.job_port_base``): two
    local clusters both numbering jobs from 1 would give two jobs running at once the same ports. Range ``k``
    is held by an exclusive lock on a file of the machine's temporary directory (not TMPDIR, which each
    session sets to its own) for as long as the session uses it.
    """
    for k in range(ranges):
        with open(f"/tmp/tfdist-tests-{name}-{k}.lock", "w") as held:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            yield 1 + k * width
            return
    raise RuntimeError(f"all {ranges} {name} id ranges are held by other test sessions")


# Every JVM of the Spark tests (master, worker, drivers, executors) runs with the client compiler only and the
# serial collector: their work here is small, and the server compiler's and G1's threads took about half of their
# CPU at start-up (a tfdist-launch run of two `pass` tasks: 26-33 s of the machine's CPU, 15-16 s with these).
SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_SLOTS = 6  # task slots of each Spark application in the tests (spark.cores.max); the cluster has twice as many
# The settings of every Spark application the tests start: the session below, and tfdist-launch's (--spark-conf).
SPARK_CONF = {
    "spark.cores.max": str(SPARK_SLOTS),
    "spark.driver.extraJavaOptions": SPARK_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": SPARK_JAVA_OPTIONS,
}


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real standalone Spark cluster (a master and a worker with 12 slots) on 127.0.0.1.

    Java is installed with apt-get if missing. Skips only when pyspark is not installed or Java cannot be.
    """
    spark_local = _script("spark_local")
    reason = spark_local.ensure_installed()
    if reason:
        pytest.skip(reason)
    cluster = spark_local.start(str(tmp_path_factory.mktemp("spark")), cores=12, java_options=SPARK_JAVA_OPTIONS)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark_session(spark_cluster: Any) -> Iterator[Any]:
    """A SparkSession of the test process on the test cluster, as a notebook has one (stopped at the end).

    Its driver binds loopback, and its executors run this interpreter (PYSPARK_PYTHON, as a user sets it).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(spark_cluster.master).appName("tfdist-tests")
    for key, value in {**SPARK_CONF, "spark.ui.showConsoleProgress": "false"}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()
