"""The stall inspector: its decision (no processes), a whole run of tasks that fake TensorFlow's frames (no
TensorFlow), and real MultiWorkerMirroredStrategy runs where worker:1 stops inside its training loop. A cut link
is named in the MultiWorkerMirroredStrategy run on simulated hosts (tests/launch/engines/test_hosts.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from pathlib import Path

import pytest

from tests.launch.supervisor import _tasks_stall
from tests.support import fake_tf_steps
from tests.support.processes import assert_all_gone
from tfdist import LaunchError, launch, testing
from tfdist.launch import Engine, LaunchConfig, Outcome
from tfdist.launch.supervisor._stall import UNRESPONSIVE_SECONDS, Observation, Verdict, decide
from tfdist.runtime import STALLED
from tfdist.runtime.watchdog import StepReport, Where

pytestmark = pytest.mark.timeout(120)
S = 10.0


def _seen(where: Where, steps: int = 5, *, fresh: float | None = S) -> Observation:
    """A task whose last step was at 0 s, reporting since (last at ``fresh``; None: not since)."""
    report = StepReport(
        task="t", attempt=0, pid=1, seq=1, steps=steps, where=where, detail="train.py:7 in step", seconds=11.0,
        dump_signal=None,
    )  # fmt: skip
    seen = Observation().observe(report, now=0.0)
    return seen if fresh is None else seen.observe(dataclasses.replace(report, seq=2), now=fresh)


def dataclass_replace(report: StepReport | None, **changes: object) -> StepReport:
    assert report is not None
    return dataclasses.replace(report, **changes)  # type: ignore[arg-type]


def test_no_stall_while_some_task_completes_steps() -> None:
    waiting, sleeping = _seen(Where.TENSORFLOW), _seen(Where.PY_FUNCTION)
    assert decide({"worker:0": waiting, "worker:1": sleeping}, now=S - 0.1, seconds=S) is None
    newer = sleeping.observe(dataclass_replace(sleeping.report, seq=3, steps=6), now=5.0)  # a step at 5 s
    assert decide({"worker:0": waiting, "worker:1": newer}, now=S + 1, seconds=S) is None
    assert decide({"worker:0": waiting, "worker:1": newer}, now=S + 5, seconds=S) is not None


def test_the_task_running_python_stopped_and_the_tasks_in_tensorflow_wait_on_it() -> None:
    tasks = {
        "chief:0": _seen(Where.TENSORFLOW),
        "worker:0": _seen(Where.TENSORFLOW),
        "worker:1": _seen(Where.PY_FUNCTION),
        "worker:2": _seen(Where.PYTHON),
    }
    stall = decide(tasks, now=S + 2, seconds=S)
    assert stall is not None and round(stall.idle_seconds) == S + 2
    assert (stall.stopped, stall.waiting) == (("worker:1", "worker:2"), ("chief:0", "worker:0"))
    assert "runs Python in a tf.py_function of its step for 11s, at train.py:7 in step" in stall.why("worker:1")
    assert "runs Python outside TensorFlow" in stall.why("worker:2")
    lines = stall.lines(S)
    assert lines[0] == "stall: no training task completed a step for 12s (--stall-seconds 10)"
    assert "stall: worker:0 waiting: blocked in TensorFlow for 11s" in lines[2]


def test_a_silent_watchdog_and_the_supervisors_evidence_name_a_task_stopped() -> None:
    now = S + UNRESPONSIVE_SECONDS
    quiet = {"worker:0": _seen(Where.TENSORFLOW, fresh=now), "worker:1": _seen(Where.TENSORFLOW, fresh=None)}
    stall = decide(quiet, now=now, seconds=S)
    assert stall is not None and stall.stopped == ("worker:1",) and "has not reported for" in stall.why("worker:1")
    cut = decide(quiet, now=now, seconds=S, evidence={"worker:0": "its link is cut"})
    assert cut is not None and cut.stopped == ("worker:0", "worker:1") and cut.why("worker:0") == "its link is cut"


def test_every_task_waiting_in_tensorflow_is_a_stall_with_nobody_named() -> None:
    stall = decide({"worker:0": _seen(Where.TENSORFLOW), "worker:1": _seen(Where.TENSORFLOW)}, now=S, seconds=S)
    assert stall is not None and stall.stopped == () and stall.waiting == ("worker:0", "worker:1")
    assert "no task runs Python" in stall.lines(S)[-1]


def test_python_everywhere_or_no_step_yet_is_not_a_stall() -> None:
    everyone_in_python = {"worker:0": _seen(Where.PYTHON), "worker:1": _seen(Where.PYTHON)}
    assert decide(everyone_in_python, now=S + 2, seconds=S) is None  # nobody waits on anybody
    starting = {"worker:0": _seen(Where.PYTHON, steps=0), "worker:1": Observation()}
    assert decide(starting, now=100.0, seconds=S) is None  # not armed: nobody was seen inside a step
    unwatched = {"worker:0": _seen(Where.TENSORFLOW), "worker:1": Observation()}
    stall = decide(unwatched, now=S, seconds=S)
    assert stall is not None and [t.verdict for t in stall.tasks] == [Verdict.WAITING, Verdict.UNWATCHED]


def test_stall_seconds_is_checked_and_acts_on_collective_runs_of_the_local_engine() -> None:
    with pytest.raises(LaunchError, match="`stall_seconds`. Received: 0.5. Expected a number >= 1"):
        LaunchConfig(command=("python",), workers=2, stall_seconds=0.5)
    with pytest.raises(LaunchError, match="None with `ps`"):
        LaunchConfig(command=("python",), workers=1, ps=1, chief=True, stall_seconds=60)

    class Elsewhere(Engine):
        name = "elsewhere"
        place = reserve_address = start = None  # type: ignore[assignment]  # never called: refused first

    with pytest.raises(LaunchError, match="None on the elsewhere engine"):
        launch.run_config(LaunchConfig(command=(sys.executable,), workers=1, stall_seconds=60), engine=Elsewhere())


def _stuck_at(output: str) -> float:
    return float(re.search(r"^STUCK \S+ (\S+)$", output, re.M).group(1))  # type: ignore[union-attr]


def test_a_run_whose_worker_sleeps_in_a_py_function_stalls_naming_it(tmp_path: Path) -> None:
    """Tasks that fake TensorFlow's frames (no TensorFlow): the whole path, from the watchdogs to the outcome."""
    statuses: list[tuple[float, str]] = []
    seconds = 3.0
    result = launch.run(
        [sys.executable, fake_tf_steps.__file__, "5", "worker:1=py_function"],
        workers=2,
        stall_seconds=seconds,
        log_dir=str(tmp_path),
        timeout=60,
        on_status=lambda line: statuses.append((time.time(), line)),
    )
    text = "\n".join(line for _, line in statuses)
    assert (result.reason, result.exit_code, result.failed_task) == (Outcome.STALLED, STALLED, "worker:1"), text
    assert re.search(
        r"^stall: worker:1 stopped: runs Python in a tf.py_function .* in sleep_in_py_function", text, re.M
    )
    assert re.search(r"^stall: worker:0 waiting: blocked in TensorFlow .* called at fake_tf_steps.py", text, re.M)
    reported = next(at for at, line in statuses if line.startswith("stall: no training task"))
    stuck = max(_stuck_at(result.task(f"worker:{i}").output) for i in range(2))
    assert seconds - 1 <= reported - stuck <= seconds + 3, (reported - stuck, text)
    for task, function in (("worker-0", "quick_execute"), ("worker-1", "sleep_in_py_function")):
        assert function in (tmp_path / f"{task}.stacks").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "worker-0.log",
        "worker-0.stacks",
        "worker-1.log",
        "worker-1.stacks",
    ]
    assert "stall: stopping the run (worker:1 stopped)" in text
    assert_all_gone([t.pid for t in result.tasks])


