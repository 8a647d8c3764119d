"""Keras 3 models get tfdist's guarantees: a preemption and a crash mid-epoch resume at the next record, counted.

One cluster run serves every check (CI time; tests/keras/_tasks_keras3_resume.py): 2 workers fit a Keras 3
model that counts each record it trains, for 3 epochs of 480 records, with ``PreemptionSafeBackup(save_freq=4,
data=pipeline)``. Worker 1 sends itself SIGTERM in epoch 0 of the first attempt (every worker saves at one step
and exits 200), and is SIGKILLed when the leader prints step 10 of epoch 1 in the second; the third attempt
finishes. Every record must then be counted 3 times, and the weights equal plain SGD computed in numpy over the
order's steps (``exact_tasks.ideal_weights``: not the code under test) and an uninterrupted one-process Keras 3
fit. The finishing attempt also checks that fit (losses, weights, validation), evaluate and predict equal one
process on 2 workers (the 3-worker checks of tests/keras/test_keras3.py), the elastic callbacks, the
communication options and gradient accumulation with Keras 3 models, and what is refused.

Every task hides tf_keras before it imports tfdist.keras (``_tasks_keras3_resume.hide_tf_keras``), as where
tf-keras is not installed (TensorFlow 2.22 has none): all of the above holds without it, and the tf-keras
names and helpers raise errors that name the install.
"""

from __future__ import annotations

import collections
import re
import signal
from typing import Any

import numpy as np
import pytest

from tests.keras import _tasks_keras3_resume as tasks
from tests.keras.test_keras3 import check_losses_and_weights, check_validation_evaluate_and_predict
from tests.support import exact_tasks
from tfdist import testing
from tfdist.launch.events import KillAt
from tfdist.runtime import exit_codes
from tfdist.runtime.versions import tf_keras_pin

KILLED = exit_codes.from_signal(signal.SIGKILL)  # The code the launcher reports for a task it SIGKILLed.

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]
EPOCHS = tasks.EPOCHS


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir, prefix = str(tmp_path_factory.mktemp("keras3-resume")), str(tmp_path_factory.mktemp("records") / "part")
    exact_tasks.write_data(prefix)
    statuses: list[str] = []
    done = testing.run_cluster(
        tasks.resumed_fit,
        workers=2,
        timeout=360,
        max_restarts=2,
        grace_seconds=2,  # The leader, held at the kill's step, is SIGKILLed after it.
        kills=(KillAt(task="worker:1", after="^STEP 1 10$"),),
        on_status=statuses.append,
        args=[workdir, prefix],
    )
    assert done.ok, done.result.summary() + done.output("worker:0")[-3000:]
    assert set(done.values) == {"worker:0", "worker:1"}, done.output("worker:0")[-3000:]
    return done, prefix, statuses


def _both(run: Any) -> list[dict[str, Any]]:
    return [run[0].values["worker:0"], run[0].values["worker:1"]]


def _check_the_launchers_statuses(statuses: list[str]) -> None:
    """The launcher's own status lines: the first attempt ended preempted (every worker saves and exits 200), the
    launcher SIGKILLed worker 1 once, when the leader printed step 10 of epoch 1, and that exit restarted the group."""
    kills = [s for s in statuses if s.startswith("fault injection: ")]
    assert len(kills) == 1 and kills[0].startswith(
        "fault injection: SIGKILL worker:1 after worker:0 printed /^STEP 1 10$/"
    )
    restarts = [s for s in statuses if re.match(r"^worker:\d exited with -?\d+; restart \d/2 of ", s)]
    assert len(restarts) == 2, statuses
    assert re.match(rf"worker:[01] exited with {exit_codes.PREEMPTED}; restart 1/2 of ", restarts[0]), restarts
    assert restarts[1].startswith(f"worker:1 exited with {KILLED}; restart 2/2 of "), restarts
    assert statuses.index(restarts[0]) < statuses.index(kills[0]) < statuses.index(restarts[1])


def test_a_preemption_and_a_crash_mid_epoch_resume_at_the_next_record(run: Any) -> None:
    done, prefix, statuses = run
    _check_the_launchers_statuses(statuses)
    ideal = np.array(exact_tasks.ideal_weights(prefix, epochs=EPOCHS))
    for value in _both(run):
        assert value["restart"] == 2  # The preemption, then the crash.
        assert collections.Counter(value["counts"]) == {EPOCHS: exact_tasks.RECORDS}, value["counts"]
        np.testing.assert_allclose(value["weights"], ideal, rtol=0, atol=2e-5)
        np.testing.assert_allclose(value["weights"], value["uninterrupted"], rtol=0, atol=1e-5)
    output = done.output("worker:0")
    resumed = re.findall(
        r"Input resumes at epoch (\d+), step (\d+) \(DataPosition\(epoch=(\d+), step=(\d+)\)\)", output
    )
    assert len(resumed) == 2, output[-3000:]
    # The preemption: worker 1 signalled after step 9 of epoch 0; every worker saved at one step after it.
    (epoch, step, data_epoch, data_step), crash = resumed[0], resumed[1]
    assert (epoch, data_epoch) == ("0", "0") and step == data_step and 10 <= int(step) <= 13, resumed
    assert "Saving before preemption is on" in output
    # The crash: SIGKILL at step 10 of epoch 1 (the leader waits there); the last backup is one of every 4 steps
    # from the step resumed (20 steps an epoch).
    assert crash[0] == crash[2] == "1" and crash[1] == crash[3] and 7 <= int(crash[1]) <= 10, resumed
    assert (20 + int(crash[1]) - int(step)) % 4 == 0, resumed


