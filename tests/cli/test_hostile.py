"""Every command line under hostile input: exit 2, one line on stderr, no traceback, nothing left running.

The property tests run the CLIs in this process (``main(argv)``, output captured); a few cases that need a
real process (a closed pipe, non-UTF-8 bytes in argv, "no TensorFlow import") start one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdist
from tfdist.cli import launch as launch_cli
from tfdist.cli import main as tfdist_cli
from tfdist.comm.autotune import CollectiveTuning
from tfdist.errors import PlanError, StorageError, StrategyError
from tfdist.launch.tasks import data_service, server
from tfdist.launch.tasks import jobset as jobset_task
from tfdist.launch.tasks import slurm as slurm_task
from tfdist.plan import Plan

PY = sys.executable
Main = Callable[[Sequence[str]], int]
VALID_TF_CONFIG = json.dumps({"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}})
PLAN = ["plan", "--params", "25M", "--workers", "4", "--bandwidth", "10Gbps", "--latency", "50us"]

# Values that are wrong for every flag below: not finite, negative, absurdly large, empty, control
# characters, and the surrogates Python makes of non-UTF-8 bytes in argv.
HOSTILE = st.one_of(
    st.sampled_from(
        [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "1e400",
            "-1",
            "-7.5",
            "99999999999999999999999",
            "",
            " ",
            "\n",
            "a\nb",
            "\x00",
            "\x1b[31m",
            "\udcff\udcfe",
            "--",
            "@",
        ]
    ),
    st.text(alphabet=st.characters(categories=["Cc", "Cs"]), min_size=1, max_size=8),
)

# CLI -> (base argv that is valid but for the flag under test, the flags whose hostile values it must refuse).
CLIS: dict[str, tuple[Main, list[str], list[str]]] = {
    "doctor": (tfdist_cli.main, ["doctor", "--tf-config", VALID_TF_CONFIG], ["--tf-config", "--probe"]),
    "plan": (
        tfdist_cli.main,
        PLAN,
        [
            "--params",
            "--workers",
            "--gpus-per-worker",
            "--bandwidth",
            "--latency",
            "--device-memory",
            "--ps-shards",
            "--compute",
            "--embedding-values",
            "--optimizer",
            "--compression",
            "--collective-bandwidth",
            "--memory-bandwidth",
        ],
    ),
    "data-report": (
        tfdist_cli.main,
        ["data-report", "/nonexistent/*", "--label-key", "y", "--workers", "2"],
        ["--workers", "--shard-policy"],
    ),
    "launch": (
        launch_cli.main,
        ["--emit", "tf-config", "--workers", "2"],
        [
            "--workers",
            "--ps",
            "--max-restarts",
            "--threads-per-task",
            "--timeout",
            "--grace",
            "--kill",
            "--data-service-workers",
            "--run-on",
            "--hosts",
            "--port",
            "--emit",
        ],
    ),
    "data_service": (data_service.main, [], ["--workers", "--port"]),
    "server": (server.main, [], ["--exit-with-chief"]),
    "slurm_task": (
        slurm_task.main,
        [],
        ["--port-base", "--restart", "--jobs", "--run-on", "--min-workers", "--allocated-tasks"],
    ),
    "jobset_task": (jobset_task.main, [], []),
}


def _children() -> set[int]:
    """Pids of this process's children (to check that a refused command started nothing)."""
    mine = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    mine.add(int(entry))
    return mine