def test_an_elastic_run_loses_the_stopped_worker_and_goes_on(tmp_path: Path) -> None:
    result = launch.run(
        [sys.executable, fake_tf_steps.__file__, "3", "worker:0=done", "worker:1=py_function", "worker:2=done"],
        workers=3,
        min_workers=2,
        stall_seconds=2,
        log_dir=str(tmp_path),
        timeout=60,
    )
    assert (result.reason, result.exit_code) == (Outcome.OK, 0), result.summary()
    assert [t.task for t in result.tasks if t.lost] == ["worker:1"]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_a_worker_asleep_in_its_training_loop_is_named_within_s_and_the_run_stalls(loop: str, tmp_path: Path) -> None:
    """worker:1 sleeps after 3 steps: in a tf.py_function of fit's train step, or in the Python of a custom loop."""
    seconds = 8.0  # the longest gap between two steps seen: 2.8 s beside 3 busy loops (test_hosts.py)
    statuses: list[tuple[float, str]] = []
    run = testing.run_cluster(
        _tasks_stall.fit_then_sleep if loop == "fit" else _tasks_stall.custom_loop_then_sleep,
        workers=2,
        timeout=240,
        stall_seconds=seconds,
        log_dir=str(tmp_path),
        on_status=lambda line: statuses.append((time.time(), line)),
    )
    text = "\n".join(line for _, line in statuses)
    result = run.result
    assert (result.reason, result.exit_code, result.failed_task) == (Outcome.STALLED, STALLED, "worker:1"), text
    where = "in a tf.py_function of its step" if loop == "fit" else "outside TensorFlow"
    assert re.search(rf"^stall: worker:1 stopped: runs Python {where} .* in _sleep: time.sleep", text, re.M), text
    assert re.search(r"^stall: worker:0 waiting: blocked in TensorFlow", text, re.M), text
    reported = next(at for at, line in statuses if line.startswith("stall: no training task"))
    asleep = _stuck_at(result.task("worker:1").output)
    assert seconds - 1 <= reported - asleep <= seconds + 5, (reported - asleep, text)
    assert "in _sleep" in (tmp_path / "worker-1.stacks").read_text()
    assert "Thread" in (tmp_path / "worker-0.stacks").read_text()
    assert_all_gone([t.pid for t in result.tasks])
