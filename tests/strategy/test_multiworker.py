"""Real TensorFlow clusters on 127.0.0.1: MWMS and PS training, restarts, isolation (bounded, always reaped)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.strategy import _tasks_multiworker as multiworker_tasks
from tests.support import cluster_tasks
from tests.support.processes import assert_all_gone, reaches_own_process
from tfdist import launch, testing
from tfdist.launch.events import KillAt

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
# Seconds from SIGTERM to SIGKILL when a group restart stops the workers a fault left: each sits in a collective
# with its lost peer and TF's preemption notifier takes the SIGTERM, so only the SIGKILL ends it.
GRACE = 1


def _attempts(log_path: str, task: str) -> dict[int, list[int]]:
    """restart -> epochs finished, from the per-task epoch log."""
    attempts: dict[int, list[int]] = {}
    for line in Path(f"{log_path}.{task.replace(':', '-')}").read_text().split("\n"):
        if line:
            restart, epoch = map(int, line.split())
            attempts.setdefault(restart, []).append(epoch)
    return attempts


def _without_tf_log_level() -> dict[str, str]:
    """The environment a user's shell has: no TF_CPP_MIN_LOG_LEVEL (the launcher then sets 1)."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


# TensorFlow's start-up noise on this CPU-only machine, TF 2.17 to 2.21 (issue #11): none may reach the console.
_NOISE = (
    "Unable to register cu",
    "TF-TRT Warning",
    "absl::InitializeLog",
    "Started server with target",
    "oneDNN custom operations",
    "Could not find cuda drivers",
    "failed call to cuInit",
    "rebuild TensorFlow",
    "SessionOptions",
    "RuntimeWarning",
)


def _assert_quiet_console(console: str, log_dir: str, tasks: tuple[str, ...]) -> None:
    """No TF noise on the console; the log files keep it, and every line the console left out."""
    from tfdist.launch.output import NoiseFilter

    for noise in _NOISE:
        assert noise not in console
    for task in tasks:
        with open(os.path.join(log_dir, task.replace(":", "-") + ".log"), encoding="utf-8") as f:
            logged = f.read().splitlines()[1:]  # After the launcher's '--- tfdist-launch: TASK start #0'.
        keep = NoiseFilter()
        kept = [line for line in logged if keep(line)]
        assert len(logged) > len(kept), task  # TF's noise is there, in the file ...
        shown = [line[len(task) + 3 :] for line in console.splitlines() if line.startswith(f"[{task}] ")]
        assert shown == kept, task  # ... and the console shows every other line of the task.


def test_auto_strategy_two_workers_identical_weights() -> None:
    run = testing.run_cluster(multiworker_tasks.mwms_fit, workers=2, timeout=180)
    assert run.ok, run.result.summary()
    a, b = run.values["worker:0"], run.values["worker:1"]
    for value in (a, b):
        assert value["is_mwms"]
        assert value["replicas"] == 2
        assert value["loss"][-1] < value["loss"][0]
    assert a["fingerprint"] == b["fingerprint"]
    assert (a["is_chief"], b["is_chief"]) == (True, False)
    np.testing.assert_allclose(a["weights"], b["weights"], rtol=0, atol=1e-6)
    assert_all_gone([t.pid for t in run.result.tasks])