def test_losses_weights_validation_evaluate_and_predict_equal_one_process_on_2_workers(run: Any) -> None:
    for value in _both(run):
        assert value["one_process"]["replicas"] == 2
        check_losses_and_weights(value["one_process"])
        check_validation_evaluate_and_predict(value["one_process"], workers=2)
    workers = _both(run)
    assert workers[0]["one_process"]["distributed"]["weights"] == workers[1]["one_process"]["distributed"]["weights"]


def test_the_elastic_callbacks_work_with_a_keras3_model(run: Any) -> None:
    for value in _both(run):
        assert value["world_size"] == [2.0] * len(value["world_size"]) and value["world_size"]  # ElasticEpochs.
        assert value["learning_rate"] == pytest.approx([0.05, 0.05])  # LinearScaling: 0.025 x 2 / 1, not 0.01.


def test_the_communication_options_and_accumulation_work_with_a_keras3_optimizer(run: Any) -> None:
    for value in _both(run):
        results = value["communication"]
        plain = np.array(results["plain"]["weights"])
        assert results["plain"]["loss"][0] > 0 and results["plain"]["bytes"] is None
        np.testing.assert_allclose(results["packed"]["weights"], plain, rtol=0, atol=1e-6)  # Sums, re-cut.
        np.testing.assert_allclose(results["accumulated"]["weights"], plain, rtol=0, atol=1e-5)  # SGD: one batch.
        np.testing.assert_allclose(results["accumulated"]["loss"], results["plain"]["loss"], rtol=0, atol=1e-5)
        bf16, fp16 = np.array(results["bf16"]["weights"]), np.array(results["fp16"]["weights"])
        assert 0 < np.abs(bf16 - plain).max() < 1e-2  # bf16 on the wire: close, not equal.
        assert 0 < np.abs(fp16 - plain).max() < 1e-3  # fp16 (10 bits of mantissa to bf16's 7): closer.
        assert results["bf16"]["bytes"] * 2 == results["packed"]["bytes"] == 4 * (8 * 16 + 16 + 16 + 1)
        assert results["fp16"]["bytes"] == results["bf16"]["bytes"] + 4  # And its float32 range scale.
    workers = _both(run)
    for wire in ("bf16", "fp16"):
        assert workers[0]["communication"][wire]["weights"] == workers[1]["communication"][wire]["weights"], wire


def test_error_feedback_and_keras3s_own_accumulation_are_refused_with_the_fix(run: Any) -> None:
    for value in _both(run):
        refused = dict(value["communication"]["refused"])
        assert set(refused) == {"powersgd", "topk", "gradient_accumulation_steps"}
        field, text = refused.pop("gradient_accumulation_steps").split("|", 1)
        assert field == "gradient_accumulation_steps" and "gradient_accumulation_steps=2" in text, text
        assert (
            "`merge_call` called while defining a new graph" in text and "accumulate_gradients(model, steps=2)" in text
        )
        for name, message in refused.items():
            field, text = message.split("|", 1)
            assert field == "compression" and f"Received: '{name}'" in text, text
            assert "Keras 3 saves one value per optimizer variable" in text and "compression='bf16'" in text


def test_an_epoch_started_at_a_step_numbers_and_counts_its_steps_from_there(run: Any) -> None:
    for value in _both(run):
        starts = value["epoch_starts"]
        # The first epoch runs the 5 steps left (3 to 7), and the next ones all 8: an epoch of unknown length
        # is sized when its input runs out, counting the 3 steps before the start.
        assert starts["unknown_length"] == [[3, 4, 5, 6, 7], list(range(8)), list(range(8))]
        assert starts["steps_per_epoch"] == [[3, 4, 5, 6, 7], list(range(8)), list(range(8))]


def test_without_tf_keras_the_keras3_helpers_work_and_the_tf_keras_names_name_the_install(run: Any) -> None:
    install = f"pip install '{tf_keras_pin()}'"  # TensorFlow's minor.
    for value in _both(run):
        without = value["without_tf_keras"]
        assert without["tf_keras_imported"] is False  # The fit, its callbacks and the checks above imported none.
        raised = without["raised"]
        assert set(raised) == {"Sequential", "layers.Dense", "cluster_callbacks", "ThroughputLogger"}
        for name in ("Sequential", "layers.Dense", "cluster_callbacks"):
            kind, field, fix, text = raised[name]
            assert (kind, field, fix) == ("StackError", "tf_keras", install), raised[name]
            assert f"tfdist.keras.{name.split('.')[0]} needs tf-keras, which is not importable here" in text, text
            assert "No module named 'tf_keras'" in text and f"Install it: {install}." in text, text
            assert "fit_input, PreemptionSafeBackup, ElasticEpochs, LinearScaling" in text, text
        kind, field, fix, text = raised["ThroughputLogger"]  # A tf-keras callback given a Keras 3 model.
        assert (kind, field) == ("StrategyError", "model") and fix.startswith(install), raised["ThroughputLogger"]
        assert "ThroughputLogger is a tf-keras callback" in text and f"{install} (tf-keras is not importable" in text
