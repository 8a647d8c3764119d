"""What tfdist-launch and tfdist show on the console (issue #26): prefixed progress bars, --console chief,
the tfdist logger's default (--log-level, TFDIST_LOG_LEVEL) and TensorFlow's start-up noise left out of
tfdist's own commands. Real processes throughout; one test imports TensorFlow (tfdist doctor --stack)."""

from __future__ import annotations

import os
import pathlib
import pty
import re
import shutil
import signal
import subprocess
import sys

import pytest

from tfdist.cli import launch as launch_cli
from tfdist.cli import main as tfdist_cli

# A task's program: a start line, five progress updates drawn over each other (as Keras' bar is), the line that
# ends the bar, and one INFO record of the tfdist logger, which the program does not configure.
PROGRESS = """\
import logging, os, sys, time
import tfdist
task = os.environ["TFDIST_TASK"]
print("start", task, flush=True)
for i in range(1, 6):
    sys.stdout.write("\\b" * 20 + f"\\r{i}/5 [{'=' * i}{'.' * (5 - i)}] {task}")
    sys.stdout.flush()
    time.sleep(0.02)
sys.stdout.write(" - done\\n")
logging.getLogger("tfdist.demo").info("hello from %s", task)
"""
# TensorFlow's noise as its C++ code writes it to fd 2 (TF 2.17), and a real error line that must pass.
NOISE = (
    "2026-11-30 05:19:19.690385: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:485] Unable to register "
    "cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered"
)
REAL_ERROR = "2026-11-30 05:24:28.764747: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed: NOT_FOUND"