def run_cli(main: Main, argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Runs ``main(argv)`` in this process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("TF_CONFIG", None)
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # Only for CLIs that do not convert it themselves.
                code = exc.code  # type: ignore[assignment]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def assert_refused(result: tuple[int, str, str], argv: Sequence[str]) -> None:
    code, _, err = result
    assert code == 2, f"{argv!r} -> exit {code}: {err}"
    assert err.count("\n") == 1, f"{argv!r} -> not one line on stderr: {err!r}"
    assert err.endswith("\n"), err
    assert "Traceback" not in err
    assert "error" in err


# Property: any hostile value in any flag of any CLI is refused in one line with exit 2.


@pytest.mark.parametrize("name", [name for name in CLIS if CLIS[name][2]])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_value_in_any_flag(name: str, data: st.DataObject) -> None:
    main, base, flags = CLIS[name]
    flag = data.draw(st.sampled_from(flags), label="flag")
    value = data.draw(HOSTILE, label="value")
    argv = list(base)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    if name == "plan" and flag == "--embedding-values":
        argv += ["--embedding-touched", "1k"]
    before = _children()
    assert_refused(run_cli(main, argv), argv)
    assert _children() - before == set(), "a refused command started a process"


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        pytest.param(
            tfdist_cli.main, ["doctor", "--tf-config", '{"cluster": {"worker": ["a:1", "b:1"]}}'], id="doctor_no_task"
        ),
        pytest.param(server.main, [], id="server_no_tf_config"),
        pytest.param(slurm_task.main, ["--", "true"], id="slurm_task_outside_slurm"),
        pytest.param(jobset_task.main, ["--", "true"], id="jobset_task_outside_jobset"),
        pytest.param(launch_cli.main, ["--wrokers", "2", "--", "true"], id="unknown_flag"),
        pytest.param(tfdist_cli.main, [], id="no_subcommand"),
    ],
)
def test_missing_context_is_refused_in_one_line(main: Main, argv: list[str]) -> None:
    assert_refused(run_cli(main, argv), argv)


def _deep(levels: int, wrap: Callable[[object], object]) -> object:
    value: object = 0
    for _ in range(levels):
        value = wrap(value)
    return value


# What a careless or hostile caller passes to a constructor: any number, 5000-digit ints (their repr raises),
# unprintable and non-UTF-8 text, bytes, nested containers, and containers 50,000 levels deep.
NASTY = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.just(10**5000),
    st.text(alphabet=st.characters(categories=["Cc", "Cs", "Zs", "Nd"]), max_size=8),
    st.binary(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=8,
    ),
    st.just(_deep(50_000, lambda v: [v])),
    st.just(_deep(50_000, lambda v: {"worker": v})),
)


# Property: any value for any argument of a public constructor is accepted or refused as a tfdist.Error.


def _calls() -> dict[str, tuple[Callable[..., object], dict[str, object]]]:
    from tests.test_error_model import CALLS  # The API's table of public constructors with valid arguments.

    calls = {name: call for name, call in CALLS.items() if name not in ("ClusterSpec.local", "command_for")}
    calls["CollectiveTuning"] = (
        CollectiveTuning,
        {
            "compression": "bf16",
            "bytes_per_pack": 1 << 20,
            "split_bytes": 0,
            "timings_ms": {"0": 1.5},
            "workers": 2,
            "total_bytes": 4096,
        },
    )
    return calls


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_only_tfdist_errors(data: st.DataObject) -> None:
    calls = _calls()
    name = data.draw(st.sampled_from(sorted(calls)), label="callable")
    function, kwargs = calls[name]
    field = data.draw(st.sampled_from(sorted(kwargs)), label="argument")
    value = data.draw(NASTY, label="value")
    try:
        function(**{**kwargs, field: value})
    except tfdist.Error as err:
        assert isinstance(err, ValueError), f"{name}({field}=...) raised a runtime failure for bad input"
        str(err)  # The message itself must be printable.


# The library's errors name Python arguments; tfdist-launch prints them with the flag that was typed.


