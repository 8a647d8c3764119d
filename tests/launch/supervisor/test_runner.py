"""tfdist-launch with plain Python tasks: env, output, failures, restarts, timeouts, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import pytest

from tests.support.processes import assert_all_gone
from tfdist import ClusterSpec, LaunchError, launch
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import TaskProcess
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.events import KillAt
from tfdist.launch.output import LineSink
from tfdist.launch.supervisor import runner
from tfdist.runtime.versions import tf_keras_installed

PY = sys.executable
pytestmark = pytest.mark.timeout(120)

ENV_REPORT = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
    "['TF_CONFIG', 'TF_USE_LEGACY_KERAS', 'GRPC_FAIL_FAST', 'TF_NUM_INTEROP_THREADS', "
    "'TF_NUM_INTRAOP_THREADS', 'TFDIST_TASK', 'TFDIST_RESTART']}))"
)


def _env_of(result: launch.LaunchResult, task: str) -> dict:
    return json.loads(result.task(task).output.splitlines()[-1])


def test_every_task_gets_its_own_tf_config_and_output_is_prefixed(tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    statuses: list[str] = []
    log_dir = str(tmp_path)
    result = launch.run(
        [PY, "-c", ENV_REPORT],
        workers=2,
        chief=True,
        evaluator=True,
        threads_per_task=1,
        log_dir=log_dir,
        timeout=60,
        on_line=lambda task, line: lines.append((task, line)),
        on_status=statuses.append,
    )
    assert (result.exit_code, result.reason) == (0, "ok")
    fingerprints = set()
    for task in ["chief:0", "worker:0", "worker:1", "evaluator:0"]:
        env = _env_of(result, task)
        spec = ClusterSpec.from_tf_config(env["TF_CONFIG"])
        assert spec.task.name == task  # type: ignore[union-attr]
        fingerprints.add(spec.fingerprint)
        legacy = "1" if tf_keras_installed() else None  # tests/launch/test_environment.py: both ways.
        assert (env["TF_USE_LEGACY_KERAS"], env["TFDIST_TASK"], env["TFDIST_RESTART"]) == (legacy, task, "0")
        assert (env["TF_NUM_INTRAOP_THREADS"], env["GRPC_FAIL_FAST"]) == ("1", None)
        assert task in {t for t, _ in lines}
        log = Path(log_dir, task.replace(":", "-") + ".log").read_text()
        assert result.task(task).output.splitlines()[-1] in log
    assert len(fingerprints) == 1
    assert result.cluster.fingerprint == fingerprints.pop()
    assert runner.EXPOSURE_WARNING in statuses
    assert any("worker:1 started" in s for s in statuses)
    assert_all_gone([t.pid for t in result.tasks])


def test_parameter_server_env_and_run_on_all() -> None:
    result = launch.run([PY, "-c", ENV_REPORT], workers=3, ps=1, chief=True, run_on="all", timeout=60)
    assert result.exit_code == 0
    env = _env_of(result, "chief:0")
    # TF's parameter-server guide: inter-op threads >= workers + 1 (chief + 3 workers) on small machines.
    assert (env["GRPC_FAIL_FAST"], env["TF_NUM_INTEROP_THREADS"]) == ("use_caller", "5")
    assert all(t.runs_command for t in result.tasks)


def test_parameter_servers_that_join_forever_stop_when_the_chief_succeeds(tmp_path: Path) -> None:
    """Issue 26 item 1: --run-on all with the PS tutorial's server.join() on workers and ps ends with the chief."""
    # The chief finishes once every server said it serves (a marker each; on progress, not on time).
    script = (
        "import os, sys, time\n"
        f"up = {str(tmp_path)!r}\n"
        "if os.environ['TFDIST_TASK'] != 'chief:0':\n"
        "    print('serving', flush=True); open(os.path.join(up, os.environ['TFDIST_TASK']), 'w').close()\n"
        "    time.sleep(3600)\n"
        "while len(os.listdir(up)) < 3 and time.sleep(0.05) is None: pass\n"
        "print('fit done', flush=True)"
    )
    statuses: list[str]
    start, statuses = time.monotonic(), []
    result = launch.run(
        [PY, "-c", script], workers=2, ps=1, chief=True, run_on="all", timeout=120, on_status=statuses.append
    )
    assert time.monotonic() - start < 60  # Before the fix: the 120 s timeout, exit 124.
    assert result.summary() == "run ok (exit 0)"  # Servers stopped at the end are not "lost".
    stopping = [s for s in statuses if s.startswith("the coordinator is done; stopping")]
    assert len(stopping) == 1, statuses
    assert "serving" in result.task("worker:1").output
    for task in ("worker:0", "worker:1", "ps:0"):
        assert task in stopping[0]
    assert_all_gone([t.pid for t in result.tasks])


