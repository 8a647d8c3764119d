"""Exactly once across faults, counted: crash, preemption and 3 -> 2 -> 3 workers mid-epoch, real MWMS fits.

Every run trains 3 epochs of 480 records (global batch 24) and counts each record in a weight the backup
restores with the model (tests/support/exact_tasks.py): every count must be 3. The resumed runs' weights
equal those of SGD computed in numpy over the order's steps (what an uninterrupted fit on any number of
workers ends with; measured equal on 1, 2 and 3 workers) to float32 rounding, since a step trains on the
same records whatever the world size. Faults trigger on progress (the leader's ``STEP epoch batch`` lines).
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

import numpy as np
import pytest

from tests.support import exact_tasks
from tfdist import testing
from tfdist.launch.events import KillAt, LoseAt, ReturnAt

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]
EPOCHS = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("exact") / "part")
    exact_tasks.write_data(prefix)
    return prefix


@pytest.fixture(scope="module")
def reference(data: str) -> np.ndarray:
    """The weights an uninterrupted fit ends with, from SGD in numpy over the epoch order's steps."""
    return np.array(exact_tasks.ideal_weights(data, epochs=EPOCHS))


def _check(
    run: testing.ClusterRun, reference: np.ndarray, *, tasks: tuple[str, ...], statuses: tuple[str, ...] = ()
) -> None:
    assert run.ok, run.result.summary() + run.output("worker:0")[-3000:]
    assert set(tasks) <= set(run.values), (sorted(run.values), statuses, run.output("worker:0")[-3000:])
    for task in tasks:
        value = run.values[task]
        assert collections.Counter(value["counts"]) == {EPOCHS: exact_tasks.RECORDS}, (task, value["counts"])
        np.testing.assert_allclose(value["weights"], reference, rtol=0, atol=2e-5)


def _killed_once(data: str, tmp_path: Path, options: dict) -> testing.ClusterRun:
    """2 workers; worker 1 SIGKILLed once the leader printed batch 10 of epoch 1; one group restart.

    The restart stops worker 0 after 1 s, not the default 5: it sits in a collective with its lost peer and
    TF's preemption notifier takes the SIGTERM, so only the SIGKILL ends it."""
    return testing.run_cluster(
        exact_tasks.counted_fit,
        workers=2,
        timeout=300,
        max_restarts=1,
        grace_seconds=1,
        kills=(KillAt(task="worker:1", after="^STEP 1 10$"),),
        args=[str(tmp_path), data, options],
    )


def test_a_crash_mid_epoch_resumes_at_the_next_record(data: str, reference: np.ndarray, tmp_path: Path) -> None:
    # Finite epochs (no steps_per_epoch: tf-keras alone fails the resume with a TypeError), 'data' sharding,
    # a plain BackupAndRestore every 4 batches with ResumeInput after it; worker 1 killed at batch 10 of epoch 1.
    options = {"shard_policy": "data", "backup": "plain"}
    run = _killed_once(data, tmp_path, options)
    _check(run, reference, tasks=("worker:0", "worker:1"))
    assert run.values["worker:0"]["restart"] == 1
    # Backups after batches 3, 7, 11, ...: the kill lands at batch 10 or a little later.
    resumed = re.findall(
        r"Input resumes at epoch 1, step (\d+) \(DataPosition\(epoch=1, step=(\d+)\)\)", run.output("worker:0")
    )
    assert len(resumed) == 1 and resumed[0][0] == resumed[0][1] and int(resumed[0][0]) % 4 == 0, resumed


