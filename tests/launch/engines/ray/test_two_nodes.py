"""Elastic training on the Ray engine, on a real two-node Ray on this machine.

tests/support/ray_two_nodes.py runs the cluster and the scenarios inside a private network namespace that has
only loopback (a multi-node Ray binds every interface): the head holds two 1-CPU workers on 127.0.0.1, a
second raylet on 127.0.0.2 the third. Stopping that raylet is a node that leaves; starting it again is a
node that joins. One scenario uses a TensorFlow-free trainer (--lose/--return); the other runs a real MWMS
fit through a node that leaves and joins.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.support import SUPPORT, exact_tasks

pytest.importorskip("ray", reason='Ray is not installed; pip install ".[ray]"')

from tests.support.processes import assert_all_gone
from tfdist.errors import LaunchFailure
from tfdist.launch.engines._netns import unshare_argv

pytestmark = [pytest.mark.ray, pytest.mark.multiprocess, pytest.mark.timeout(1200)]
SCENARIOS = SUPPORT / "ray_two_nodes.py"
EXTRA_HOST = "127.0.0.2"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both scenarios on one two-node cluster (Ray costs seconds and a GB per start)."""
    try:
        unshare = unshare_argv()
    except LaunchFailure as err:
        pytest.skip(f"no private network namespace here: {err}")
    work = tmp_path_factory.mktemp("ray-two-nodes")
    exact_tasks.write_data(str(work / "keras" / "data" / "part"))  # The real fit's records, counted.
    done = subprocess.run(
        [*unshare, sys.executable, str(SCENARIOS), str(work)],
        capture_output=True,
        text=True,
        timeout=1100,  # Bounds: both scenarios (200 s and 600 s), the joins (180 s each), the head.
        start_new_session=True,
    )
    found = [line for line in done.stdout.splitlines() if line.startswith("RESULT_JSON ")]
    assert done.returncode == 0 and found, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads(found[-1][len("RESULT_JSON ") :])
    assert report["ray_pids"], "no Ray process was seen"
    assert_all_gone(report["ray_pids"], within=15)  # every raylet, GCS and worker of both nodes
    return report


def _report(run: dict[str, Any]) -> str:
    return run["summary"] + "\n" + "\n".join(run["statuses"])


def test_lose_and_return_fault_injection_on_ray(runs: dict[str, Any]) -> None:
    """--lose/--return work on Ray as on the local engine: 3 -> 2 -> 3 at an epoch boundary."""
    run = runs["inject"]
    assert run["exit_code"] == 0, _report(run)
    changes = [s for s in run["statuses"] if s.startswith("elastic: membership")]
    assert len(changes) == 2, _report(run)
    assert changes[0].startswith("elastic: membership 1: world size 2 (workers worker:0, worker:1); worker:2 lost")
    assert re.match(
        r"elastic: membership 2: world size 3 \(workers worker:0, worker:1, worker:2\); worker:2 "
        r"joined; epoch \d+ backed up",
        changes[1],
    ), changes[1]
    worker2 = run["outputs"]["worker:2"]
    assert "generation 2 world 3 workers 3" in worker2 and "task worker:2 done" in worker2
    ended = [int(m) for m in re.findall(r"^epoch (\d+) end$", run["outputs"]["worker:0"], re.M)]
    assert sorted(set(ended)) == list(range(7)), ended  # every epoch completed, the interrupted one redone


def test_real_mwms_fit_goes_on_without_the_node_and_grows_back_when_it_joins(runs: dict[str, Any]) -> None:
    """3 -> 2 -> 3 workers of a real MultiWorkerMirroredStrategy fit, driven by a raylet that stops and starts."""
    run = runs["keras"]
    report = _report(run)
    assert run["exit_code"] == 0, report + "\n".join(o[-1500:] for o in run["outputs"].values())
    expired = [line for o in run["outputs"].values() for line in o.splitlines() if line.startswith("HOLD EXPIRED")]
    assert not expired, f"the node did not join within 300 s of its cue: {expired}\n{report}"
    assert run["events"] == ["leave", "join"], report
    # The head holds two 1-CPU workers, the extra node the third: the one that is lost, and placed there again.
    moved = [task for task, address in run["cluster"].items() if address.startswith(EXTRA_HOST + ":")]
    assert len(moved) == 1, run["cluster"]
    lost = moved[0]
    assert any(s.startswith(f"elastic: losing {lost} (its node left the cluster)") for s in run["statuses"]), report
    assert not any(re.search(r"restart \d+/", s) for s in run["statuses"]), report  # no restart spent on it
    assert re.search(
        rf"{lost} is available again \(the engine placed it again, at {re.escape(EXTRA_HOST)}:\d+\)", report
    ), report
    changes = [s for s in run["statuses"] if s.startswith("elastic: membership")]
    assert len(changes) == 2 and f"{lost} lost" in changes[0], report
    assert [c.split(" (")[0] for c in changes] == [
        "elastic: membership 1: world size 2",
        "elastic: membership 2: world size 3",
    ], report
    assert re.match(rf"elastic: membership 2: world size 3 .*; {lost} joined; epoch \d+ backed up", changes[1])
    # Every epoch completed once, on its generation's world size: the node left after epoch 0 and the
    # worker joined at the first boundary after its return (epoch 1's: membership 1 held in its epoch-end
    # callback, and ElasticEpochs records a boundary only once every callback of the epoch has run).
    epochs = sorted(
        (int(e), float(w))
        for output in run["outputs"].values()
        for e, w in re.findall(r"^EPOCH (\d+) world ([\d.]+) generation \d+$", output, re.M)
    )
    assert epochs == [(0, 3), (1, 2), (2, 3), (3, 3), (4, 3), (5, 3)], (epochs, report)
    assert all("DONE generation 2 " in output for output in run["outputs"].values()), report
    # Exactly once through 3 -> 2 -> 3 workers: every one of the 480 records trained 6 times in 6 epochs, as
    # counted in a weight the backups restore with the model (a generation's unfinished epoch rolled back).
    done = [re.findall(r"^DONE generation 2 .* counts (\{.*\})$", output, re.M) for output in run["outputs"].values()]
    assert [found[-1] if found else None for found in done] == [f"{{6: {exact_tasks.RECORDS}}}"] * 3, (done, report)
    assert not runs["ray_initialized_after"] and runs["cluster_up_after"]  # The launcher left Ray as it found it.