def test_cli_runs_a_script_on_both_workers(tmp_path: Path) -> None:
    logs = str(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdist.cli.launch",
            "--workers",
            "2",
            "--timeout",
            "180",
            "--log-dir",
            logs,
            "--",
            sys.executable,
            str(REPO / "scripts" / "demo_train.py"),
            "--epochs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=_without_tf_log_level(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(m) for m in re.findall(r"^\[worker:\d\] RESULT (.*)$", done.stdout, re.M)]
    assert len(results) == 2
    assert len({r["weights_sha1"] for r in results}) == 1
    assert [r["replicas"] for r in results] == [2, 2]
    # Issue 11: the user's tasks import TF too; their start-up noise stays in the log files, off the console.
    _assert_quiet_console(done.stdout + done.stderr, logs, ("worker:0", "worker:1"))


def test_cli_shows_a_real_tensorflow_error_but_not_the_noise(tmp_path: Path) -> None:
    logs = str(tmp_path)
    missing = os.path.join(logs, "no-such-file")
    code = f"import tensorflow as tf\nprint('user line before the error', flush=True)\ntf.io.read_file({missing!r})\n"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdist.cli.launch",
            "--workers",
            "1",
            "--timeout",
            "120",
            "--log-dir",
            logs,
            "--",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=_without_tf_log_level(),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    console = done.stdout + done.stderr
    # TF's own error, as its C++ log line (a W record of op_kernel.cc) and as the Python exception.
    assert re.search(rf"\[worker:0\] .*OP_REQUIRES failed .*NOT_FOUND: {re.escape(missing)}", console)
    assert re.search(r"\[worker:0\] tensorflow\.python\.framework\.errors_impl\.NotFoundError: ", console)
    assert "[worker:0] Traceback (most recent call last):" in console
    assert "[worker:0] user line before the error" in console
    _assert_quiet_console(console, logs, ("worker:0",))


def test_pipeline_shards_from_tf_config_and_fits(tmp_path: Path) -> None:
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    rng = np.random.default_rng(0)
    prefix = os.path.join(tmp_path, "train")
    write_tfrecords(
        (
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=8))),
                        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                    }
                )
            )
            for i in range(643)
        ),
        prefix,
        num_shards=4,
    )
    run = testing.run_cluster(multiworker_tasks.mwms_pipeline, workers=2, timeout=180, args=[prefix])
    assert run.ok, run.result.summary()
    a, b = run.values["worker:0"], run.values["worker:1"]
    assert sorted(a["ids"] + b["ids"]) == list(range(643))  # Each record once per epoch.
    # Uneven shares (643 records over the resumable order's streams); which worker holds the extra
    # record depends on the order's cut, not on the worker.
    assert (sorted([len(a["ids"]), len(b["ids"])]), a["plan"]) == ([321, 322], "file")
    assert a["loss"] == pytest.approx(b["loss"], abs=0.5e-5)
    # Partial and uneven last batches: fit and evaluate still see every record once.
    assert (a["fit_examples"], b["fit_examples"]) == (643, 643)
    assert (a["evaluated"], b["evaluated"]) == (643, 643)


