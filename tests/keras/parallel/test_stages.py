"""Pipeline stages: two worker tasks hold the layers, the chief drives fit with M micro-batches.

One cluster run (a chief and 2 workers serving their devices) trains 40 steps for M = 1 and M = 4, each
followed by the same steps with plain tf-keras in the chief alone, from the same initial weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.support import pipeline_tasks
from tests.support.processes import assert_all_gone
from tfdist import keras as tk
from tfdist import testing
from tfdist.errors import StrategyError
from tfdist.parallel import connect_stages, split_layers

STEPS = 40


@pytest.fixture(scope="module")
def trained() -> dict[str, Any]:
    run = testing.run_cluster(
        pipeline_tasks.pipeline_fit, workers=2, chief=True, run_on="chief", args=[STEPS, [1, 4]], timeout=300
    )
    assert_all_gone([t.pid for t in run.result.tasks])
    assert run.ok, run.result.summary()
    return run.values["chief:0"]


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("micro_batches", [1, 4])
def test_two_stages_train_like_one_process(trained: dict[str, Any], micro_batches: int) -> None:
    run = trained[str(micro_batches)]
    assert run["devices"] == trained["stages"] == [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    # Balanced by parameters: 1,088 + 4,160 values on stage 0, 4,160 + 65 on stage 1.
    assert run["stage_of"] == {"pp_a": 0, "pp_b": 0, "pp_c": 1, "pp_out": 1}
    assert len(run["losses"]) == STEPS and run["losses"][-1] < run["losses"][0] / 5
    np.testing.assert_allclose(run["losses"], run["reference"], atol=1e-5, rtol=0)
    assert run["weights_diff"] < 1e-5


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_an_embedding_stage_trains_like_one_process(trained: dict[str, Any]) -> None:
    # The embedding's gradient is sparse; made dense across the stage boundary, the update is Adam's.
    run = trained["embedding"]
    stage_of = run["stage_of"]  # Flatten holds nothing: either side of the cut is as balanced.
    assert (stage_of["pe_embed"], stage_of["pe_hidden"], stage_of["pe_out"]) == (0, 1, 1)
    assert run["losses"][-1] < run["losses"][0] / 5
    np.testing.assert_allclose(run["losses"], run["reference"], atol=1e-5, rtol=0)
    assert run["weights_diff"] < 1e-5


def test_layers_are_split_into_balanced_consecutive_stages() -> None:
    assert split_layers([1, 1, 1, 1, 1, 1], stages=3) == [[0, 1], [2, 3], [4, 5]]
    assert split_layers([9, 1, 1, 1, 9], stages=2) == [[0, 1], [2, 3, 4]]
    assert split_layers([0, 5, 0, 5], stages=2) in ([[0, 1], [2, 3]], [[0, 1, 2], [3]])
    with pytest.raises(StrategyError, match="at most the number of layers"):
        split_layers([1, 2], stages=3)
    with pytest.raises(StrategyError, match="`costs`"):
        split_layers([1, -1], stages=1)


def test_what_cannot_be_a_pipeline_is_refused() -> None:
    with pytest.raises(StrategyError, match="`cluster`.*--run-on chief"):
        connect_stages(None)
    devices = ["/cpu:0", "/cpu:0"]
    with pytest.raises(StrategyError, match="`micro_batches`"):
        tk.stage_model(pipeline_tasks.make_layers, devices, input_shape=(3,), micro_batches=0)
    with pytest.raises(StrategyError, match="one cost per layer \\(4 layers\\)"):
        tk.stage_model(pipeline_tasks.make_layers, devices, input_shape=(3,), costs=[1.0])
    with pytest.raises(StrategyError, match="not `make_layers\\(\\)`"):
        tk.stage_model(pipeline_tasks.make_layers(), devices, input_shape=(3,))
    assert tk.pipeline_model is tk.stage_model  # The technique's name for it.


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_a_killed_stage_resumes_from_the_backup(tmp_path: Any) -> None:
    # Worker 1 (stage 2) is SIGKILLed once the chief printed step 20's line; the group restarts, the chief
    # reconnects, BackupAndRestore brings back the weights (on the workers) and Adam's slots.
    run = testing.run_cluster(
        pipeline_tasks.pipeline_backup_fit,
        workers=2,
        chief=True,
        run_on="chief",
        args=[STEPS, str(tmp_path), 4],
        timeout=300,
        kills=("worker:1@after=^PIPE STEP 20$",),
        max_restarts=1,
    )
    assert_all_gone([t.pid for t in run.result.tasks])
    assert run.ok, run.result.summary()
    assert [t.restarts for t in run.result.tasks] == [1, 1, 1]
    values = run.values["chief:0"]
    resumed = {int(step): loss for step, loss in values["losses"].items()}
    assert values["restart"] == 1 and 20 <= min(resumed) < STEPS - 1 and max(resumed) == STEPS - 1, sorted(resumed)
    reference = pipeline_tasks.reference_losses(STEPS, str(tmp_path))
    np.testing.assert_allclose(
        [resumed[s] for s in sorted(resumed)], [reference[s] for s in sorted(resumed)], atol=1e-5, rtol=0
    )