def _launch(*flags: str, code: str = PROGRESS, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_LOG_LEVEL")}
    return subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", *flags, "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


@pytest.mark.multiprocess
def test_progress_bars_of_two_tasks_are_prefixed_lines(tmp_path: pathlib.Path) -> None:
    done = _launch("--workers", "2", "--log-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "\r" not in done.stdout and "\b" not in done.stdout
    assert all(re.match(r"\[worker:[01]\] ", line) for line in lines), lines
    for task in ("worker:0", "worker:1"):
        mine = [line for line in lines if line.startswith(f"[{task}] ")]
        # The first update, then (within 10 s) only the line that ends the bar. The tfdist logger's line comes
        # from stderr, a pipe of its own: whole, but not ordered against stdout lines written just before it.
        logged = f"[{task}] INFO tfdist.demo: hello from {task}"
        assert mine.count(logged) == 1, lines
        assert [line for line in mine if line != logged] == [
            f"[{task}] start {task}",
            f"[{task}] 1/5 [=....] {task}",
            f"[{task}] 5/5 [=====] {task} - done",
        ], lines
        log = (tmp_path / f"{task.replace(':', '-')}.log").read_bytes().decode()
        assert [f"{i}/5 [{'=' * i}{'.' * (5 - i)}] {task}\r" for i in range(1, 5)] == re.findall(r".*\r", log)


@pytest.mark.multiprocess
@pytest.mark.parametrize("chief", [False, True], ids=["worker0", "chief"])
def test_console_chief_shows_one_task_and_the_log_dir_has_all(tmp_path: pathlib.Path, chief: bool) -> None:
    topology = ["--chief", "--workers", "1"] if chief else ["--workers", "2"]
    shown, other = ("chief:0", "worker:0") if chief else ("worker:0", "worker:1")
    done = _launch(*topology, "--console", "chief", "--log-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert {line.split("]")[0] + "]" for line in done.stdout.splitlines()} == {f"[{shown}]"}, done.stdout
    assert f"[{shown}] 5/5 [=====] {shown} - done" in done.stdout
    log = (tmp_path / f"{other.replace(':', '-')}.log").read_bytes().decode()
    assert f"start {other}\n" in log and f"5/5 [=====] {other} - done\n" in log and log.count("\r\n") == 4
    assert f"the console shows {shown}" in done.stderr


@pytest.mark.multiprocess
def test_console_chief_without_log_dir_makes_one_and_says_where() -> None:
    done = _launch("--workers", "2", "--console", "chief")
    assert done.returncode == 0, done.stderr
    where = re.search(r"every task's output is in (\S+)", done.stderr)
    assert where is not None, done.stderr
    try:
        assert "start worker:1" in pathlib.Path(where.group(1), "worker-1.log").read_text()
        assert "[worker:1]" not in done.stdout and "[worker:0] start worker:0" in done.stdout
    finally:
        shutil.rmtree(where.group(1))


@pytest.mark.multiprocess
def test_the_tfdist_logger_reaches_a_launched_tasks_console_and_log_level_silences_it() -> None:
    code = "import tfdist, logging; logging.getLogger('tfdist.x').info('hello')"
    shown = _launch("--workers", "1", code=code)
    assert shown.returncode == 0 and "[worker:0] INFO tfdist.x: hello\n" in shown.stdout, shown
    quiet = _launch("--workers", "1", "--log-level", "warning", code=code)
    assert quiet.returncode == 0 and "hello" not in quiet.stdout, quiet
    # The launcher's own TFDIST_LOG_LEVEL reaches the tasks when --log-level is not given.
    inherited = _launch("--workers", "1", code=code, env={"TFDIST_LOG_LEVEL": "error"})
    assert inherited.returncode == 0 and "hello" not in inherited.stdout, inherited
    # A program that configures logging itself gets each tfdist line once, through its own handler.
    configured = _launch("--workers", "1", code=code.replace("; logging.get", "; logging.basicConfig(); logging.get"))
    assert configured.stdout.count("hello") == 1 and "INFO:tfdist.x:hello" in configured.stdout, configured


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "TFDIST_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={**base, **env})


@pytest.mark.parametrize(
    ("env", "code", "stderr"),
    [
        ({"TFDIST_LOG_LEVEL": "info"}, "", "INFO tfdist.x: hello\n"),
        ({}, "", ""),  # Without the variable tfdist configures nothing: Python's default shows no INFO.
        ({"TFDIST_LOG_LEVEL": "warning"}, "", ""),
        ({"TFDIST_LOG_LEVEL": "off"}, "logging.getLogger('tfdist.x').error('bad')\n", ""),
        ({"TFDIST_LOG_LEVEL": "info"}, "logging.basicConfig(format='%(message)s')\n", "hello\n"),
        ({"TFDIST_LOG_LEVEL": "info"}, "logging.getLogger('tfdist').addHandler(logging.StreamHandler())\n", "hello\n"),
        ({"TFDIST_LOG_LEVEL": "loud"}, "", "TFDIST_LOG_LEVEL='loud' is not one of debug, info, warning, error, off"),
    ],
    ids=["info", "unset", "warning", "off", "basicConfig-after-import", "own-handler", "unknown"],
)
def test_the_tfdist_logger_default_at_import(env: dict[str, str], code: str, stderr: str) -> None:
    done = _python(f"import logging\nimport tfdist\n{code}logging.getLogger('tfdist.x').info('hello')\n", env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(stderr) and (done.stderr == stderr or not stderr.endswith("\n")), done.stderr


def test_logging_configured_before_import_is_left_alone() -> None:
    code = "import logging\nlogging.basicConfig(level=logging.INFO, format='%(message)s')\nimport tfdist\n"
    done = _python(code + "logging.getLogger('tfdist.x').info('hello')\n", {"TFDIST_LOG_LEVEL": "error"})
    assert done.stderr == "hello\n"  # The program's level, not the variable's; one line.


def test_the_clis_log_level_flag() -> None:
    parse = tfdist_cli.parser().parse_args
    assert parse(["doctor"]).log_level is None
    assert parse(["--log-level", "debug", "doctor"]).log_level == "debug"
    assert parse(["doctor", "--log-level", "error"]).log_level == "error"
    code = (
        "import logging, sys\nfrom tfdist.runtime import logs\nlogs.configure_cli(logs.cli_level(sys.argv[1] or None))\n"
        "logging.getLogger('tfdist.x').info('tfdist-info')\nlogging.getLogger('other').info('other-info')\n"
        "logging.getLogger('other').warning('other-warning')\n"
    )
    for flag, env, shown in (
        ("", {}, ["INFO tfdist.x: tfdist-info", "WARNING other: other-warning"]),
        ("warning", {}, ["WARNING other: other-warning"]),
        ("", {"TFDIST_LOG_LEVEL": "warning"}, ["WARNING other: other-warning"]),
        ("info", {"TFDIST_LOG_LEVEL": "warning"}, ["INFO tfdist.x: tfdist-info", "WARNING other: other-warning"]),
    ):
        base = {k: v for k, v in os.environ.items() if k != "TFDIST_LOG_LEVEL"}
        done = subprocess.run(
            [sys.executable, "-c", code, flag], capture_output=True, text=True, timeout=60, env={**base, **env}
        )
        assert done.stderr.splitlines() == shown, (flag, env, done.stderr)


@pytest.mark.parametrize("flags", [["--console", "chief"], ["--log-level", "debug"]], ids=["console", "log-level"])
def test_run_flags_are_refused_with_emit(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert launch_cli.main(["--emit", "tfjob", "--image", "i", *flags, "--", "python", "t.py"]) == 2
    err = capsys.readouterr().err
    assert f"{flags[0]} would be ignored by --emit tfjob" in err and "local, ray, spark" in err, err
    assert launch_cli._ACTS["console"] == launch_cli._ACTS["log_level"] == frozenset({"local", "ray", "spark"})


FILTERED = """\
import os, subprocess, sys
from tfdist.cli.quiet import filtered_stderr
with filtered_stderr():
    os.write(2, (sys.argv[1] + "\\n" + sys.argv[2] + "\\n").encode())  # What TF's C++ code writes to fd 2.
    sys.stderr.write("python line\\n")
    subprocess.run(["sh", "-c", "echo " + repr(sys.argv[1]) + " >&2; echo child line >&2"])
    print("isatty", sys.stderr.isatty(), flush=True)
os.write(2, b"after\\n")
"""


def test_filtered_stderr_drops_tf_noise_of_the_process_and_its_children() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FILTERED, NOISE, REAL_ERROR], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [REAL_ERROR, "python line", "child line", "after"]
    assert done.stdout == "isatty False\n"
    loud = subprocess.run(
        [sys.executable, "-c", FILTERED, NOISE, REAL_ERROR],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    assert loud.stderr.count("Unable to register cuFFT factory") == 2, loud.stderr


def test_filtered_stderr_passes_the_last_lines_of_a_crash_and_survives_ctrl_c() -> None:
    """The filter is a process of its own: an abort() (a TF 'F' record) or a SIGINT to the group loses nothing."""
    script = (
        # A run started in the background inherits SIGINT ignored: the command must take Ctrl-C here.
        "import os, signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from tfdist.cli.quiet import filtered_stderr\ntry:\n    with filtered_stderr():\n"
        "        os.write(2, (sys.argv[1] + '\\n' + sys.argv[2] + '\\n').encode())\n"
        "        os.kill(0, signal.SIGINT) if sys.argv[3] == 'int' else os.abort()\n"
        "except KeyboardInterrupt:\n    sys.stderr.write('interrupted\\n')\n"
    )
    for how, code, last in (("abort", -signal.SIGABRT, REAL_ERROR), ("int", 0, "interrupted")):
        done = subprocess.run(
            [sys.executable, "-c", script, NOISE, REAL_ERROR, how],
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,  # os.kill(0, ...) reaches that process group only.
        )
        assert done.returncode == code, (how, done.stderr)
        assert done.stderr.splitlines()[-1] == last and NOISE not in done.stderr, (how, done.stderr)


def test_the_filter_process_is_born_with_ctrl_c_blocked() -> None:
    """A SIGINT to the group right after the fork must not reach the filter before it blocks it (it would die
    with the crash's last lines): the mask is set before the fork; the command itself keeps taking Ctrl-C."""
    script = (
        "import os, signal\nfrom tfdist.cli.quiet import filtered_stderr\n"
        "def mask():\n    return int(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))\n"
        "os.register_at_fork(after_in_child=lambda: os.write(1, b'CHILD %d\\n' % mask()))\n"
        "with filtered_stderr():\n    os.write(1, b'PARENT %d\\n' % mask())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(["CHILD", "1", "PARENT", "0"]), done.stdout
    assert "CHILD 1" in done.stdout and "PARENT 0" in done.stdout, done.stdout


def test_filtered_stderr_keeps_a_terminal_a_terminal() -> None:
    """Python's sys.stderr still says it is a terminal (data-report shows progress then)."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", FILTERED, NOISE, REAL_ERROR],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=60,
        )
        assert done.stdout == "isatty True\n"
    finally:
        os.close(follower)
        os.close(leader)


@pytest.mark.multiprocess
def test_doctor_stack_shows_no_tensorflow_start_up_noise() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}

    def doctor(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tfdist.cli.main", "doctor", "--stack"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**env, **extra},
        )

    noises = ("Unable to register", "cuda drivers", "rebuild TensorFlow", "TF-TRT", "] ")
    done = doctor()
    assert done.returncode in (0, 2), done.stderr
    assert "tensorflow:" in done.stdout
    for noise in noises:
        assert noise not in done.stderr, done.stderr
    # The control: with the filter off (TF_CPP_MIN_LOG_LEVEL=0) this TensorFlow does print its start-up
    # lines, so the clean stderr above is tfdist's filter at work in `tfdist`'s own main, not a quiet TF.
    unfiltered = doctor(TF_CPP_MIN_LOG_LEVEL="0")
    assert any(noise in unfiltered.stderr for noise in noises), unfiltered.stderr
