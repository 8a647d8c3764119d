"""run_function and command_for: functions by reference or by value, their arguments and return values."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.support import cluster_tasks
from tfdist.errors import LaunchError
from tfdist.launch import functions, run_function

pytestmark = pytest.mark.timeout(120)


def test_a_module_function_goes_by_reference_and_others_by_value() -> None:
    argv = functions.command_for(cluster_tasks.ready_then_fit, [3.0])
    assert argv[3:5] == ["--file", cluster_tasks.__file__] and argv[5:] == ["ready_then_fit", "[3.0]"]
    assert functions.command_for("json:dumps", [1])[3:] == ["--module", "json", "dumps", "[1]"]

    def nested(x: int) -> int:
        return x + 1

    for target in (nested, lambda x: x):
        argv = functions.command_for(target, [1])
        assert argv[3] == "--pickled" and argv[4] in ("cloudpickle", "pyspark.cloudpickle", "ray.cloudpickle")
    assert functions.command_for(["python", "t.py"]) == ["python", "t.py"]


def test_bad_targets_and_arguments_are_launch_errors() -> None:
    with pytest.raises(LaunchError, match="`target`"):
        functions.command_for("no_function_here")
    with pytest.raises(LaunchError, match="`target`"):
        functions.command_for(42)  # type: ignore[arg-type]
    with pytest.raises(LaunchError, match="`args`.*JSON"):
        functions.command_for(cluster_tasks.ready_then_fit, [object()])
    big = bytes(200 * 1024)

    def captures_too_much() -> int:
        return len(big)

    with pytest.raises(LaunchError, match=r"at most 90 KiB \(this one: 200 KiB"):
        functions.command_for(captures_too_much)


@pytest.mark.multiprocess
def test_a_closure_runs_by_value_in_every_task_and_returns_json() -> None:
    offset = 40

    def train(scale: int) -> dict[str, Any]:
        import os

        spec = json.loads(os.environ["TF_CONFIG"])
        return {"value": scale * offset, "task": os.environ["TFDIST_TASK"], "workers": len(spec["cluster"]["worker"])}

    run = run_function(train, args=(2,), workers=2, chief=True, timeout=60)
    assert run.ok, run.result.summary()
    assert run.values == {
        task: {"value": 80, "task": task, "workers": 2} for task in ("chief:0", "worker:0", "worker:1")
    }
    failing = run_function(lambda: sys.exit(3), workers=1, timeout=60)
    assert not failing.ok and failing.result.exit_code == 3 and failing.values == {}
