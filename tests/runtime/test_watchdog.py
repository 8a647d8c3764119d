"""The step watchdog: where a task is from its stacks, its steps, its reports and its stack dumps (no TensorFlow:
a fake package whose "calls" are functions compiled under TensorFlow's file names)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest

from tests.support import fake_tf_steps
from tfdist.runtime.watchdog import (
    DUMP_REQUEST,
    REPORT,
    STACKS,
    WATCH_VAR,
    Sample,
    StackSampler,
    StepCounter,
    StepReport,
    WatchTarget,
    Where,
    describe,
)

pytestmark = pytest.mark.timeout(60)
PREFIX = fake_tf_steps.PREFIX
PROGRAM = fake_tf_steps.__file__


@pytest.fixture
def tf() -> Iterator[dict]:
    saved = sys.modules.get("tensorflow")
    yield fake_tf_steps.fake_tensorflow()
    if saved is None:
        sys.modules.pop("tensorflow", None)
    else:
        sys.modules["tensorflow"] = saved


def _sample(main: int) -> Sample:
    return StackSampler(main, prefix=lambda: PREFIX).sample(sys._current_frames())


def _thread(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(0.2)  # inside its call by now
    return thread


def test_a_thread_blocked_in_a_tensorflow_call_waits_in_tensorflow(tf: dict) -> None:
    thread = _thread(lambda: tf["quick_execute"](0.6))
    sample = _sample(thread.ident or 0)
    assert sample.where is Where.TENSORFLOW
    assert sample.call is not None and sample.call.f_code.co_name == "quick_execute"
    assert "test_watchdog.py" in describe(sample.frame) and "<lambda>" in describe(sample.frame)
    thread.join(5)


def test_python_in_a_py_function_of_the_step_is_seen_on_its_own_thread(tf: dict) -> None:
    gate = threading.Lock()
    gate.acquire()

    def slow_body() -> None:
        gate.acquire()  # native wait: this frame stays the innermost

    thread = _thread(lambda: tf["run_py_function"](slow_body))
    sample = _sample(thread.ident or 0)
    gate.release()
    thread.join(5)
    assert sample.where is Where.PY_FUNCTION
    assert describe(sample.frame).startswith("test_watchdog.py:"), describe(sample.frame)
    assert describe(sample.frame).endswith(
        "in slow_body: gate.acquire()  # native wait: this frame stays the innermost"
    )


def test_python_outside_any_call_is_python_and_without_tensorflow_everything_is(tf: dict) -> None:
    release = threading.Event()
    thread = _thread(lambda: release.wait(5))
    assert _sample(thread.ident or 0).where is Where.PYTHON
    blocked = _thread(lambda: tf["quick_execute"](0.5))
    assert StackSampler(blocked.ident or 0, prefix=lambda: None).sample(sys._current_frames()).where is Where.PYTHON
    release.set()
    blocked.join(5)


def _frame() -> FrameType:
    return sys._getframe()


def test_a_step_counts_when_the_call_of_the_last_sample_is_gone() -> None:
    first, second = _frame(), _frame()
    counter = StepCounter()
    samples = [
        (Sample(where=Where.PYTHON, call=None, frame=None), 0),
        (Sample(where=Where.TENSORFLOW, call=first, frame=None), 0),  # a call begins
        (Sample(where=Where.TENSORFLOW, call=first, frame=None), 0),  # the same call: no step
        (Sample(where=Where.PY_FUNCTION, call=first, frame=None), 0),  # still the same call
        (Sample(where=Where.TENSORFLOW, call=second, frame=None), 1),  # another call: the first returned
        (Sample(where=Where.PYTHON, call=None, frame=None), 2),  # back in Python: the second returned
    ]
    for at, (sample, steps) in enumerate(samples):
        counter.add(sample, now=float(at))
        assert counter.steps == steps, at
    assert counter.since == 5.0


def test_the_target_travels_in_one_variable() -> None:
    target = WatchTarget(directory="/logs", task="worker:0", attempt=1)
    assert WatchTarget.from_env(target.to_env()) == target
    assert [WatchTarget.from_env(text) for text in ("", "{", "[]", '{"task": "w"}')] == [None] * 4
    assert target.path(REPORT) == "/logs/worker-0.json"


def _wait_for(check: Callable[[], object], seconds: float = 20) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("not within the time")


def test_a_task_reports_its_steps_and_writes_its_stacks_on_the_signal_and_on_request(tmp_path: Path) -> None:
    target = WatchTarget(directory=str(tmp_path), task="worker:1", attempt=3)
    env = {**os.environ, WATCH_VAR: target.to_env(), "TFDIST_TASK": "worker:1"}
    proc = subprocess.Popen([sys.executable, PROGRAM, "4", "worker:1=py_function"], env=env, stdout=subprocess.PIPE)
    try:

        def stuck() -> StepReport | None:
            report = StepReport.read(target.path(REPORT))
            return report if report is not None and report.where is Where.PY_FUNCTION else None

        report = _wait_for(stuck)
        assert isinstance(report, StepReport)
        assert (report.task, report.attempt, report.pid, report.dump_signal) == (
            "worker:1",
            3,
            proc.pid,
            signal.SIGUSR1,
        )
        assert 2 <= report.steps <= 4 and "in sleep_in_py_function: time.sleep(3600)" in report.detail, report
        later = _wait_for(lambda: (r := StepReport.read(target.path(REPORT))) and r.seq > report.seq and r)
        assert isinstance(later, StepReport) and later.steps == report.steps  # stuck: no more steps
        stacks = Path(target.path(STACKS))
        os.kill(proc.pid, signal.SIGUSR1)
        _wait_for(lambda: "sleep_in_py_function" in stacks.read_text())
        size = stacks.stat().st_size
        Path(target.path(DUMP_REQUEST)).touch()
        _wait_for(lambda: stacks.stat().st_size > size and not os.path.exists(target.path(DUMP_REQUEST)))
        assert stacks.read_text().count("sleep_in_py_function") == 2
        assert proc.poll() is None  # the signal wrote the stacks, it did not end the task
    finally:
        proc.kill()
        proc.wait(10)