def test_a_failing_worker_ends_the_run_fast_and_nothing_is_left() -> None:
    script = "import os, sys, time\nif os.environ['TFDIST_TASK'] == 'worker:1': sys.exit(7)\ntime.sleep(60)"
    start = time.monotonic()
    result = launch.run([PY, "-c", script], workers=3, timeout=60, grace_seconds=2)
    assert time.monotonic() - start < 15
    assert (result.exit_code, result.reason, result.failed_task) == (7, "failed", "worker:1")
    assert "worker:1 ended the run" in result.summary()
    assert_all_gone([t.pid for t in result.tasks])


def test_timeout_kills_everything() -> None:
    result = launch.run([PY, "-c", "import time; time.sleep(60)"], workers=2, timeout=2, grace_seconds=1)
    assert (result.exit_code, result.reason) == (124, "timeout")
    assert_all_gone([t.pid for t in result.tasks])


def test_grandchildren_are_reaped_too() -> None:
    script = (
        "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    )
    result = launch.run([PY, "-c", script], workers=1, timeout=3, grace_seconds=1)
    grandchild = int(result.task("worker:0").output.split()[0])
    time.sleep(0.2)
    assert_all_gone([grandchild])


def test_restart_whole_group_after_a_crash(tmp_path: Path) -> None:
    marker = Path(tmp_path, "crashed")
    script = (
        f"import os, sys\nif os.environ['TFDIST_TASK'] == 'worker:1' and not os.path.exists({str(marker)!r}):"
        f"\n    open({str(marker)!r}, 'w').close(); sys.exit(3)\nimport time; time.sleep(0.5); "
        "print('attempt', os.environ['TFDIST_RESTART'])"
    )
    statuses: list[str] = []
    result = launch.run([PY, "-c", script], workers=2, max_restarts=1, timeout=60, on_status=statuses.append)
    assert result.exit_code == 0
    assert [t.restarts for t in result.tasks] == [1, 1]  # Collectives restart the whole group.
    assert "attempt 1" in result.task("worker:0").output
    assert any("restart 1/1 of worker:0, worker:1" in s for s in statuses)


def test_summary_says_restarts_and_the_cli_prints_it_once(tmp_path: Path) -> None:
    """Issue 26 item 4: 'run ok' says the run was restarted; a failure's summary line is not printed twice."""
    marker = tmp_path / "crashed"
    script = (
        f"import os, sys\nif os.environ['TFDIST_TASK'] == 'worker:1' and not os.path.exists({str(marker)!r}):"
        f"\n    open({str(marker)!r}, 'w').close(); sys.exit(3)"
    )
    result = launch.run([PY, "-c", script], workers=2, max_restarts=1, timeout=60)
    assert result.summary() == "run ok (exit 0); restarted 1 time"
    done = subprocess.run(
        [PY, "-m", "tfdist.cli.launch", "--workers", "1", "--", PY, "-c", "print('boom'); raise SystemExit(4)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("run failed (exit 4)") == 1, done.stderr
    assert "last lines of worker:0:" in done.stderr


def test_restarts_run_out() -> None:
    result = launch.run([PY, "-c", "import sys; sys.exit(5)"], workers=1, max_restarts=2, timeout=60)
    assert (result.exit_code, result.task("worker:0").restarts) == (5, 2)


def test_kill_injection() -> None:
    result = launch.run(
        [PY, "-c", "import time; time.sleep(30)"], workers=2, timeout=60, kills=(KillAt.parse("worker:1@1"),)
    )
    assert (result.exit_code, result.failed_task) == (128 + signal.SIGKILL, "worker:1")


def test_kill_on_progress_fires_once_when_any_task_prints_the_line() -> None:
    script = (
        "import os, sys, time\nif os.environ['TFDIST_TASK'] == 'worker:0':\n"
        "    print('epoch 2 saved', flush=True); time.sleep(1); sys.exit(0)\n"
        "time.sleep(30 if os.environ['TFDIST_RESTART'] == '0' else 0.5)"
    )
    statuses: list[str] = []
    start = time.monotonic()
    result = launch.run(
        [PY, "-c", script],
        workers=2,
        timeout=60,
        max_restarts=1,
        on_status=statuses.append,
        kills=("worker:1@after=^epoch 2 saved$",),
    )
    assert (result.exit_code, result.reason) == (0, "ok"), result.summary()
    assert [t.restarts for t in result.tasks] == [1, 1]  # Killed once; the rerun printed it again.
    kills = [s for s in statuses if s.startswith("fault injection")]
    assert len(kills) == 1
    assert "SIGKILL worker:1 after worker:0 printed /^epoch 2 saved$/" in kills[0]
    assert time.monotonic() - start < 25  # worker:1 did not sleep its 30 s out.


def test_kill_trigger_that_never_matches_kills_nothing() -> None:
    result = launch.run(
        [PY, "-c", "print('epoch 1 saved')"],
        workers=2,
        timeout=60,
        kills=(KillAt(task="worker:1", after="epoch 2"),),
    )
    assert (result.exit_code, [t.restarts for t in result.tasks]) == (0, [0, 0])


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param("worker:1@20", KillAt(task="worker:1", seconds=20.0), id="seconds"),
        pytest.param("ps:0@0.5", KillAt(task="ps:0", seconds=0.5), id="fraction"),
        pytest.param("worker:1@after=Epoch 3/", KillAt(task="worker:1", after="Epoch 3/"), id="regex"),
        pytest.param("chief:0@after=a@b=c", KillAt(task="chief:0", after="a@b=c"), id="regex_with_at"),
    ],
)
def test_kill_parses(text: str, expected: KillAt) -> None:
    assert KillAt.parse(text) == expected
    assert KillAt.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "text,message",
    [
        pytest.param("worker:1", "TASK:INDEX@after=REGEX", id="no_trigger"),
        pytest.param("worker:1@after=", "non-empty regular expression", id="empty_regex"),
        pytest.param("worker:1@after=(", "valid regular expression", id="bad_regex"),
        pytest.param("worker:1@nan", r"`kills`. Received: nan. Expected a number >= 0", id="nan"),
        pytest.param("worker:1@-1", r"`kills`. Received: -1.0. Expected a number >= 0", id="negative"),
        pytest.param("worker:1@soon", "TASK:INDEX@SECONDS", id="words"),
    ],
)
def test_bad_kill(text: str, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        KillAt.parse(text)


def test_kill_needs_exactly_one_trigger() -> None:
    with pytest.raises(LaunchError, match="exactly one trigger"):
        KillAt(task="worker:1", seconds=1.0, after="x")
    with pytest.raises(LaunchError, match="exactly one trigger"):
        KillAt(task="worker:1")


def test_taken_ports_are_picked_again() -> None:
    import socket

    from tfdist.cluster import address as _address

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real = _address.free_ports
        calls = []

        def fake(count: int, host: str = "127.0.0.1") -> list[int]:
            calls.append(count)
            return [busy] + real(count - 1, host) if len(calls) == 1 else real(count, host)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_address, "free_ports", fake)
            spec = LocalEngine().place(LaunchConfig(command=("x",), workers=2))
    assert len(calls) == 2
    assert f"127.0.0.1:{busy}" not in [t.address for t in spec.tasks()]


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param({"command": ()}, r"`command`. Received: \[\]. Expected a program to run", id="no_command"),
        pytest.param({"workers": 0}, r"`workers`. Received: 0. Expected an integer >= 1", id="zero_workers"),
        pytest.param({"ps": 1}, "Set `chief`", id="ps_without_chief"),
        pytest.param({"run_on": "chief"}, "Set `chief`, or `run_on` 'auto'", id="run_on_chief_without_chief"),
        pytest.param({"run_on": "al"}, "did you mean 'all'", id="run_on_typo"),
        pytest.param(
            {"kills": (KillAt(task="worker:5", seconds=1.0),)}, "did you mean 'worker:0'", id="kill_unknown_task"
        ),
        pytest.param({"max_restarts": -1}, "`max_restarts`", id="negative_restarts"),
        pytest.param(
            {"grace_seconds": 1e12},
            r"`grace_seconds`. Received: 1000000000000.0. Expected a number >= 0 "
            r"and <= 3600",
            id="grace_huge",
        ),
        pytest.param({"log_dir": " "}, "`log_dir`.*Leave `log_dir` unset", id="log_dir_blank"),
        pytest.param({"max_restart": 1}, "did you mean 'max_restarts'", id="unknown_option"),
    ],
)
def test_bad_config(overrides: dict, message: str) -> None:
    fields = dict(command=(PY, "-c", "pass"), workers=1)
    fields.update(overrides)
    with pytest.raises(LaunchError, match=message):
        LaunchConfig(**fields)


