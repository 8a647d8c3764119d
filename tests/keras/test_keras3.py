"""Keras 3's fit, evaluate and predict on 3 real workers equal a one-process run; what is refused says why.

One cluster run serves every check (CI time): each worker trains the same Keras 3 model alone and under
MultiWorkerMirroredStrategy (tests/keras/_tasks_keras3.py), on the same global batches of 24 (8 + 8 + 8).
3 workers here; 2 in the tutorial's run below and in tests/keras/test_keras3_resume.py, which checks the same
numbers with :func:`check_losses_and_weights` and :func:`check_validation_evaluate_and_predict`; and
MirroredStrategy over 2 logical CPUs of one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.keras import _tasks_keras3 as tasks
from tfdist import testing

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]
EPOCHS = 2
TOLERANCE = 1e-5
WORKERS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.support import exact_tasks

    root, prefix = str(tmp_path_factory.mktemp("keras3")), str(tmp_path_factory.mktemp("records") / "part")
    exact_tasks.write_data(prefix)
    done = testing.run_cluster(tasks.mwms_equals_one_process, workers=WORKERS, timeout=240, args=[root, EPOCHS, prefix])
    assert done.ok, done.result.summary()
    return done


def _all(run: Any) -> list[dict[str, Any]]:
    assert set(run.values) == {f"worker:{i}" for i in range(WORKERS)}
    return [run.values[f"worker:{i}"] for i in range(WORKERS)]


def check_losses_and_weights(value: dict[str, Any]) -> None:
    """``trained_both_ways``'s runs (tests/keras/_tasks_keras3.py): per-step losses and weights equal, to 1e-5."""
    reference, distributed = value["reference"], value["distributed"]
    assert len(distributed["losses"]) == len(reference["losses"]) == 8 * EPOCHS
    np.testing.assert_allclose(distributed["losses"], reference["losses"], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(distributed["weights"], reference["weights"], rtol=0, atol=TOLERANCE)
    assert reference["losses"][-1] < reference["losses"][0]  # It trained.


def check_validation_evaluate_and_predict(value: dict[str, Any], workers: int) -> None:
    """``trained_both_ways``'s runs: the validation loss and metric, evaluate and predict equal, to 1e-5."""
    reference, distributed = value["reference"], value["distributed"]
    assert set(distributed["history"]) == {"loss", "mae", "val_loss", "val_mae"}
    for key, values in reference["history"].items():
        np.testing.assert_allclose(distributed["history"][key], values, rtol=0, atol=TOLERANCE, err_msg=key)
    assert set(distributed["evaluate"]) == set(reference["evaluate"]) == {"loss", "mae"}
    for key, number in reference["evaluate"].items():
        assert abs(distributed["evaluate"][key] - number) <= TOLERANCE, key
    assert len(distributed["predict"]) == 2 * tasks.PER_WORKER * workers  # Every record once, in order.
    np.testing.assert_allclose(distributed["predict"], reference["predict"], rtol=0, atol=TOLERANCE)


def test_per_step_losses_and_weights_equal_one_process(run: Any) -> None:
    for value in _all(run):
        assert value["replicas"] == WORKERS
        check_losses_and_weights(value)
    workers = _all(run)
    for other in workers[1:]:
        assert other["distributed"]["weights"] == workers[0]["distributed"]["weights"]  # Bitwise.


def test_validation_evaluate_and_predict_equal_one_process(run: Any) -> None:
    for value in _all(run):
        check_validation_evaluate_and_predict(value, WORKERS)


def test_fit_input_of_a_pipeline_trains_every_record_once_per_epoch_as_one_process(run: Any) -> None:
    for value in _all(run):
        trained = value["pipeline"]
        assert trained["counts"] == [float(EPOCHS)]  # Every one of the 480 records, once per epoch.
        np.testing.assert_allclose(trained["distributed"], trained["reference"], rtol=0, atol=TOLERANCE)
        assert trained["reference"] != [0.0] * 5  # It trained.


def test_the_chief_writes_the_callbacks_files_and_every_worker_resumes_from_its_backup(run: Any) -> None:
    for value in _all(run):
        resumed = value["resumed"]
        assert resumed["epochs_seen"] == list(range(1, EPOCHS))  # Epoch 0 restored from the backup.
        reference = value["reference"]["weights"]
        np.testing.assert_allclose(resumed["weights"], reference, rtol=0, atol=TOLERANCE)
    assert not run.values["worker:0"]["resumed"]["backup_left"]  # The chief deleted it at the end of its fit.
    files = run.values["worker:0"]["resumed"]["files_after_first"]
    assert [f for f in files if not f.startswith("tb/")] == [
        "backup/latest.weights.h5",
        "backup/training_metadata.json",
        "ckpt/epoch1.keras",
    ]
    assert len([f for f in files if f.startswith("tb/train/events.out.tfevents.")]) == 1  # One writer: the chief.
    # Who wrote what (each worker's model.save and save_weights, recorded): the chief's checkpoint and backup
    # files by the chief alone, once; every other worker saved too (a save may read variables through a
    # collective), outside the run's directory (into tfdist's scratch directory, removed after fit).
    writes = {task: value["resumed"]["writes"] for task, value in run.values.items()}
    for path in ("backup/latest.weights.h5", "ckpt/epoch1.keras"):
        assert [task for task, wrote in sorted(writes.items()) if path in wrote] == ["worker:0"], writes
    assert sorted(writes["worker:0"]) == ["backup/latest.weights.h5", "ckpt/epoch1.keras"], writes
    for task in (f"worker:{i}" for i in range(1, WORKERS)):
        assert sorted(writes[task]) == ["aside:epoch1.keras", "aside:latest.weights.h5"], writes


def test_several_steps_per_execution_and_batch_backups_are_refused_with_the_reason(run: Any) -> None:
    for value in _all(run):
        refused = value["refused"]
        assert set(refused) == {"steps_per_execution", "save_freq"}
        steps = refused["steps_per_execution"]
        assert f"Keras 3 (keras {value['keras']}) cannot fit under MultiWorkerMirroredStrategy" in steps
        assert "steps_per_execution=2" in steps and "steps_per_execution=1" in steps  # The value and the fix.
        assert "save_freq=4" in refused["save_freq"] and "would train twice" in refused["save_freq"]


MIRRORED = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tfdist
strategy = tfdist.build_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
import keras
from tests.keras._tasks_keras3 import trained_both_ways
sys.stdout.write("RESULT " + json.dumps(trained_both_ways(keras, strategy, int(sys.argv[1]))[0]) + "\\n")
"""


def test_under_mirrored_strategy_fit_evaluate_and_predict_equal_one_process() -> None:
    """One process, MirroredStrategy over 2 logical CPUs: each global batch of 8 split 4 + 4."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    done = subprocess.run(
        [sys.executable, "-c", MIRRORED, str(EPOCHS)],
        cwd=Path(__file__).parents[2],
        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    value = json.loads(line.split(" ", 1)[1])
    assert value["replicas"] == 2
    check_losses_and_weights(value)
    check_validation_evaluate_and_predict(value, workers=1)


def test_tensorflows_multi_worker_tutorial_for_keras3_runs_unchanged_under_tfdist_launch(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    script = str(Path(__file__).parents[1] / "support" / "tutorial_mwms_keras3.py")
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", "--workers", "2", "--timeout", "180", "--log-dir", str(tmp_path)]
        + ["--", sys.executable, script],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    assert sorted(r["task"]["index"] for r in results) == [0, 1]
    assert {r["replicas"] for r in results} == {2}
    assert all(r["keras"].startswith("3.") for r in results), results  # Keras 3 ran it, not tf-keras.
    assert results[0]["weights_sha1"] == results[1]["weights_sha1"]  # The workers agree, bitwise.
    assert results[0]["loss"] == results[1]["loss"] and results[0]["loss"][1] < results[0]["loss"][0]
