#!/usr/bin/env python3
"""A standalone Spark cluster on 127.0.0.1 (one master, one worker), for trying and testing ``--engine spark``.

It runs the master and worker classes of the installed pyspark (``pip install pyspark``; Java 17 or 21 on
PATH or in JAVA_HOME) in their own sessions, on free ports, with every address on loopback, and waits until
the worker has registered. Nothing is written outside ``--dir``.

    python scripts/spark_local.py start --dir /tmp/spark --cores 4   # prints: export TFDIST_SPARK_MASTER=...
    tfdist-launch --engine spark --spark-master spark://127.0.0.1:PORT --workers 2 -- python train.py
    python scripts/spark_local.py stop --dir /tmp/spark

The test fixture (tests/conftest.py ``spark_cluster``) and scripts/bench_spark.py use :func:`start` and
:meth:`LocalSpark.stop`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

LOOPBACK = "127.0.0.1"
JAVA_PACKAGE = "openjdk-17-jre-headless"  # Debian 12's Java 17; Spark 4 runs on Java 17 and 21


def java() -> str | None:
    """The java binary Spark will use (JAVA_HOME's, else PATH's), or None."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def ensure_installed() -> str | None:
    """Installs Debian's Java 17 with apt-get when no Java is found; returns None, or why it could not.

    pyspark itself comes from the package index (tfdist's ``spark`` extra).
    """
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return 'pyspark is not installed: pip install ".[spark]" in a tfdist clone'
    if java() is not None:
        return None
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"Java is not installed, and installing {JAVA_PACKAGE} needs apt-get as root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", JAVA_PACKAGE],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            return f"apt-get could not install {JAVA_PACKAGE}: '{' '.join(argv)}' exited {done.returncode}: {tail[0]}"
    return None if java() is not None else f"apt-get installed {JAVA_PACKAGE} but java is still not found"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def spark_home() -> str:
    """The installed pyspark's folder, which holds bin/spark-class and the jars."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


@dataclasses.dataclass
class LocalSpark:
    """A running master and worker; ``master`` is the URL drivers join."""

    master: str
    ui: str
    pids: list[int]
    directory: str

    def stop(self) -> None:
        """Stops the worker (and its executors) and the master: SIGTERM, then SIGKILL of their sessions."""
        for pid in reversed(self.pids):
            _kill_session(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in self.pids:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _kill_session(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def _kill_session(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _env(directory: str, java_options: str = "") -> dict[str, str]:
    env = dict(os.environ)
    if java_options:  # spark-class gives SPARK_DAEMON_JAVA_OPTS to the master's and the worker's JVM
        env["SPARK_DAEMON_JAVA_OPTS"] = f"{env.get('SPARK_DAEMON_JAVA_OPTS', '')} {java_options}".strip()
    env.update(
        SPARK_HOME=spark_home(),
        SPARK_LOCAL_IP=LOOPBACK,
        SPARK_LOCAL_DIRS=os.path.join(directory, "local"),
        SPARK_WORKER_DIR=os.path.join(directory, "work"),
        SPARK_LOG_DIR=os.path.join(directory, "logs"),
        PYSPARK_PYTHON=env.get("PYSPARK_PYTHON", sys.executable),
    )
    return env


def _spawn(directory: str, name: str, args: list[str], java_options: str = "") -> int:
    os.makedirs(os.path.join(directory, "logs"), exist_ok=True)
    log = open(os.path.join(directory, "logs", f"{name}.log"), "ab")
    proc = subprocess.Popen(
        [os.path.join(spark_home(), "bin", "spark-class"), *args],
        env=_env(directory, java_options),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    return proc.pid


def _workers(ui: str) -> int:
    """How many ALIVE workers the master's JSON page lists (0 while it is not up)."""
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=2) as reply:
            state = json.load(reply)
    except OSError:
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


def start(
    directory: str, *, cores: int = 4, memory: str = "2g", timeout: float = 90.0, java_options: str = ""
) -> LocalSpark:
    """Starts a master and one worker with ``cores`` slots; waits until the worker has registered.

    ``java_options`` go to the master's and the worker's JVM (after any SPARK_DAEMON_JAVA_OPTS of the environment).
    """
    os.makedirs(directory, exist_ok=True)
    port, ui_port, worker_ui = _free_port(), _free_port(), _free_port()
    master = f"spark://{LOOPBACK}:{port}"
    ui = f"http://{LOOPBACK}:{ui_port}"
    cls = "org.apache.spark.deploy"
    pids = [
        _spawn(
            directory,
            "master",
            [f"{cls}.master.Master", "--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui_port)],
            java_options,
        )
    ]
    cluster = LocalSpark(master=master, ui=ui, pids=pids, directory=directory)
    try:
        pids.append(
            _spawn(
                directory,
                "worker",
                [
                    f"{cls}.worker.Worker",
                    master,
                    "--host",
                    LOOPBACK,
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(worker_ui),
                ],
                java_options,
            )
        )
        deadline = time.monotonic() + timeout
        while _workers(ui) < 1:
            if time.monotonic() > deadline or not all(_alive(pid) for pid in pids):
                raise RuntimeError(f"the Spark master or worker did not come up; see {directory}/logs")
            time.sleep(0.3)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--dir", required=True, help="where the cluster keeps its logs, work and state")
    parser.add_argument("--cores", type=int, default=4, help="task slots of the worker")
    parser.add_argument("--memory", default="2g", help="memory the worker offers its executors")
    args = parser.parse_args()
    state = os.path.join(args.dir, "cluster.json")
    if args.action == "start":
        reason = ensure_installed()
        if reason:
            sys.stderr.write(f"spark_local: {reason}\n")
            return 1
        cluster = start(args.dir, cores=args.cores, memory=args.memory)
        with open(state, "w") as out:
            json.dump(dataclasses.asdict(cluster), out)
        sys.stdout.write(f"export TFDIST_SPARK_MASTER={cluster.master}   # web UI: {cluster.ui}\n")
        return 0
    with open(state) as inp:
        LocalSpark(**json.load(inp)).stop()
    os.remove(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
