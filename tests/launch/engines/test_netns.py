"""isolate_network without TensorFlow: the tasks share a private loopback; the host (the launcher) reaches none.

The TensorFlow run (a real two-worker collective inside the namespace) is
tests/strategy/test_multiworker.py::IsolatedNetworkTest.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import assert_all_gone, descends_from, reaches_own_process
from tfdist import LaunchError, LaunchFailure, launch
from tfdist.launch.engines._netns import Namespace, unshare_argv

PY = sys.executable
pytestmark = pytest.mark.timeout(120)

# Each worker listens on its own TF_CONFIG port, says so, connects to the other worker, then waits to be told
# (a file) that the host has probed both and both reached their peer, so every port stays open meanwhile.
TASK = """
import json, os, socket, sys, time
spec = json.loads(os.environ["TF_CONFIG"]); me = spec["task"]["index"]
workers = spec["cluster"]["worker"]
server = socket.socket(); server.bind(("0.0.0.0", int(workers[me].rsplit(":", 1)[1]))); server.listen()
print("LISTENING", workers[me], flush=True)
host, port = workers[1 - me].rsplit(":", 1)
for _ in range(200):
    try:
        socket.create_connection((host, int(port)), timeout=1).close(); break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("peer unreachable")
print("PEER REACHED", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


@pytest.fixture(scope="module", autouse=True)
def _namespaces_work() -> None:
    try:
        unshare_argv()
    except LaunchFailure as err:
        pytest.skip(f"no private network namespace here: {err}")


def _holders() -> list[int]:
    """Namespace holders alive that this process started (``python -m tfdist.launch.tasks.netns``): another
    test session's are not this test's to count."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tfdist.launch.tasks.netns" in cmdline and descends_from(int(pid), os.getpid()):
            found.append(int(pid))
    return found


def _probe_run(tmp_path: Path, isolate: bool) -> tuple[launch.LaunchResult, dict[str, bool], list[str]]:
    statuses: list[str]
    probed, reached, statuses = {}, set(), []
    done = tmp_path / f"probed-{isolate}"

    def _on_line(task: str, line: str) -> None:
        if line.startswith("LISTENING "):  # the task listens now: try it from here, the launcher's network
            probed[task] = reaches_own_process(line.split()[1])
        reached.update([task] if line == "PEER REACHED" else [])
        if len(probed) == len(reached) == 2:
            done.touch()

    result = launch.run(
        [PY, "-c", TASK, str(done)],
        workers=2,
        timeout=60,
        isolate_network=isolate,
        on_line=_on_line,
        on_status=statuses.append,
    )
    return result, probed, statuses


def test_task_ports_are_unreachable_from_the_host_but_reach_each_other(tmp_path: Path) -> None:
    before = set(_holders())
    result, probed, statuses = _probe_run(tmp_path, isolate=True)
    assert (result.exit_code, result.reason) == (0, "ok"), result.summary() + "\n".join(statuses)
    assert probed == {"worker:0": False, "worker:1": False}  # refused outside the namespace...
    assert all("PEER REACHED" in result.task(t).output for t in probed)  # ...while they reach each other inside
    assert "network namespace: private, loopback only; task ports are unreachable from outside" in statuses
    assert not any("listen on every interface" in s for s in statuses), statuses  # Not said when untrue.
    assert_all_gone([t.pid for t in result.tasks])
    assert_all_gone(list(set(_holders()) - before))  # the namespace's holder is gone with the run


def test_the_same_probe_reaches_a_cluster_that_is_not_isolated(tmp_path: Path) -> None:
    result, probed, _ = _probe_run(tmp_path, isolate=False)  # the probe above can tell: here it connects
    assert (result.exit_code, probed) == (0, {"worker:0": True, "worker:1": True}), result.summary()


def test_ports_are_picked_inside_the_namespace() -> None:
    # Only loopback exists in there: an address of this machine's other interfaces is not one of its own.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    assert launch.run([PY, "-c", "pass"], workers=1, host=address, timeout=30).exit_code == 0
    with pytest.raises(LaunchError, match=re.escape(f"'{address}'")):  # as if it were picked here
        launch.run([PY, "-c", "pass"], workers=1, host=address, isolate_network=True, timeout=30)


@pytest.mark.parametrize("rootless", [False, True])
def test_a_namespace_holds_what_its_tasks_bind(rootless: bool) -> None:
    if not rootless and os.geteuid() != 0:
        pytest.skip("a namespace without a user namespace of its own needs root")
    namespace = Namespace(rootless=rootless)
    try:
        port = namespace.pick(1, "127.0.0.1")[0]
        serve = (
            "import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); "
            "print('up', flush=True); sys.stdin.read()"
        )
        task = subprocess.Popen(
            namespace.enter([PY, "-c", serve, str(port)]), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert task.stdout is not None and task.stdout.readline() == "up\n"
            assert not namespace.is_free("127.0.0.1", port)  # taken in there...
            assert not reaches_own_process(f"127.0.0.1:{port}")  # ...and not reachable from here
        finally:
            task.communicate("")
        assert task.returncode == 0
        assert namespace.is_local("127.0.0.1") and not namespace.is_local("192.0.2.1")
    finally:
        namespace.close()
    with pytest.raises(LaunchFailure, match="holder process ended"):
        namespace.enter([PY, "-c", "pass"])