def test_the_table_maps_arguments_to_real_flags() -> None:
    import inspect

    from tfdist.launch import LaunchConfig, jobset_manifest, slurm_script, tf_configs, tfjob_manifest

    flags = {flag for action in launch_cli._parser()._actions for flag in action.option_strings}
    assert set(launch_cli.FLAGS.values()) <= flags
    assert set(LaunchConfig.option_names()) - {"command", "env", "host"} <= set(launch_cli.FLAGS)
    set_by_the_cli = {
        "name",
        "namespace",
        "image",
        "cpu",
        "memory",
        "gpus",
        "hosts",
        "port",
        "time_limit",
        "cpus_per_task",
        "gpus_per_task",
        "port_base",
        "python",
        "tf_log_level",
        "tasks_per_node",
        "sbatch",
    }
    for emitter in (tf_configs, tfjob_manifest, jobset_manifest, slurm_script):
        arguments = set(inspect.signature(emitter).parameters) & set_by_the_cli
        assert arguments <= set(launch_cli.FLAGS), emitter.__name__


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(["--grace", "1e12"], "--grace", id="grace"),
        pytest.param(["--timeout", "1e12"], "--timeout", id="timeout"),
        pytest.param(["--log-dir", " "], "--log-dir", id="log_dir"),
        pytest.param(["--workers", "2", "--min-workers", "3"], "--min-workers", id="min_workers"),
        pytest.param(["--workers", "2", "--lose", "worker:1@1"], "--lose", id="lose"),
        pytest.param(["--kill", "worker:9@1"], "--kill", id="kill"),
        pytest.param(["--ps", "1"], "--ps", id="ps"),
        pytest.param(["--emit", "slurm", "--gpus", "-1"], "--gpus", id="slurm_gpus"),
        pytest.param(["--emit", "slurm", "--time", "soon"], "--time", id="slurm_time"),
        pytest.param(["--emit", "tfjob"], "--image", id="tfjob_image"),
    ],
)
def test_library_errors_print_with_the_flag(argv: list[str], flag: str) -> None:
    result = run_cli(launch_cli.main, [*argv, "--", "true"])
    assert_refused(result, argv)
    assert f"Invalid value for `{flag}`" in result[2]
    assert not re.search(r"`[a-z]+_[a-z_]+`", result[2]), result[2]  # No Python argument left in the line.


# Issue 26 item 11 and 4: a typo gets the nearest name, an argument the subcommand it went to, --version.


@pytest.mark.parametrize(
    ("main", "argv", "prefix", "hint"),
    [
        pytest.param(tfdist_cli.main, ["doctr"], "tfdist: error:", "(did you mean doctor?)", id="subcommand"),
        pytest.param(
            tfdist_cli.main,
            [*PLAN, "--workrs", "3"],
            "tfdist plan: error:",
            "(did you mean --workers?)",
            id="plan_flag",
        ),
        pytest.param(
            tfdist_cli.main,
            ["data-report", "/nonexistent/*", "--label-key", "y", "--workers", "2", "--shard-polcy", "file"],
            "tfdist data-report: error:",
            "(did you mean --shard-policy?)",
            id="data_report_flag",
        ),
        pytest.param(
            launch_cli.main, ["--workrs", "2", "--", "true"], "tfdist-launch: error:", "--workers?)", id="launch_flag"
        ),
        pytest.param(
            launch_cli.main,
            ["--workers", "2", "python", "train.py"],
            "tfdist-launch: error: unrecognized arguments: python train.py",
            "(put -- before the program: tfdist-launch [options] -- python train.py)",
            id="forgotten_dashes",
        ),
    ],
)
def test_hint(main: Main, argv: list[str], prefix: str, hint: str) -> None:
    result = run_cli(main, argv)
    assert_refused(result, argv)
    assert result[2].startswith(prefix), result[2]
    assert hint in result[2]


@pytest.mark.parametrize(
    ("argv", "flags", "where"),
    [
        pytest.param(
            ["--ray-address", "auto", "--ray-placement", "spread"],
            "--ray-address, --ray-placement",
            "a run on the local engine",
            id="ray_flags_on_local",
        ),
        pytest.param(
            [
                "--emit",
                "slurm",
                "--timeout",
                "5",
                "--log-dir",
                "/tmp/x",
                "--isolate-network",
                "--engine",
                "ray",
                "--kill",
                "worker:1@3",
            ],
            "--timeout, --log-dir, --kill, --engine, --isolate-network",
            "--emit slurm",
            id="run_flags_on_slurm",
        ),
        pytest.param(
            ["--emit", "tfjob", "--image", "x", "--min-workers", "1", "--time", "02:00:00"],
            "--min-workers, --time",
            "--emit tfjob",
            id="elastic_and_time_on_tfjob",
        ),
        pytest.param(
            ["--tasks-per-node", "2", "--python", "/usr/bin/python3"],
            "--python, --tasks-per-node",
            "a run on the local engine",
            id="slurm_flags_on_a_run",
        ),
    ],
)
def test_flags_that_would_be_ignored_are_refused(argv: list[str], flags: str, where: str) -> None:
    """Issue 26 item 2: a flag that does not act where it was given is refused (exit 2), each one named."""
    result = run_cli(launch_cli.main, [*argv, "--", "true"])
    assert_refused(result, argv)
    assert f"error: {flags} would be ignored by {where}" in result[2]


