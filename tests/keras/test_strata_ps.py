"""Stratified draws under parameter servers, counted: a chief, 2 workers and a ps, real ParameterServerStrategy fits.

The data: 480 records in 4 class groups of 240, 120, 80 and 40 (``partition_by="label"``). Every fit
reads ``fit_input(pipeline)`` with ``class_weights`` and ``num_epochs=None``: global step ``g`` trains
the draws of step ``g`` of one stream of draws, whichever worker claims it. The model counts each record
it trains on in a SUM-aggregated weight on the ps; after ``E`` fit epochs of ``S`` steps the counts must
equal those of one process reading the same pipeline for ``E*S`` batches, and those of the same draws
made in NumPy (tests/keras/_tasks_strata_ps.py). One cluster runs every weighting, one fit after the other.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

import pytest

from tests.keras import _tasks_strata_ps as tasks
from tests.support import exact_tasks
from tfdist import testing
from tfdist.launch.events import KillAt

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
DATA_STEPS = exact_tasks.RECORDS // exact_tasks.GLOBAL_BATCH  # 20 steps of 24 draws per data epoch


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("strata-ps") / "part")
    exact_tasks.write_data(prefix, labels=True)
    return prefix


def _run(data: str, tmp_path: Path, options: dict, **faults: Any) -> testing.ClusterRun:
    return testing.run_cluster(
        tasks.stratified_ps_fits,
        workers=2,
        ps=1,
        chief=True,
        timeout=500,
        args=[str(tmp_path), data, options],
        **faults,
    )


def _steps_by_worker(run: testing.ClusterRun, tag: str) -> dict[str, int]:
    return {t: len(re.findall(rf"^STEP {tag} \d+$", run.output(t), re.M)) for t in ("worker:0", "worker:1")}


def test_every_weighting_trains_the_draws_of_one_stream_whichever_worker_claims_each_step(
    data: str, tmp_path: Path
) -> None:
    # Fit epochs of 15 steps cut the data epochs of 20: 45 steps are 2.25 data epochs of draws.
    tags: list[tuple[str, int, int]] = [
        ("natural", 2, DATA_STEPS),
        ("sqrt", 3, 15),
        ("balanced", 3, 15),
        ("dict", 3, 15),
    ]
    run = _run(data, tmp_path, {"tags": tags})
    assert run.ok, run.result.summary() + run.output("chief:0")[-3000:]
    values = run.values["chief:0"]
    chief = run.output("chief:0")
    took = collections.Counter[str]()
    for tag, epochs, steps in tags:
        value = values[tag]
        assert value["claimed"] == value["iterations"] == epochs * steps, (tag, value["claimed"])
        assert sum(value["counts"]) == epochs * steps * exact_tasks.GLOBAL_BATCH, tag
        # The reference: one process reading the same pipeline for epochs * steps batches.
        assert value["counts"] == value["one_process"], tag
        ran = _steps_by_worker(run, tag)
        assert sum(ran.values()) == epochs * steps, (tag, ran)
        took.update(ran)
        if tag == "natural":  # The plain claimed order: each record once per data epoch.
            assert collections.Counter(value["counts"]) == {epochs: exact_tasks.RECORDS}
            continue
        assert value["counts"] == value["numpy"], tag  # The same draws made without the pipeline.
        taken = collections.Counter(exact_tasks.label_of(i) for i, n in enumerate(value["counts"]) for _ in range(n))
        if tag == "balanced":  # The mix holds: a quarter of 1080 draws each, give or take.
            assert all(200 <= n <= 340 for n in taken.values()), taken
    # Both workers took steps, and the draws were one stream's all the same. Which worker takes a step is the
    # coordinator's choice: on a busy machine one worker took all 45 steps of a fit once, so it is counted
    # over the four fits, not in each.
    assert all(took[worker] > 0 for worker in ("worker:0", "worker:1")), took
    # Before: every worker read the whole data and drew the same batches.
    assert "Every worker reads the whole data" not in chief
    assert "claimed stratified draws over 4 class groups" in chief
    assert "480 draws per data epoch, 20 steps of 24" in chief


def test_a_chief_crash_resumes_the_draws_at_the_restored_step(data: str, tmp_path: Path) -> None:
    # Each fit backs up at its epoch ends (steps 15, 30); the chief is killed after step 35 of the sqrt fit
    # and the job restarts from the backup at step 30. The dict fit after it runs on the restarted cluster.
    tags: list[tuple[str, int, int]] = [("sqrt", 3, 15), ("dict", 2, 15)]
    kill = KillAt(task="chief:0", after="^STEP sqrt 35$")
    run = _run(data, tmp_path, {"tags": tags, "backup": True}, max_restarts=1, kills=(kill,))
    assert run.ok, run.result.summary() + run.output("chief:0")[-3000:]
    values = run.values["chief:0"]
    assert values["sqrt"]["restart"] == 1
    for tag, epochs, steps in tags:
        value = values[tag]
        # The restarted workers start counting each class's draws where the restore set them (step 30).
        assert value["counts"] == value["one_process"] == value["numpy"], tag
        assert value["claimed"] == epochs * steps, (tag, value["claimed"])
    chief = run.output("chief:0")
    assert "Input resumes at epoch 2, step 0 (claimed steps from 30)." in chief