def test_missing_command_starts_nothing() -> None:
    with pytest.raises(LaunchError, match="Check the spelling"):
        launch.run(["no-such-program-xyz"], workers=1, timeout=10)
    with pytest.raises(LaunchError, match="TASK:INDEX@SECONDS"):
        KillAt.parse("worker1@5")


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "tfdist.cli.launch", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args,message",
    [
        pytest.param([], "a program to run after '--'", id="no_command"),
        pytest.param(["--workers", "0", "--", "true"], "Expected an integer >= 1", id="zero_workers"),
        pytest.param(
            ["--chief", "--workers", "0", "--ps", "1", "--", "true"],
            "Expected an integer >= 1",
            id="ps_without_workers",
        ),
        pytest.param(
            ["--run-on", "chief", "--", "true"],
            "`--run-on`. Received: 'chief'. Expected a cluster with "
            "a chief (`--chief`). Set `--chief`, or `--run-on` 'auto'",
            id="run_on_chief",
        ),
        pytest.param(["--grace", "1e12", "--", "true"], "`--grace`. Received: 1000000000000.0", id="grace_huge"),
        pytest.param(["--kill", "worker:7@1", "--", "true"], "`--kill`. Received: 'worker:7'", id="kill_unknown"),
        pytest.param(["--", "no-such-program-xyz"], "Check the spelling", id="missing_program"),
        pytest.param(["--kill", "worker:1", "--", "true"], "TASK:INDEX@SECONDS", id="bad_kill"),
    ],
)
def test_bad_input_exits_2_and_starts_nothing(args: list, message: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "started" not in done.stderr


def test_success_and_failure_exit_codes() -> None:
    ok = _cli("--workers", "2", "--", PY, "-c", "print('hello')")
    assert ok.returncode == 0
    assert "[worker:1] hello" in ok.stdout
    failed = _cli(
        "--workers",
        "2",
        "--",
        PY,
        "-c",
        "import os,sys; print('boom'); sys.exit(4 if os.environ['TFDIST_TASK']=='worker:0' else 0)",
    )
    assert failed.returncode == 4
    assert "worker:0 ended the run" in failed.stderr
    assert "last lines of worker:0:\n    boom" in failed.stderr


def test_ctrl_c_stops_every_task() -> None:
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "tfdist.cli.launch",
            "--workers",
            "2",
            "--",
            PY,
            "-c",
            "import os, time; print(os.getpid(), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]  # type: ignore[union-attr]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 130
    assert_all_gone(pids)


SLEEPER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(os.getpid(), child.pid, flush=True)\ntime.sleep(120)"
)