def test_launcher_data_service_splits_records_between_workers(tmp_path: Path) -> None:
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    prefix = os.path.join(tmp_path, "svc")
    write_tfrecords(
        (
            tf.train.Example(
                features=tf.train.Features(feature={"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))})
            )
            for i in range(400)
        ),
        prefix,
        num_shards=8,
    )
    run = testing.run_cluster(
        multiworker_tasks.service_consumer, workers=2, timeout=180, args=[prefix], data_service_workers=2
    )
    assert run.ok, run.result.summary()
    ids = run.values["worker:0"]["ids"] + run.values["worker:1"]["ids"]
    assert sorted(ids) == list(range(400))  # One shared job: each record to one consumer.


def test_crash_once_restarts_group_and_resumes_from_backup(tmp_path: Path) -> None:
    tmp = str(tmp_path)
    log, marker = os.path.join(tmp, "epochs"), os.path.join(tmp, "crashed")
    run = testing.run_cluster(
        multiworker_tasks.mwms_backup_fit,
        workers=2,
        timeout=240,
        max_restarts=1,
        grace_seconds=GRACE,
        args=[os.path.join(tmp, "backup"), log, 5, marker],
    )
    assert run.ok, run.result.summary()
    assert [t.restarts for t in run.result.tasks] == [1, 1]
    attempts = _attempts(log, "worker:0")
    assert attempts[0][:2] == [0, 1]
    assert attempts[1][0] >= 1, attempts  # Resumed from the backup, not from zero.
    assert attempts[1][-1] == 4
    assert len(attempts[1]) < 5


def test_killed_worker_restarts_group_and_resumes_from_backup(tmp_path: Path) -> None:
    tmp = str(tmp_path)
    log = os.path.join(tmp, "epochs")
    statuses: list[str] = []
    # Kill worker 1 once worker 0 has backed up epoch 2 (held there): the fault lands there however slow the machine.
    run = testing.run_cluster(
        multiworker_tasks.mwms_backup_fit,
        workers=2,
        timeout=240,
        max_restarts=1,
        grace_seconds=GRACE,
        kills=("worker:1@after=^EPOCH_END worker:0 0 2$",),
        on_status=statuses.append,
        args=[os.path.join(tmp, "backup"), log, 6, "", 2],
    )
    assert run.ok, run.result.summary()
    assert len([s for s in statuses if "fault injection: SIGKILL worker:1 after worker:0" in s]) == 1
    assert [t.restarts for t in run.result.tasks] == [1, 1]
    attempts = _attempts(log, "worker:0")
    assert attempts[0][:3] == [0, 1, 2], attempts
    assert attempts[1][0] >= 3, attempts  # Resumed after the backed-up epoch 2, not from zero.
    assert attempts[1][0] >= attempts[0][-1], attempts
    assert attempts[1][-1] == 5


def test_fit_and_evaluate_with_sharded_embedding(tmp_path: Path) -> None:
    shown: list[tuple[str, str]] = []
    logs = str(tmp_path)
    run = testing.run_cluster(
        cluster_tasks.ps_fit,
        workers=2,
        ps=2,
        chief=True,
        timeout=240,
        log_dir=logs,
        on_line=lambda task, line: shown.append((task, line)),
    )
    assert run.ok, run.result.summary()
    # Issue 11: the TF servers' console output reads well: no runpy warning, no ConfigProto dump, but
    # tfdist's own lines; the full TF INFO output stays in the task's log file.
    for server in ("worker:0", "worker:1", "ps:0", "ps:1"):
        lines = [line for task, line in shown if task == server]
        assert f"TensorFlow server {server} up" in "\n".join(lines)
        for noise in (
            "RuntimeWarning",
            "SessionOptions",
            "device_count {",
            "allow_soft_placement",
            "Started server with target",
            "absl::InitializeLog",
        ):
            assert noise not in "\n".join(lines), server
    with open(os.path.join(logs, "ps-0.log"), encoding="utf-8") as f:
        # TF's absl records (e.g. "E0000 12:00:00.000000  1234 cuda_platform.cc:52] ...") stay in the file
        # (TF 2.17 also dumps SessionOptions there; 2.21 no longer does). The "absl::InitializeLog" notice
        # comes at TF 2.21's import: a task forked from a preloaded server (run_cluster's default) never prints it.
        assert re.search(r"^[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ", f.read(), re.M)
    value = run.values["chief:0"]
    assert value["is_ps"]
    assert value["loss"][-1] < value["loss"][0]
    assert value["eval_loss"] > 0
    assert "`compression`. Received: 'powersgd'" in value["compressor_refused"]
    assert "Use MultiWorkerMirroredStrategy for PowerSGD or top-k" in value["compressor_refused"]
    assert sorted(d.split("/device")[0] for d in value["shard_devices"]) == [
        "/job:ps/replica:0/task:0",
        "/job:ps/replica:0/task:1",
    ]
    assert value["shard_rows"] == [500, 500]
    # TF's PS guide: the coordinator needs inter-op threads >= workers + 1 on small machines.
    assert value["inter_op_threads"] == (4 if (os.cpu_count() or 1) < 4 else 0)
    assert set(run.values) == {"chief:0"}  # Workers and ps ran tfdist's TF server, not the function.


def test_killed_worker_is_restarted_alone_and_training_finishes() -> None:
    statuses: list[str] = []
    run = testing.run_cluster(
        cluster_tasks.ps_fit,
        workers=2,
        ps=1,
        chief=True,
        timeout=240,
        max_restarts=1,
        kills=(KillAt(task="worker:1", after="^EPOCH_END 1$"),),
        on_status=statuses.append,
        args=[6, 20, 0.2],
    )
    assert run.ok, run.result.summary()
    assert len([s for s in statuses if "fault injection: SIGKILL worker:1 after chief:0" in s]) == 1
    restarts = {t.task: t.restarts for t in run.result.tasks}
    assert restarts == {"chief:0": 0, "worker:0": 0, "worker:1": 1, "ps:0": 0}
    assert len(run.values["chief:0"]["loss"]) == 6


def test_ports_unreachable_from_outside_while_training_inside(tmp_path: Path) -> None:
    statuses: list[str] = []
    probes: dict[str, bool] = {}
    probed = str(tmp_path / "probed")

    def _on_line(task: str, line: str) -> None:
        if line == "READY" and not probes:
            ports = re.findall(r"started \(command, pid \d+, (127\.0\.0\.1:\d+)\)", "\n".join(statuses))
            for address in ports:
                probes[address] = reaches_own_process(address)
            Path(probed).touch()  # The tasks wait for this before they train.

    run = testing.command_for(cluster_tasks.ready_then_fit, [120.0, probed])
    result = launch.run(run, workers=2, timeout=180, isolate_network=True, on_line=_on_line, on_status=statuses.append)
    assert result.exit_code == 0, result.summary()
    assert len(probes) == 2
    assert set(probes.values()) == {False}  # Refused from outside the namespace...
    outputs = [result.task(t).output for t in ("worker:0", "worker:1")]
    assert all('"replicas": 2' in out for out in outputs)  # ...while training inside succeeded.
    assert any("network namespace: private" in s for s in statuses)