def test_flags_that_act_are_accepted() -> None:
    for argv in (
        ["--emit", "slurm", "--min-workers", "1", "--time", "02:00:00", "--max-restarts", "2", "--gpus", "1"],
        ["--emit", "tf-config", "--hosts", "a,b", "--port", "2222"],
        ["--emit", "tfjob", "--image", "x", "--cpu", "2", "--max-restarts", "1"],
    ):
        code, out, err = run_cli(launch_cli.main, [*argv, "--", "true"])
        assert code == 0, err
        assert out


def test_no_hint_for_a_stranger() -> None:
    result = run_cli(tfdist_cli.main, [*PLAN, "--zzzzzz"])
    assert_refused(result, PLAN)
    assert "did you mean" not in result[2]


def test_version() -> None:
    for main, prog in ((tfdist_cli.main, "tfdist"), (launch_cli.main, "tfdist-launch")):
        code, out, err = run_cli(main, ["--version"])
        assert (code, out, err) == (0, f"{prog} {tfdist.__version__}\n", "")


# Issue 17's cases, one by one (each failed before the fix).


def test_doctor_binary_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "binary"
    path.write_bytes(b"\xff\xfe\x00garbage")
    result = run_cli(tfdist_cli.main, ["doctor", "--tf-config", f"@{path}"])
    assert_refused(result, ["@binary"])
    assert "UTF-8 text file" in result[2]


def test_doctor_100k_nested_brackets_is_refused() -> None:
    result = run_cli(tfdist_cli.main, ["doctor", "--tf-config", "[" * 100_000])
    assert_refused(result, ["[" * 10])
    assert "nested a few levels deep" in result[2]


@pytest.mark.timeout(60)  # Before the fix, --probe nan looped forever.
def test_doctor_probe_nan_and_inf_are_refused() -> None:
    for value in ("nan", "inf", "0", "1e9"):
        argv = ["doctor", "--tf-config", VALID_TF_CONFIG, "--probe", value]
        assert_refused(run_cli(tfdist_cli.main, argv), argv)


def test_launch_not_executable_and_missing_programs_start_nothing(tmp_path: Path) -> None:
    script = str(tmp_path / "not-executable.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(script, stat.S_IRUSR | stat.S_IWUSR)
    for program, message in (
        (script, "execute permission"),
        ("/no/such/cmd", "an existing executable file"),
        (os.path.dirname(script), "an existing executable file"),
    ):
        before = _children()
        result = run_cli(launch_cli.main, ["--workers", "1", "--", program])
        assert_refused(result, [program])
        assert message in result[2]
        assert _children() - before == set()


def test_launch_log_dir_that_cannot_be_a_directory(tmp_path: Path) -> None:
    a_file = str(tmp_path / "a-file")
    with open(a_file, "w") as f:
        f.write("x")
    for log_dir in (a_file, os.path.join(a_file, "sub"), "/proc/no/such/dir", ""):
        result = run_cli(launch_cli.main, ["--workers", "1", "--log-dir", log_dir, "--", "true"])
        assert_refused(result, [log_dir])
        assert "--log-dir" in result[2]
        assert "started" not in result[2]


def test_data_service_workers_and_port_are_checked_before_tensorflow() -> None:
    for argv, message in (
        (["--workers", "-1"], "`--workers`. Received: -1"),
        (["--port", "70000"], "invalid port (0-65535) value: '70000'"),
    ):
        result = run_cli(data_service.main, argv)
        assert_refused(result, argv)
        assert message in result[2]


def test_plan_refuses_infinite_and_zero_inputs() -> None:
    for flag, value, message in (
        ("--params", "1e400", "`--params`. Received: inf"),
        ("--params", "1e300", "at most 1e+15"),
        ("--ps-shards", "0", "`--ps-shards`. Received: 0"),
        ("--ps-shards", "-2", "`--ps-shards`. Received: -2"),
        ("--device-memory", "0", "`--device-memory`. Received: 0.0"),
    ):
        argv = [*PLAN, flag, value, "--json"]
        result = run_cli(tfdist_cli.main, argv)
        assert_refused(result, argv)
        assert message in result[2]
        assert result[1] == ""  # Before the fix: "the replica fits", or JSON with Infinity.


def test_plan_json_is_strict_json() -> None:
    code, out, _ = run_cli(tfdist_cli.main, [*PLAN, "--latency", "1e-300s", "--json"])
    assert code == 0
    json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))
    with pytest.raises(PlanError, match="Invalid value for `params`"):
        Plan(params=float("nan"), workers=2, bandwidth=1e9, latency=1e-5)
    with pytest.raises(
        PlanError,
        match="Invalid value for `params`. Received: 1000000000000000.0. Expected sizes and rates whose estimates fit",
    ):
        Plan(params=1e15, workers=2, bandwidth=1e-300, latency=1e-5)


