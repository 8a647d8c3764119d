"""Elastic scenarios on a real two-node Ray on this machine; run by tests/launch/engines/ray/test_two_nodes.py under `unshare -n`.

A multi-node Ray refuses ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (the loopback-only, single-node mode), and
its daemons then bind every interface. So the whole cluster runs in a private network namespace that has
only loopback: the head (2 CPUs) on 127.0.0.1, a second raylet (1 CPU) on 127.0.0.2. Stopping that raylet is
a node that leaves; starting it again is a node that joins. Prints one JSON line (prefix RESULT_JSON) with
each scenario's statuses, outputs and cluster, and the pid of every Ray process it saw, for the test to
check that none is left. Usage: ray_two_nodes.py WORKDIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tfdist.launch.tasks.netns import loopback_up

loopback_up()
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"  # multi-node; the namespace has nothing but loopback
os.environ["RAY_AUTH_MODE"] = "disabled"
# No metrics: once a node has left, every export to the head's metrics agent fails, and a driver's ray.shutdown()
# waits up to the 10 s export period for the one under way.
os.environ["RAY_enable_metrics_collection"] = "0"  # noqa: SIM112 - Ray spells its settings so

import ray

sys.path.insert(0, str(Path(__file__).parent))
from ray_helpers import STOP_AT_ONCE, Background, stop_ray_block

from tfdist.cluster import address as _address
from tfdist.cluster.probe import can_connect
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.ray.engine import RayEngine
from tfdist.launch.supervisor.runner import run_config

PY = sys.executable
RAY_CLI = os.path.join(os.path.dirname(PY), "ray")
FAKE = str(Path(__file__).with_name("elastic_fake_train.py"))
EXTRA_HOST = "127.0.0.2"
RESULT_PREFIX = "RESULT_JSON "


def _session_pids(leader: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == leader:
                    found.append(int(entry))
            except OSError:
                continue
    return found


class TwoNodes:
    """`ray start --block` for the head and for the extra node, each in a session of its own."""

    def __init__(self) -> None:
        port, client_port = _address.free_ports(2)
        self.address = f"127.0.0.1:{port}"
        self.seen: set[int] = set()
        self.head = self._start(
            [
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                "--node-ip-address=127.0.0.1",
                "--include-dashboard=false",
                f"--ray-client-server-port={client_port}",
            ]
        )
        self.extra: subprocess.Popen | None = None
        if not can_connect(self.address, timeout=120):
            raise SystemExit("ray start --head did not come up")

    def _start(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [RAY_CLI, "start", "--block", "--disable-usage-stats", *args],
            env=dict(os.environ, **STOP_AT_ONCE),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def join(self) -> None:
        """Starts the extra node. Nothing waits for it here: a run's placement group does (the head has room
        for two of the three 1-CPU tasks), and a re-placed actor does after a node left."""
        self.extra = self._start(
            [
                f"--address={self.address}",
                "--num-cpus=1",
                f"--node-ip-address={EXTRA_HOST}",
                '--resources={"extra_node": 1}',
            ]
        )

    def leave(self) -> None:
        extra, self.extra = self.extra, None
        if extra is not None:
            self._stop(extra)

    def _stop(self, proc: subprocess.Popen) -> None:
        self.seen.update(_session_pids(proc.pid))
        stop_ray_block(proc)

    def close(self) -> None:
        self.leave()
        self._stop(self.head)


def _report(result: Any, statuses: list[str]) -> dict[str, Any]:
    return {
        "exit_code": result.exit_code,
        "summary": result.summary(),
        "statuses": statuses,
        "cluster": {t.name: t.address for t in result.cluster.tasks()},
        "outputs": {t.task: t.output for t in result.tasks},
    }


def lose_and_return(nodes: TwoNodes, work: Path) -> dict[str, Any]:
    """--lose/--return fault injection on Ray: the actor stays, the program is killed and started again."""
    statuses: list[str] = []
    config = LaunchConfig(
        command=(PY, FAKE, str(work / "backup-inject"), "7"),
        workers=3,
        min_workers=2,
        timeout=200,
        grace_seconds=2,
        loses=("worker:2@after=^epoch 1 end$",),
        returns=("worker:2@after=^epoch 3 end$",),
    )
    # The extra node is still joining: the placement group waits for it (at most 180 s).
    result = run_config(config, engine=RayEngine(address=nodes.address, ready_timeout=180), on_status=statuses.append)
    return _report(result, statuses)


def keras_node_leaves_and_joins(nodes: TwoNodes, work: Path) -> dict[str, Any]:
    """A real MWMS fit: the extra node stops after epoch 0 (progress; membership 0 holds there), and starts
    again once membership 1 holds, until its first epoch ends."""
    statuses: list[str] = []
    background = Background()
    hold = work / "hold"
    for generation in (0, 1):
        Path(f"{hold}-{generation}").touch()

    def _on_line(task: str, line: str) -> None:
        if line.startswith("EPOCH 0 "):
            background.once("leave", nodes.leave)

    def _on_status(message: str) -> None:
        statuses.append(message)
        if message.startswith("elastic: membership 1:"):
            background.once("join", nodes.join)
        if "is available again" in message:
            os.remove(f"{hold}-1")

    command = (PY, str(Path(__file__).with_name("ray_elastic_keras.py")), str(work / "keras"), "6", str(hold))
    config = LaunchConfig(
        command=command,
        workers=3,
        min_workers=2,
        max_restarts=2,
        timeout=600,  # Bounds a hold of at most 300 s (ray_elastic_keras.py) on top of the fit.
        grace_seconds=2,
        env={"TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    result = run_config(
        config, engine=RayEngine(address=nodes.address, cpus_per_task=1), on_line=_on_line, on_status=_on_status
    )
    background.join(200)
    return dict(_report(result, statuses), events=background.events)


def main() -> int:
    work = Path(sys.argv[1])
    nodes = TwoNodes()
    report: dict[str, Any] = {}
    try:
        nodes.join()
        report["inject"] = lose_and_return(nodes, work)
        if nodes.extra is None:
            nodes.join()
        report["keras"] = keras_node_leaves_and_joins(nodes, work)
        report["ray_initialized_after"] = ray.is_initialized()
        report["cluster_up_after"] = can_connect(nodes.address, timeout=5)
    finally:
        nodes.close()
        report["ray_pids"] = sorted(nodes.seen)
        sys.stdout.write(RESULT_PREFIX + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
