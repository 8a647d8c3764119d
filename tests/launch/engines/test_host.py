"""The task host that runs one task's program where an engine placed it (a Ray actor, a Spark task)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.processes import assert_all_gone
from tfdist.launch.engines._host import TaskHost

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
        "import sys, time; from tfdist.launch.engines._host import TaskHost; h = TaskHost('w'); "
        "print(h.start([sys.executable, '-c', 'import time; time.sleep(60)'], {}), flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [PY, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    )
    child = int(proc.stdout.readline())  # type: ignore[union-attr]
    proc.kill()  # As Ray kills an actor's process.
    proc.wait()
    assert_all_gone([child])  # The parent-death signal took the task with it.