def test_collective_tuning_load_and_save(tmp_path: Path) -> None:
    tmp = str(tmp_path)
    path = os.path.join(tmp, "tuning.json")
    for body, message in (
        ('{"format": "tfdist-collective-tuning/1", "workers": "two"}', "`workers`"),
        ('{"format": "tfdist-collective-tuning/1", "timings_ms": {"0": "x"}}', "timings_ms"),
        ("[" * 100_000, "`tuning`"),
    ):
        with open(path, "w", encoding="utf-8") as f:
            f.write(body)
        with pytest.raises(StrategyError, match=message):
            CollectiveTuning.load(path)
    with pytest.raises(StorageError, match="Is a directory"):
        CollectiveTuning(bytes_per_pack=1 << 20).save(tmp)
    assert os.listdir(os.path.dirname(tmp)).count(os.path.basename(tmp)) == 1
    assert [n for n in os.listdir(os.path.dirname(tmp)) if n.startswith(os.path.basename(tmp) + ".tmp")] == []


def _run(argv: Sequence[str | bytes], **kwargs: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return subprocess.run([PY, *argv], env=env, capture_output=True, timeout=120, **kwargs)  # type: ignore[call-overload]


# What only a real process shows: a closed pipe, raw bytes in argv, the modules a refusal imports.


def test_closed_pipe_ends_quietly() -> None:
    for argv in (
        ["-m", "tfdist.cli.main", "doctor", "--tf-config", VALID_TF_CONFIG],
        ["-m", "tfdist.cli.main", *PLAN],
        ["-m", "tfdist.cli.launch", "--emit", "tf-config", "--workers", "3"],
    ):
        for buffered in (True, False):  # Block-buffered stdout fails at the flush, unbuffered at the write.
            env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
            env.update({} if buffered else {"PYTHONUNBUFFERED": "1"})
            read, write = os.pipe()
            os.close(read)  # `| head -0`: the reader is gone before the first write.
            try:
                done = subprocess.run([PY, *argv], stdout=write, stderr=subprocess.PIPE, env=env, timeout=120)
            finally:
                os.close(write)
            assert (done.returncode, done.stderr.decode()) == (141, ""), (argv, buffered)


def test_non_utf8_bytes_in_argv() -> None:
    for argv in (
        [b"-m", b"tfdist.cli.main", b"doctor", b"--tf-config", b"\xff\xfe"],
        [b"-m", b"tfdist.cli.launch", b"--workers", b"\xff", b"--", b"true"],
        [b"-m", b"tfdist.cli.launch", b"--workers", b"1", b"--", b"/no/\xff"],
    ):
        done = _run(argv)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count(b"\n") == 1, done.stderr
        assert b"Traceback" not in done.stderr


def test_refusing_bad_flags_does_not_import_tensorflow() -> None:
    script = """
import contextlib, io, sys
from tfdist.cli import launch, main
from tfdist.launch.tasks import data_service, server
cases = [(main.main, ["doctor", "--probe", "nan"]), (main.main, ["plan", "--params", "1e400", "--workers", "2",
         "--bandwidth", "1Gbps", "--latency", "1ms"]), (main.main, ["data-report", "x", "--label-key", "y",
         "--workers", "-1"]), (launch.main, ["--timeout", "nan", "--", "true"]),
         (data_service.main, ["--workers", "-1"]), (server.main, ["--exit-with-chief", "-1"])]
for fn, argv in cases:
    with contextlib.redirect_stderr(io.StringIO()):
        assert fn(argv) == 2, argv
print(sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"))
"""
    done = _run(["-c", script])
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == "[]"
