"""Simulated hosts (``simulate_hosts``, ``links``): each task on a host of its own, links shaped with tc.

Real processes on real namespaces (this machine can make them: no skip); the TensorFlow runs are short.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.engines import _tasks_hosts
from tests.support.processes import assert_all_gone
from tfdist import LaunchError, launch, testing
from tfdist.launch import LaunchConfig, Link, Outcome
from tfdist.launch.engines._hosts import Hosts
from tfdist.runtime import STALLED

PY = sys.executable
MB = 1 << 20

# worker:0 pulls SIZE bytes from each other worker in turn (each sends to its first connection and ends) and
# prints the rate it received at, past the first MiB (the token bucket's burst).
TRANSFER = """
import json, os, socket, sys, time
spec = json.loads(os.environ["TF_CONFIG"]); me = spec["task"]["index"]; workers = spec["cluster"]["worker"]
sizes = [int(s) for s in sys.argv[1:]]
if me:
    host, port = workers[me].rsplit(":", 1)
    server = socket.create_server((host, int(port)))
    conn, _ = server.accept()
    block = b"x" * (1 << 20)
    for _ in range(sizes[me - 1]):
        conn.sendall(block)
    conn.close()
    sys.exit(0)
for peer in range(1, len(workers)):
    host, port = workers[peer].rsplit(":", 1)
    for _ in range(400):
        try:
            conn = socket.create_connection((host, int(port)), timeout=10); break
        except OSError:
            time.sleep(0.05)
    got, start = 0, None
    while True:
        data = conn.recv(1 << 20)
        if not data:
            break
        got += len(data)
        if start is None and got >= (1 << 20):
            start, at = time.perf_counter(), got
    print("RATE", peer, (got - at) * 8 / (time.perf_counter() - start), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_shaped_link_carries_its_rate_and_each_task_has_its_own_address() -> None:
    statuses: list[str] = []
    result = launch.run(
        [PY, "-c", TRANSFER, "6", "60"],
        workers=3,
        simulate_hosts=3,
        links=("1gbit", "worker:1=100mbit"),
        timeout=60,
        on_status=statuses.append,
    )
    assert result.exit_code == 0, result.summary() + "\n".join(statuses)
    addresses = [t.address for t in result.cluster.tasks()]
    assert [a.rsplit(":", 1)[0] for a in addresses] == ["10.9.0.1", "10.9.0.2", "10.9.0.3"], addresses
    rates = dict(re.findall(r"^RATE (\d) (\S+)$", result.task("worker:0").output, re.M))
    measured = {int(peer): float(rate) for peer, rate in rates.items()}
    sys.stderr.write(f"measured bits/s: {measured}\n")
    for peer, rate in ((1, 100e6), (2, 1e9)):  # worker:1's own link; worker:2 and worker:0 at 1gbit
        assert 0.8 * rate <= measured[peer] <= 1.2 * rate, measured
    assert any("10.9.0.2 (worker:1; 100mbit)" in s for s in statuses), statuses
    assert_all_gone([t.pid for t in result.tasks])


def _hosts_line(output: str) -> str:
    found = re.search(r"^HOSTS (.*)$", output, re.M)
    assert found is not None, output[-3000:]
    return found[1]


# Above the longest gap between two steps before the cut (2.8 s with 3 busy loops beside the run), below the
# 8.6-9.4 s after which TensorFlow's coordination service fails the cut task's peers (no stall then).
STALL_SECONDS = 5.0


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_multi_worker_mirrored_on_simulated_hosts_and_a_cut_link_named_by_the_stall_inspector(
    tmp_path: Path,
) -> None:
    """Two workers fit on their own hosts; then worker:1's link is cut for good in a second fit, which stalls:
    the stall inspector names worker:1 (the supervisor cut it) and worker:0 waiting on it, S seconds later."""
    statuses: list[tuple[float, str]] = []
    run = testing.run_cluster(
        _tasks_hosts.mwms_fit_until_cut,
        workers=2,
        simulate_hosts=2,
        links=("1gbit",),
        partitions=("worker:1@after=^STEP 3$",),
        stall_seconds=STALL_SECONDS,
        log_dir=str(tmp_path),
        timeout=200,
        grace_seconds=1,  # the stalled tasks wait inside TensorFlow: a SIGTERM lands only when they fail
        on_status=lambda line: statuses.append((time.time(), line)),
    )
    result, text = run.result, "\n".join(line for _, line in statuses)
    values = [json.loads(_hosts_line(run.output(f"worker:{i}"))) for i in range(2)]
    assert [v["address"] for v in values] == ["10.9.0.1", "10.9.0.2"]
    assert all(v["own"] and v["others_own"] == [] for v in values), values  # each its own, no other's
    assert all(v["replicas"] == 2 for v in values)
    assert (result.reason, result.exit_code, result.failed_task) == (Outcome.STALLED, STALLED, "worker:1"), text
    assert re.search(r"^stall: worker:1 stopped: its link is cut$", text, re.M), text
    assert re.search(r"^stall: worker:0 waiting: blocked in TensorFlow", text, re.M), text
    cut = next(at for at, line in statuses if line.startswith("fault injection: worker:1's link cut (host 10.9.0.2"))
    reported = next(at for at, line in statuses if line.startswith("stall: no training task"))
    assert STALL_SECONDS - 1 <= reported - cut <= STALL_SECONDS + 3, (reported - cut, text)
    assert "stall: stopping the run (worker:1 stopped)" in text
    assert all("Thread" in (tmp_path / f"worker-{i}.stacks").read_text() for i in range(2))
    assert_all_gone([t.pid for t in result.tasks])


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_parameter_servers_on_simulated_hosts() -> None:
    run = testing.run_cluster(
        _tasks_hosts.ps_coordinator, workers=1, ps=1, chief=True, simulate_hosts=3, links=("1gbit",), timeout=200
    )
    assert run.ok, run.result.summary()
    chief = run.values["chief:0"]
    assert (chief["address"], chief["own"], chief["others_own"], chief["is_ps"]) == ("10.9.0.1", True, [], True)
    hosts = {t.name: t.address.rsplit(":", 1)[0] for t in run.result.cluster.tasks()}
    assert hosts == {"chief:0": "10.9.0.1", "worker:0": "10.9.0.2", "ps:0": "10.9.0.3"}
    assert len(chief["loss"]) == 1
    assert_all_gone([t.pid for t in run.result.tasks])


def test_hosts_and_links_are_checked_against_the_tasks() -> None:
    config = LaunchConfig(command=("python",), workers=3, simulate_hosts=2, links=("worker:1=100mbit",))
    assert config.network.hosts(config.task_names()) == [("10.9.0.1", None), ("10.9.0.2", "100mbit")]
    assert config.links == (Link(rate="100mbit", task="worker:1"),)
    for options, message in (
        ({"simulate_hosts": 4}, "at most one host per task"),
        ({"simulate_hosts": 2, "links": ("worker:0=1gbit", "worker:2=10gbit")}, "one rate for host 10.9.0.1"),
        ({"simulate_hosts": 2, "links": ("worker:7=1gbit",)}, "`links`. Received: 'worker:7=1gbit'"),
        ({"links": ("1gbit",)}, "`simulate_hosts` as well"),
        ({"simulate_hosts": 2, "links": ("1 gbit",)}, "RATE or TASK=RATE"),
        ({"simulate_hosts": 2, "links": ("1gbit", "2gbit")}, "at most one RATE for every host"),
        ({"simulate_hosts": 2, "host": "10.0.0.1"}, "the simulated hosts have addresses of their own"),
    ):
        with pytest.raises(LaunchError, match=re.escape(message)):
            LaunchConfig(command=("python",), workers=3, **options)
    # Elastic runs regroup on simulated hosts (tests/keras/test_elastic.py cuts a link under one).
    assert LaunchConfig(command=("python",), workers=3, simulate_hosts=3, min_workers=2).max_workers == 3


@pytest.mark.parametrize("rootless", [False, True])
def test_hosts_have_their_address_and_shaping_and_close_with_their_namespaces(rootless: bool) -> None:
    if not rootless and os.geteuid() != 0:
        pytest.skip("namespaces without a user namespace of their own need root")
    hosts = Hosts([("10.9.0.1", "10mbit"), ("10.9.0.2", None)], rootless=rootless)
    try:
        shown = {
            address: subprocess.run(
                hosts.at(address).enter(["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
            ).stdout
            for address in hosts.addresses
        }
        assert "tbf" in shown["10.9.0.1"] and "rate 10Mbit" in shown["10.9.0.1"], shown
        assert "tbf" not in shown["10.9.0.2"], shown
        assert hosts.at("10.9.0.2").is_local("10.9.0.2") and not hosts.at("10.9.0.2").is_local("10.9.0.1")
    finally:
        pids = [hosts.at(a).pid for a in hosts.addresses]
        hosts.close()
    assert_all_gone(pids)


def test_a_hosts_link_is_cut_and_mended_and_shaped_and_given_its_own_rate_back() -> None:
    hosts = Hosts([("10.9.0.1", "10mbit"), ("10.9.0.2", None)], rootless=True)

    def shown(address: str, *argv: str) -> str:
        namespace = hosts._switch if address == "switch" else hosts.at(address)
        return subprocess.run(namespace.enter(list(argv)), capture_output=True, text=True, check=True).stdout

    try:
        hosts.cut("10.9.0.2")
        assert "state DOWN" in shown("switch", "ip", "link", "show", "h1")  # the bridge port: nothing passes
        assert "NO-CARRIER" in shown("10.9.0.2", "ip", "link", "show", "eth0")  # the host's end sees it
        assert "state DOWN" not in shown("switch", "ip", "link", "show", "h0")
        hosts.cut("10.9.0.2", False)
        assert "NO-CARRIER" not in shown("10.9.0.2", "ip", "link", "show", "eth0")
        hosts.shape("10.9.0.2", "1mbit")  # both ends of an unshaped link, then unshaped again
        assert "rate 1Mbit" in shown("switch", "tc", "qdisc", "show", "dev", "h1")
        assert "rate 1Mbit" in shown("10.9.0.2", "tc", "qdisc", "show", "dev", "eth0")
        hosts.shape("10.9.0.2", None)
        assert "tbf" not in shown("10.9.0.2", "tc", "qdisc", "show", "dev", "eth0")
        assert "tbf" not in shown("switch", "tc", "qdisc", "show", "dev", "h1")
        hosts.shape("10.9.0.1", "2mbit")  # a shaped link, then its own rate again
        hosts.shape("10.9.0.1", None)
        assert "rate 10Mbit" in shown("10.9.0.1", "tc", "qdisc", "show", "dev", "eth0")
        assert "rate 10Mbit" in shown("switch", "tc", "qdisc", "show", "dev", "h0")
    finally:
        hosts.close()


# worker:1 (the second host) reads a dataset through the tf.data service, which runs on the first host.
READ_SERVICE = """
import json, os
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    import tensorflow as tf
    service = os.environ["TFDIST_DATA_SERVICE"]
    dataset = tf.data.Dataset.range(5).apply(tf.data.experimental.service.distribute("parallel_epochs", service))
    print("SERVICE", service, sorted(int(v) for v in dataset), flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_data_service_runs_on_the_first_host_and_serves_the_others() -> None:
    result = launch.run([PY, "-c", READ_SERVICE], workers=2, simulate_hosts=2, data_service_workers=1, timeout=150)
    assert result.exit_code == 0, result.summary()
    assert re.search(r"^SERVICE grpc://10\.9\.0\.1:\d+ \[0, 1, 2, 3, 4\]$", result.task("worker:1").output, re.M)