def _pids(proc: subprocess.Popen, tasks: int) -> list[int]:
    """Reads 'pid grandchild-pid' from each task's first line on the CLI's stdout."""
    pids: list[int] = []
    for _ in range(tasks):
        pids += [int(p) for p in proc.stdout.readline().split()[1:]]  # type: ignore[union-attr]
    return pids


# Issue #17: nothing is left running, whatever ends the launcher, and stopping never drags.


@pytest.mark.parametrize(
    "sig",
    [
        pytest.param(signal.SIGHUP, id="sighup"),
        pytest.param(signal.SIGQUIT, id="sigquit"),
        pytest.param(signal.SIGTERM, id="sigterm"),
        pytest.param(signal.SIGINT, id="sigint"),
    ],
)
def test_signal_to_the_launcher_stops_every_task(sig: int) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "tfdist.cli.launch", "--workers", "2", "--grace", "2", "--", PY, "-c", SLEEPER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = _pids(proc, 2)
    proc.send_signal(sig)
    assert proc.wait(30) == 128 + sig
    assert_all_gone(pids)


def test_sigkill_of_the_launcher_still_stops_every_task() -> None:
    proc = subprocess.Popen(
        [PY, "-m", "tfdist.cli.launch", "--workers", "2", "--grace", "1", "--", PY, "-c", SLEEPER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = _pids(proc, 2)
    proc.kill()
    proc.wait(10)
    assert_all_gone(pids, within=10)  # The reaper stops them: SIGTERM, then SIGKILL after the grace.


def test_grace_is_one_deadline_shared_by_every_task(tmp_path: Path) -> None:
    ready = str(tmp_path)
    script = (
        "import os, signal, sys, time\ntask = os.environ['TFDIST_TASK']\n"
        f"ready = {ready!r}\n"
        "if task == 'worker:3':\n"
        "    while len(os.listdir(ready)) < 3: time.sleep(0.05)\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(os.path.join(ready, task), 'w').close()\ntime.sleep(120)"
    )
    stamps: list[tuple[float, str]] = []
    result = launch.run(
        [PY, "-c", script],
        workers=4,
        timeout=90,
        grace_seconds=2,
        on_status=lambda message: stamps.append((time.monotonic(), message)),
    )
    assert (result.exit_code, result.failed_task) == (3, "worker:3")
    failed_at = next(t for t, message in stamps if "worker:3 failed" in message)
    ended_at = stamps[-1][0]
    assert ended_at - failed_at < 2 + 2.5  # Three SIGTERM-ignoring workers, one 2 s grace (not 6 s).
    assert ended_at - failed_at >= 1.9  # They did get their grace.
    assert sorted(cast(int, t.exit_code) for t in result.tasks) == [3, 137, 137, 137]


def test_a_background_child_holding_the_output_does_not_delay_the_run() -> None:
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print('child', child.pid, flush=True)"
    )
    start = time.monotonic()
    result = launch.run([PY, "-c", script], workers=2, timeout=60)
    assert result.exit_code == 0, result.summary()
    assert time.monotonic() - start < 5  # Was 5 s per task's output reader.
    children = [int(result.task(t).output.split()[1]) for t in ("worker:0", "worker:1")]
    assert_all_gone(children)


@pytest.mark.parametrize(
    "overrides,message",
    [
        pytest.param({"grace_seconds": float("nan")}, "grace", id="grace_nan"),
        pytest.param({"grace_seconds": -1}, "grace", id="grace_negative"),
        pytest.param({"grace_seconds": "5"}, "grace", id="grace_text"),
        pytest.param({"grace_seconds": float("inf")}, "grace", id="grace_inf"),
        pytest.param({"timeout": float("nan")}, "`timeout`", id="timeout_nan"),
        pytest.param({"timeout": float("inf")}, "`timeout`", id="timeout_inf"),
        pytest.param({"timeout": 0}, "`timeout`", id="timeout_zero"),
        pytest.param({"timeout": 2 * 366 * 86400.0}, "`timeout`.*<= 31622400", id="timeout_two_years"),
        pytest.param({"workers": 10**12}, "`workers`. Received: 1000000000000", id="workers_huge"),
        pytest.param({"ps": 10**12, "chief": True}, "`ps`", id="ps_huge"),
        pytest.param({"threads_per_task": 0}, "`threads_per_task`", id="threads_zero"),
        pytest.param({"chief": "yes"}, "`chief`", id="chief_text"),
    ],
)
def test_bad_numbers_are_refused_before_anything_starts(overrides: dict, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError, match=message):
        launch.run([PY, "-c", "import time; time.sleep(60)"], **{"workers": 1, **overrides})
    assert time.monotonic() - start < 2


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    script = Path(tmp_path, "train.sh")
    script.write_text("echo hi\n")
    with pytest.raises(LaunchError, match="chmod \\+x"):
        launch.run([str(script)], workers=1, timeout=10)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--grace", "nan"], id="grace_nan"),
        pytest.param(["--grace", "-1"], id="grace_negative"),
        pytest.param(["--timeout", "nan"], id="timeout_nan"),
        pytest.param(["--workers", "1000000000000"], id="workers_huge"),
        pytest.param(["--workers", "1000000000000", "--emit", "tfjob", "--image", "x"], id="workers_huge_emit"),
        pytest.param(["--chief", "--ps", "1000000000000", "--emit", "slurm"], id="ps_huge_emit"),
    ],
)
def test_cli_refuses_them_in_one_line(args: list) -> None:
    start = time.monotonic()
    done = subprocess.run(
        [PY, "-m", "tfdist.cli.launch", *args, "--", PY, "-c", "pass"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "started" not in done.stderr + done.stdout
    assert time.monotonic() - start < 15


# The runner drives any engine: it decides restarts and faults, the engine only starts and signals.


def test_supervision_drives_a_custom_engine() -> None:
    class RecordingEngine(LocalEngine):
        name = "recording"

        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def place(self, config: LaunchConfig) -> ClusterSpec:
            self.calls.append("place")
            return super().place(config)

        def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
            self.calls.append(f"start {task} restart={env['TFDIST_RESTART']}")
            return super().start(task, argv, env, on_line)

        def close(self) -> None:
            self.calls.append("close")
            super().close()

    script = (
        "import os, time\nprint('up', os.environ['TFDIST_TASK'], flush=True)\n"
        "time.sleep(30 if os.environ['TFDIST_RESTART'] == '0' else 0)"
    )
    engine = RecordingEngine()
    config = LaunchConfig(
        command=(PY, "-c", script), workers=2, max_restarts=1, timeout=60, kills=("worker:1@after=^up worker:0$",)
    )
    result = launch.run_config(config, engine=engine)
    assert result.exit_code == 0, result.summary()
    assert engine.calls == [
        "place",
        "start worker:0 restart=0",
        "start worker:1 restart=0",
        "start worker:0 restart=1",
        "start worker:1 restart=1",
        "close",
    ]
    from tfdist.launch.engines.registry import engine_for

    assert engine_for("local").name == "local"
    with pytest.raises(LaunchError, match="did you mean 'local'"):
        engine_for("locl")