def test_a_stale_backup_in_a_workers_temporary_directory_is_not_restored(
    data: str, reference: np.ndarray, tmp_path: Path
) -> None:
    # A non-chief killed between a save and the removal of its temporary write directory leaves a stale backup
    # there, and TF's PreemptionCheckpointHandler restores from that directory as it is made. Planted here:
    # worker 1 copies the chief's backup of batch 3 of epoch 0 and, restarted after the kill at batch 10 of
    # epoch 1, puts it in its own temporary directory. Both workers must resume at the same step of epoch 1.
    run = _killed_once(data, tmp_path, {"stale_temp": [0, 5]})
    assert run.output("worker:1").count("STALE PLANTED") == 1, run.output("worker:1")[-3000:]
    _check(run, reference, tasks=("worker:0", "worker:1"))
    resumed = {task: re.findall(r"Input resumes at epoch (\d+), step (\d+)", run.output(task)) for task in run.values}
    assert len(resumed["worker:0"]) == 1 and resumed["worker:0"][0][0] == "1", resumed
    assert resumed["worker:1"] == resumed["worker:0"], resumed


def test_a_preemption_with_endless_input(data: str, reference: np.ndarray, tmp_path: Path) -> None:
    # num_epochs=None with steps_per_epoch; worker 1 sends itself SIGTERM at batch 9 of epoch 1: every worker
    # saves there (PreemptionSafeBackup) and the rerun goes on at batch 10.
    options = {"num_epochs": None, "steps_per_epoch": 20, "save_freq": False, "preempt": [1, 9]}
    run = testing.run_cluster(
        exact_tasks.counted_fit, workers=2, timeout=300, max_restarts=1, args=[str(tmp_path), data, options]
    )
    _check(run, reference, tasks=("worker:0", "worker:1"))
    assert run.values["worker:0"]["restart"] == 1
    # The workers agree on a step at or after the signal; one iteration holds every epoch: step 20 + batch.
    resumed = re.findall(
        r"Input resumes at epoch 1, step (\d+) \(DataPosition\(epoch=0, step=(\d+)\)\)", run.output("worker:0")
    )
    assert len(resumed) == 1 and int(resumed[0][0]) >= 10 and int(resumed[0][1]) == 20 + int(resumed[0][0]), resumed


def test_three_to_two_to_three_workers_mid_epoch(data: str, reference: np.ndarray, tmp_path: Path) -> None:
    # 12 streams (the default for a global batch of 24) serve 3 and 2 workers with the same order.
    statuses: list[str] = []
    run = testing.run_cluster(
        exact_tasks.counted_fit,
        workers=3,
        timeout=360,
        min_workers=2,
        loses=(LoseAt(task="worker:2", after="^STEP 1 10$"),),
        returns=(ReturnAt(task="worker:2", after="^STEP 1 15$"),),  # Printed by the group of 2; joins after epoch 1.
        grace_seconds=2,
        on_status=statuses.append,
        args=[str(tmp_path), data, {"save_freq": 4}],
    )
    _check(run, reference, tasks=("worker:0", "worker:1", "worker:2"), statuses=tuple(statuses))
    changes = [s.split(";")[0] for s in statuses if s.startswith("elastic: membership")]
    assert [c.split(":")[2].split("(")[0].strip() for c in changes] == ["world size 2", "world size 3"], statuses
    assert run.values["worker:0"]["world"] == 3
    joined = [s for s in statuses if s.startswith("elastic: membership 2")]
    assert len(joined) == 1 and joined[0].endswith("worker:2 joined; epoch 1 backed up"), statuses


def test_a_plain_backup_alone_replays_records_and_says_so(data: str, tmp_path: Path) -> None:
    # The control: without ResumeInput the counts are wrong (the fault really cut the epoch), and the
    # restarted task says why once, and what to use. (Endless input: with finite epochs of unknown length a
    # plain BackupAndRestore fails the resume inside tf-keras, with a TypeError.)
    options = {"backup": "unlinked", "shuffle_buffer": 0, "num_epochs": None, "steps_per_epoch": 20}
    run = _killed_once(data, tmp_path, options)
    assert run.ok, run.result.summary()
    counts = collections.Counter(run.values["worker:0"]["counts"])
    assert counts != {EPOCHS: exact_tasks.RECORDS} and sum(k * v for k, v in counts.items()) == EPOCHS * 480
    output = run.output("worker:0")
    assert output.count("A plain BackupAndRestore restores the model, not the input position") == 1, output[-3000:]


