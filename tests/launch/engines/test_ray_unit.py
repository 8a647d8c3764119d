"""The Ray engine's parts that need no Ray: the task host, options, the CLI without Ray installed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.processes import assert_all_gone
from tfdist.errors import LaunchError
from tfdist.launch.engines._ray_actor import TaskHost
from tfdist.launch.engines.ray import RayOptions, is_local_ray

PY = sys.executable


def _drain(host: TaskHost, pid: int, timeout: float = 30) -> tuple[list[str], int | None]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch, code, finished = host.read(1.0, pid)
        lines += batch
        if finished:
            return lines, code
    raise AssertionError(f"not finished: {lines}")


def test_task_host_streams_reports_exit_and_restarts() -> None:
    host = TaskHost("worker:0")
    address, _ = host.address("127.0.0.1")
    assert address.startswith("127.0.0.1:")
    pid = host.start(
        [PY, "-c", "import os; print(os.environ['X']); print('two'); raise SystemExit(3)"],
        {"X": "one", "PATH": os.environ["PATH"]},
    )
    assert _drain(host, pid) == (["one", "two"], 3)
    again = host.start([PY, "-c", "print('again')"], {"PATH": os.environ["PATH"]})
    assert host.read(1.0, pid) == ([], None, True)  # A reader of the first attempt gets nothing of the second.
    assert _drain(host, again) == (["again"], 0)


def test_task_host_signals_the_whole_group_and_stop_reaps() -> None:
    host = TaskHost("worker:1")
    script = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    )
    pid = host.start([PY, "-c", script], {"PATH": os.environ["PATH"]})
    lines: list[str] = []
    while not lines:
        lines += host.read(5.0, pid)[0]
    host.signal(signal.SIGKILL)
    assert _drain(host, pid)[1] == 128 + signal.SIGKILL
    assert host.stop(1.0) == 128 + signal.SIGKILL
    assert_all_gone([pid, int(lines[0])])


def test_task_host_child_dies_with_its_host_process() -> None:
    code = (
        "import sys, time; from tfdist.launch.engines._ray_actor import TaskHost; h = TaskHost('w'); "
        "print(h.start([sys.executable, '-c', 'import time; time.sleep(60)'], {}), flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [PY, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    )
    child = int(proc.stdout.readline())  # type: ignore[union-attr]
    proc.kill()  # As Ray kills an actor's process.
    proc.wait()
    assert_all_gone([child])  # The parent-death signal took the task with it.


@pytest.mark.parametrize(
    "options,field",
    [
        ({"cpus_per_task": -1}, "cpus_per_task"),
        ({"cpus_per_task": 0}, "cpus_per_task"),
        ({"gpus_per_task": "1"}, "gpus_per_task"),
        ({"placement": "packed"}, "placement"),
        ({"ready_timeout": 0}, "ready_timeout"),
        ({"address": ""}, "address"),
        ({"address": "auto", "num_cpus": 4}, "num_cpus"),
        ({"cpus_per_task": float("nan")}, "cpus_per_task"),
        ({"gpus_per_task": float("inf")}, "gpus_per_task"),
        ({"ready_timeout": float("nan")}, "ready_timeout"),
        ({"ready_timeout": True}, "ready_timeout"),
        ({"num_cpus": "x"}, "num_cpus"),
        ({"num_cpus": -1}, "num_cpus"),
    ],
)
def test_bad_options_are_launch_errors(options: dict, field: str) -> None:
    with pytest.raises(LaunchError) as caught:
        RayOptions(**options)
    assert caught.value.field == field


def test_options_and_loopback() -> None:
    options = RayOptions(cpus_per_task=2, gpus_per_task=1, placement="strict_spread")
    assert (options.bundle(), options.strategy) == ({"CPU": 2.0, "GPU": 1.0}, "STRICT_SPREAD")
    assert [
        is_local_ray(a) for a in (None, "127.0.0.1:6379", "localhost:1", "[::1]:6379", "auto", "10.0.0.2:6379")
    ] == [True, True, True, True, False, False]


def test_cli_without_ray_says_how_to_install_it() -> None:
    code = (
        "import sys; sys.modules['ray'] = None; from tfdist.cli.launch import main; "
        "sys.exit(main(['--engine', 'ray', '--', sys.executable, '-c', 'pass']))"
    )
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # A missing package is a runtime failure (EngineError), not bad input.
    assert 'pip install ".[ray]" in a tfdist clone' in done.stderr and "Traceback" not in done.stderr
