"""Elastic MultiWorkerMirroredStrategy training through tfdist-launch: 3 -> 2 -> 3 -> 2 -> 3 workers, real TensorFlow.

One run on simulated hosts, two ways to leave and come back: worker:2 is killed after epoch 1 and returned
by the launcher (``loses``, ``returns``); later worker:1 is cut off (``partitions``: its host's link goes
down, and comes back on a line). A cut worker is alive but unreachable: its peers fail of the coordination
service's missed heartbeats, and the launcher loses the unreachable worker, not them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import SUPPORT
from tests.support.processes import assert_all_gone
from tfdist import launch

PY = sys.executable
SCRIPT = str(SUPPORT / "elastic_keras_train.py")
RECORDS = 48  # as in the script
EPOCHS = 9
EPOCH_LINE = re.compile(r"^EPOCH (\d+) world (\S+) seen (\S+) id_sum (\S+) id_sq (\S+) kernel (.*)$", re.M)
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(900)]


def _epochs(output: str) -> list[tuple[int, float, float, float, float, np.ndarray]]:
    return [
        (int(e), float(w), float(c), float(s), float(q), np.array(k.split(), float))
        for e, w, c, s, q, k in EPOCH_LINE.findall(output)
    ]


def _final(output: str) -> np.ndarray:
    lines = [line for line in output.splitlines() if line.startswith("FINAL ")]
    assert len(lines) == 1, output[-3000:]
    return np.array(lines[0].split()[1:], float)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted one-process run's output."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [PY, SCRIPT, str(tmp_path_factory.mktemp("reference")), str(EPOCHS)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


# worker:2 is lost after epoch 1 and available again once the group of 2 recorded the boundary of epoch 2: it
# joins at the next, 3. worker:1's link is cut after epoch 4 and back once the next group of 2 recorded epoch 5's
# boundary: it joins after epoch 6. Each group of 2 redoes the epoch it interrupted.
FAULTS: dict[str, Any] = {
    "simulate_hosts": 3,
    "loses": ["worker:2@after=^EPOCH 1 "],
    "returns": ["worker:2@after=^BEGIN 3 generation 1$"],
    "partitions": ["worker:1@after=^EPOCH 4 ,until=^BEGIN 6 generation 3$"],
}
WORLDS = [3, 3, 2, 2, 3, 2, 2, 3, 3]  # each epoch's world size


def test_workers_lost_or_cut_off_leave_and_rejoin_and_the_global_batch_is_kept(tmp_path: Path, reference: str) -> None:
    epochs = EPOCHS
    statuses: list[str] = []
    result = launch.run(
        [PY, SCRIPT, str(tmp_path / "elastic"), str(epochs)],
        workers=3,
        min_workers=2,
        timeout=600,
        grace_seconds=2,
        on_status=statuses.append,
        **FAULTS,
    )
    leader = result.task("worker:0").output
    assert result.exit_code == 0, result.summary() + "\n" + "\n".join(statuses) + leader[-3000:]
    # Every membership change, logged by the launcher; a return waits for the next backed-up epoch.
    changes = [s for s in statuses if s.startswith("elastic: membership")]
    assert [c.split(";")[0] for c in changes] == [
        "elastic: membership 1: world size 2 (workers worker:0, worker:1)",
        "elastic: membership 2: world size 3 (workers worker:0, worker:1, worker:2)",
        "elastic: membership 3: world size 2 (workers worker:0, worker:2)",
        "elastic: membership 4: world size 3 (workers worker:0, worker:1, worker:2)",
    ], statuses
    assert changes[1].endswith("worker:2 joined; epoch 3 backed up"), changes[1]
    assert changes[3].endswith("worker:1 joined; epoch 6 backed up"), changes[3]
    # Every epoch completed exactly once, on the world size of its generation (an interrupted epoch was
    # redone by the smaller group), and every completed epoch trained on each of the 48 records once:
    # Keras's Sum metrics add count, sum and sum of squares of the record ids over every replica.
    seen = _epochs(leader)
    assert [e[0] for e in seen] == list(range(epochs)), leader[-3000:]
    assert [e[1] for e in seen] == WORLDS
    ids = np.arange(RECORDS)
    for epoch, _, count, id_sum, id_sq, _ in seen:
        assert (count, id_sum, id_sq) == (RECORDS, ids.sum(), (ids * ids).sum()), f"epoch {epoch}"
    # The global batch (12) is kept, so each step averages the gradient over the same 12 records as the
    # uninterrupted one-process run: the weights after every epoch and at the end agree up to float32
    # summation order in the all-reduce (a few ulps per step; 36 SGD steps on values of order 1 stay far
    # below 1e-5). A wrong batch split, a skipped or repeated record or a lost update moves them by > 1e-3.
    expected = _epochs(reference)
    assert [e[0] for e in expected] == list(range(epochs))
    for got, want in zip(seen, expected):
        np.testing.assert_allclose(got[5], want[5], rtol=1e-5, atol=1e-6, err_msg=f"epoch {got[0]}")
    np.testing.assert_allclose(_final(leader), _final(reference), rtol=1e-5, atol=1e-6)
    assert np.abs(_final(leader)).max() > 0.1, "the model did not train"
    # The cut worker is lost (not a peer), whichever side of the cut failed first: a peer, or worker:1 itself
    # (seen once in CI on a loaded machine); and it is back with its link.
    lost = [s for s in statuses if s.startswith("elastic: losing")]
    assert len(lost) == 2 and lost[0].startswith("elastic: losing worker:2 after "), lost
    assert re.match(r"elastic: losing worker:1 \(its link is cut; worker:[012] exited", lost[1]), lost
    assert any(re.match(r"elastic: worker:1 is available again \(its link is back after", s) for s in statuses)
    # TF's coordination service named the missed heartbeats: "heartbeat timeout" (2.17), "stopped sending
    # heartbeats" (2.21).
    peers = result.task("worker:0").output + result.task("worker:2").output
    assert re.search(r"heartbeat timeout|stopped sending heartbeats", peers), peers[-3000:]
    assert result.task("worker:0").restarts == 4  # one start per membership, no restart spent
    assert_all_gone([t.pid for t in result.tasks])