def test_stratified_draws_after_a_crash_are_those_of_the_uninterrupted_fit(tmp_path: Path) -> None:
    # class_weights='sqrt' over class groups with order='resumable', 2 workers: the crashed and resumed fit
    # trains every record as often as the fit nobody interrupted (each worker draws its own sequence).
    data = str(tmp_path / "strata" / "part")
    exact_tasks.write_data(data, labels=True)
    options = {"class_weights": "sqrt", "backup": "plain"}
    whole = testing.run_cluster(
        exact_tasks.counted_fit, workers=2, timeout=300, args=[str(tmp_path / "whole"), data, options]
    )
    assert whole.ok, whole.result.summary() + whole.output("worker:0")[-3000:]
    run = _killed_once(data, tmp_path / "crash", options)
    assert run.ok, run.result.summary() + run.output("worker:0")[-3000:]
    assert run.values["worker:0"]["restart"] == 1
    assert re.search(r"Input resumes at epoch 1, step \d+", run.output("worker:0"))
    counts = np.array(run.values["worker:0"]["counts"])
    assert counts.tolist() == whole.values["worker:0"]["counts"] == run.values["worker:1"]["counts"]
    assert counts.sum() == EPOCHS * exact_tasks.RECORDS and counts.max() > EPOCHS  # Small classes redrawn.
    assert counts[: exact_tasks.LABEL_EDGES[0]].sum() < 0.45 * counts.sum()  # Class 0 is half the data.
    np.testing.assert_allclose(run.values["worker:0"]["weights"], whole.values["worker:0"]["weights"], atol=2e-5)


def test_stratified_draws_go_on_when_three_workers_become_two(tmp_path: Path) -> None:
    # Each pipeline draws its own sequence, so 3 -> 2 cannot replay; the resume goes on in the sequences of 2
    # pipelines from the backed-up step, says so once, and keeps the mix and every step's size.
    data = str(tmp_path / "strata" / "part")
    exact_tasks.write_data(data, labels=True)
    statuses: list[str] = []
    run = testing.run_cluster(
        exact_tasks.counted_fit,
        workers=3,
        timeout=300,
        min_workers=2,
        loses=(LoseAt(task="worker:2", after="^STEP 1 10$"),),
        grace_seconds=2,
        on_status=statuses.append,
        args=[str(tmp_path / "run"), data, {"class_weights": "sqrt"}],
    )
    assert run.ok, run.result.summary() + run.output("worker:0")[-3000:]
    assert any(s.startswith("elastic: membership") and "world size 2" in s for s in statuses), statuses
    assert run.values["worker:0"]["world"] == 2
    # The chief warns and records 2 pipelines; worker 1 warns too if it read the order file before that.
    for task, least in (("worker:0", 1), ("worker:1", 0)):
        output = run.output(task)
        warned = re.findall(r"made by (\d) input pipelines drawing by class_weights, and (\d) draw now", output)
        assert least <= len(warned) <= 1 and set(warned) <= {("3", "2")}, (task, warned, output[-3000:])
    resumed = re.findall(r"Input resumes at epoch 1, step (\d+)", run.output("worker:0"))
    assert len(resumed) == 1 and 0 < int(resumed[0]) < 20, resumed  # A batch-level backup inside epoch 1.
    counts = np.array(run.values["worker:0"]["counts"])
    assert counts.tolist() == run.values["worker:1"]["counts"]
    # Every step trained 24 draws (the rolled-back steps' counts were restored with the model).
    assert counts.sum() == EPOCHS * exact_tasks.RECORDS and counts.max() > EPOCHS  # Small classes redrawn.
    assert counts[: exact_tasks.LABEL_EDGES[0]].sum() < 0.45 * counts.sum()  # Class 0 is half the data.
