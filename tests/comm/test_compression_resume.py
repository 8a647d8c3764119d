"""A killed compressed fit resumes as if never stopped: each worker's own error feedback comes back.

Two real 2-worker clusters: one uninterrupted, one where worker 0 is SIGKILLed after PowerSGD's backup of
step 5 (inside its warm-up of 9 plain steps), worker 1 after PowerSGD's backup of step 10 (right after the
warm-up: one compressed step) and worker 0 after top-k's backup of step 10 (progress lines, not times).
Each resumed fit must train the remaining steps with the uninterrupted run's losses and end with its
weights: a resume continues the warm-up where it was, and the compression from the state it had. Restoring only the
sum of the workers' errors (each getting half, as TF does for an ON_READ variable) moves top-k's losses by up
to 0.039 (it selects per worker); PowerSGD is linear in the errors, so its run checks the rest of the state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import compression_resume_tasks, exact_tasks
from tests.support.processes import assert_all_gone
from tfdist import testing

STEPS = compression_resume_tasks.STEPS


def _run(workdir: Path, prefix: str, **faults: Any) -> dict[str, dict[str, Any]]:
    workdir.mkdir()
    # A restart stops the worker a kill left after 1 s, not the default 5: it sits in a collective with its
    # lost peer and TF's preemption notifier takes the SIGTERM, so only the SIGKILL ends it.
    cluster = testing.run_cluster(
        compression_resume_tasks.compressed_resume_fit,
        workers=2,
        args=[str(workdir), prefix],
        timeout=300,
        grace_seconds=1,
        **faults,
    )
    assert_all_gone([t.pid for t in cluster.result.tasks])
    assert cluster.ok, cluster.result.summary()
    if faults:
        assert {t.restarts for t in cluster.result.tasks} == {len(faults["kills"])}, cluster.result.summary()
    return {
        f"{name} worker:{i}": json.loads((workdir / f"{name}-worker{i}.json").read_text())
        for name in compression_resume_tasks.COMPRESSORS
        for i in range(2)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("compressed-resume")
    prefix = str(root / "data")
    exact_tasks.write_data(prefix)
    assert compression_resume_tasks.WARMUP == 9  # The kills below: one inside the warm-up, one right after.
    kills = ("worker:0@after=^POWERSGD STEP 5$", "worker:1@after=^POWERSGD STEP 10$", "worker:0@after=^TOPK STEP 10$")
    return {
        "whole": _run(root / "whole", prefix),
        "killed": _run(root / "killed", prefix, kills=kills, max_restarts=len(kills)),
    }


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(compression_resume_tasks.COMPRESSORS))
def test_a_killed_compressed_fit_continues_as_the_uninterrupted_one(runs: dict[str, Any], name: str) -> None:
    whole = runs["whole"][f"{name} worker:0"]
    assert sorted(int(s) for s in whole["losses"]) == list(range(STEPS))
    assert whole["losses"][str(STEPS - 1)] < whole["losses"]["0"] / 4  # It learned: not a flat line.
    for i in range(2):
        killed = runs["killed"][f"{name} worker:{i}"]
        resumed = {int(step): loss for step, loss in killed["losses"].items()}
        # The last attempt trained from the step after its last backup (10 or later) to the end; PowerSGD's
        # second attempt resumed inside the warm-up (it wrote nothing: killed again), its third after it.
        assert killed["restart"] == (2 if name == "powersgd" else 3)
        assert 10 <= min(resumed) < STEPS - 1 and max(resumed) == STEPS - 1, sorted(resumed)
        # Same losses and weights as never stopped: weights, momentum, Q, each worker's own error and the
        # input position all came back (to float summation order; deterministic ops).
        np.testing.assert_allclose(
            [resumed[s] for s in sorted(resumed)], [whole["losses"][str(s)] for s in sorted(resumed)], rtol=1e-6
        )
        np.testing.assert_allclose(killed["weights"], whole["weights"], rtol=1e-6, atol=1e-7)
        assert runs["whole"][f"{name} worker:{i}"]["weights"] == whole["weights"]
