"""The Spark engine on a real standalone Spark (a master and a worker on 127.0.0.1, started by the tests).

The CLI tests run ``tfdist-launch --engine spark`` as a user would (each starts its own driver and session,
a JVM of its own); the Python API tests share one SparkSession of this process, as a notebook has.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pyspark_sql = pytest.importorskip("pyspark.sql", reason='pyspark is not installed; pip install ".[spark]"')

from tests.conftest import SPARK_CONF
from tests.support import SUPPORT, exact_tasks
from tests.support.processes import assert_all_gone
from tfdist import ClusterSpec, EngineError, LaunchError, testing
from tfdist.data import write_tfrecords
from tfdist.launch import run_function
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.spark.engine import SparkEngine
from tfdist.launch.events import KillAt
from tfdist.launch.supervisor.runner import run_config

pytestmark = [pytest.mark.spark, pytest.mark.multiprocess, pytest.mark.timeout(400)]
PY = sys.executable
SPARK_CONF_FLAGS = [flag for key, value in SPARK_CONF.items() for flag in ("--spark-conf", f"{key}={value}")]
ENV_REPORT = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in ['TF_CONFIG', 'TF_USE_LEGACY_KERAS', "
    "'TFDIST_TASK', 'TFDIST_RESTART', 'TFDIST_DATA_SERVICE', 'FROM_LAUNCHER']}), os.getcwd())"
)


def _values(result: Any) -> dict[str, Any]:
    values = {}
    for task in result.tasks:
        for line in task.output.splitlines():
            if line.startswith(testing.RESULT_PREFIX):
                values[task.task] = json.loads(line[len(testing.RESULT_PREFIX) :])
    return values


def test_tasks_get_their_env_output_and_data_service_and_the_session_stays(spark_session: Any, tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    statuses: list[str] = []
    config = LaunchConfig(
        command=(PY, "-c", ENV_REPORT),
        workers=2,
        chief=True,
        evaluator=True,
        data_service_workers=1,
        log_dir=str(tmp_path),
        timeout=120,
        env={"FROM_LAUNCHER": "yes"},
    )
    result = run_config(
        config,
        engine=SparkEngine(spark=spark_session),
        on_line=lambda task, line: lines.append((task, line)),
        on_status=statuses.append,
    )
    assert (result.exit_code, result.reason) == (0, "ok"), result.summary()
    services, fingerprints = set(), set()
    for task in ("chief:0", "worker:0", "worker:1", "evaluator:0"):
        report, cwd = result.task(task).output.splitlines()[-1].rsplit(" ", 1)
        env = json.loads(report)
        spec = ClusterSpec.from_tf_config(env["TF_CONFIG"])
        assert spec.task is not None and spec.task.name == task
        assert all(t.address.startswith("127.0.0.1:") for t in spec.tasks())
        fingerprints.add(spec.fingerprint)
        services.add(env["TFDIST_DATA_SERVICE"])
        assert (env["TF_USE_LEGACY_KERAS"], env["TFDIST_TASK"], env["TFDIST_RESTART"]) == ("1", task, "0")
        assert env["FROM_LAUNCHER"] == "yes"
        assert cwd == os.getcwd()  # The driver's directory, which exists on this executor's host.
        assert any(t == task for t, _ in lines)
        assert report in (tmp_path / f"{task.replace(':', '-')}.log").read_text()
    assert len(fingerprints) == 1 and fingerprints == {result.cluster.fingerprint}
    assert len(services) == 1 and services.pop().startswith("grpc://127.0.0.1:")
    assert any("tf.data service started" in s for s in statuses), statuses
    assert len({t.address for t in result.cluster.tasks()}) == 4
    assert_all_gone([t.pid for t in result.tasks])
    # The engine leaves a session it did not start running, and its barrier stage ended: the next run gets
    # every slot again.
    assert spark_session.range(3).count() == 3
    again = run_config(
        LaunchConfig(command=(PY, "-c", "pass"), workers=6, timeout=60), engine=SparkEngine(spark=spark_session)
    )
    assert again.exit_code == 0, again.summary()


def test_a_notebook_function_runs_by_value_on_the_active_session(spark_session: Any) -> None:
    # A notebook cell: a closure over the cell's variables, run with engine="spark" on the session it has.
    offset = 40

    def train(scale: int) -> dict[str, Any]:
        import os

        spec = json.loads(os.environ["TF_CONFIG"])
        return {"value": scale * offset, "task": os.environ["TFDIST_TASK"], "workers": len(spec["cluster"]["worker"])}

    run = run_function(train, args=(2,), workers=3, engine="spark", timeout=120)
    assert run.ok, run.result.summary()
    assert run.values == {f"worker:{i}": {"value": 80, "task": f"worker:{i}", "workers": 3} for i in range(3)}
    # From another thread too, where getActiveSession() is None: the engine still finds the process's session
    # (and so does not start one around its SparkContext, which it would stop at the end).
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(run_function(train, args=(1,), workers=2, engine="spark")))
    worker.start()
    worker.join(120)
    assert done and done[0].ok and done[0].values["worker:1"]["value"] == 40
    assert spark_session.range(3).count() == 3  # The session was not stopped.


def test_mwms_crash_mid_epoch_restarts_in_the_barrier_tasks_and_resumes_exactly(
    spark_session: Any, tmp_path: Path
) -> None:
    # Issue 29 (and 24 on Spark): the data is a DataFrame written to TFRecords by the executors (12 partitions, 12
    # shards). Worker 1 is SIGKILLed once the leader printed batch 10 of epoch 1; both programs restart in their
    # barrier tasks at the same addresses, from the backup (every 4 batches), and every record is trained on exactly
    # once per epoch, counted in a weight the backup restores; the weights equal SGD's in numpy.
    prefix = str(tmp_path / "part")
    rng = np.random.default_rng(0)  # The values exact_tasks.write_data writes, which ideal_weights recomputes.
    x = rng.normal(size=(exact_tasks.RECORDS, exact_tasks.FEATURES_DIM)).astype("float32")
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], "float32") + 0.25
    rows = [(i, x[i].tolist(), float(y[i])) for i in range(exact_tasks.RECORDS)]
    # Range-partitioned by id: 40 consecutive records a partition. The rows come from one task, through a shuffle: a
    # write's task then runs only its writer's Python worker (which imports TF), not a second one feeding it, so the
    # 12 tasks find the same 6 workers (one a slot), TF imported.
    rdd = spark_session.sparkContext.parallelize(rows, 1)
    frame = spark_session.createDataFrame(rdd, "id long, x array<float>, y float")
    frame = frame.repartitionByRange(exact_tasks.FILES, "id")
    assert len(write_tfrecords(frame, prefix)) == exact_tasks.FILES
    reference = np.array(exact_tasks.ideal_weights(prefix, epochs=3))
    config = LaunchConfig(
        command=tuple(
            testing.command_for(
                exact_tasks.counted_fit,
                (str(tmp_path), prefix, {"shard_policy": "data", "backup": "plain", "hold_at": [1, 10]}),
            )
        ),
        workers=2,
        timeout=300,
        max_restarts=1,
        # Held worker:0 outlives the restart's SIGTERM (TF's coordination service takes it as a preemption notice):
        # its stop waited out the whole default grace of 5 s.
        grace_seconds=1,
        kills=(KillAt(task="worker:1", after="^STEP 1 10$"),),
    )
    result = run_config(config, engine=SparkEngine(spark=spark_session))
    assert result.exit_code == 0, result.summary()
    assert [t.restarts for t in result.tasks] == [1, 1]
    values = _values(result)
    for task in ("worker:0", "worker:1"):
        assert collections.Counter(values[task]["counts"]) == {3: exact_tasks.RECORDS}, (task, values[task]["counts"])
        np.testing.assert_allclose(values[task]["weights"], reference, rtol=0, atol=2e-5)
        assert values[task]["restart"] == 1
    resumed = re.findall(r"Input resumes at epoch 1, step (\d+)", result.task("worker:0").output)
    assert len(resumed) == 1 and int(resumed[0]) % 4 == 0, resumed


def _executor_pids(app_id: str) -> list[int]:
    """The executor JVMs of Spark application ``app_id`` on this machine."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv and app_id.encode() in argv:
                found.append(int(entry))
    return found


def test_a_lost_executor_relaunches_the_stage_and_the_tasks_restart_at_their_addresses(spark_session: Any) -> None:
    # Spark relaunches a whole barrier stage when an executor dies; the new barrier tasks phone the driver again,
    # get their old addresses back (same host, ports free again) and the runner restarts the programs there.
    # The executor is SIGKILLed once both programs said they are up (on progress).
    script = (
        "import os, sys, time\n"
        "print('UP', os.environ['TFDIST_RESTART'], flush=True)\n"
        "if os.environ['TFDIST_RESTART'] == '0': time.sleep(300)"
    )
    up: set[str] = set()
    killed: list[int] = []

    def _on_line(task: str, line: str) -> None:
        if line == "UP 0":
            up.add(task)
            if len(up) == 2 and not killed:
                killed.extend(_executor_pids(spark_session.sparkContext.applicationId))
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)

    config = LaunchConfig(command=(PY, "-c", script), workers=2, max_restarts=1, timeout=240, grace_seconds=2)
    result = run_config(config, engine=SparkEngine(spark=spark_session), on_line=_on_line)
    assert len(killed) == 1, killed
    assert result.exit_code == 0, result.summary()
    assert [t.restarts for t in result.tasks] == [1, 1]
    for task in ("worker:0", "worker:1"):
        assert "UP 1" in result.task(task).output.splitlines()
    assert_all_gone([t.pid for t in result.tasks])
    # The session got a new executor and runs the next job.
    again = run_config(LaunchConfig(command=(PY, "-c", "pass"), workers=2), engine=SparkEngine(spark=spark_session))
    assert again.exit_code == 0, again.summary()


def test_cli_killed_driver_leaves_nothing_running_on_the_executors(spark_cluster: Any) -> None:
    # SIGKILL to tfdist-launch and its driver JVM once both programs are up: the lifelines break and the Spark
    # application ends,
    # and each program is stopped (by its barrier task, or with the task's Python worker by the parent-death signal).
    script = "import time; print('UP', flush=True); time.sleep(300)"
    argv = [PY, "-m", "tfdist.cli.launch", "--engine", "spark", "--spark-master", spark_cluster.master]
    argv += [*SPARK_CONF_FLAGS, "--workers", "2", "--timeout", "200", "--", PY, "-c", script]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids: list[int] = []
    try:
        up = 0
        deadline = time.monotonic() + 120
        while (up < 2 or len(pids) < 2) and time.monotonic() < deadline:
            line = proc.stderr.readline() if len(pids) < 2 else proc.stdout.readline()  # type: ignore[union-attr]
            pids += _started_pids(line)
            up += line.rstrip().endswith("] UP")
        assert up == 2 and len(pids) == 2, (up, pids)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # The launcher and its driver JVM, as when the driver's machine fails.
        proc.wait(30)
    assert_all_gone(pids, within=60)


def _cli(master: str, args: list[str], timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [PY, "-m", "tfdist.cli.launch", "--engine", "spark", "--spark-master", master, *SPARK_CONF_FLAGS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start


def _started_pids(stderr: str) -> list[int]:
    return [int(p) for p in re.findall(r"started \([^,]+, pid (\d+)", stderr)]


def _results(stdout: str) -> dict[str, dict[str, Any]]:
    return {task: json.loads(value) for task, value in re.findall(r"^\[(\w+:\d)\] RESULT (.*)$", stdout, re.M)}


def test_cli_tutorial_mwms_script_trains_identically_and_nothing_is_left(spark_cluster: Any, tmp_path: Path) -> None:
    done, _ = _cli(
        spark_cluster.master,
        ["--workers", "2", "--timeout", "300", "--log-dir", str(tmp_path), "--", PY, str(SUPPORT / "tutorial_mwms.py")],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(done.stdout)
    assert set(results) == {"worker:0", "worker:1"}, done.stdout[-2000:]
    assert len({r["weights_sha1"] for r in results.values()}) == 1
    assert [r["replicas"] for r in results.values()] == [2, 2]
    assert "RESULT" in (tmp_path / "worker-1.log").read_text()
    assert "Spark placed 2 tasks" in done.stderr
    pids = _started_pids(done.stderr)
    assert len(pids) == 2, done.stderr
    assert_all_gone(pids)


def test_tutorial_ps_script_runs_on_the_chief_beside_tfdist_servers(spark_session: Any, tmp_path: Path) -> None:
    config = LaunchConfig(
        command=(PY, str(SUPPORT / "tutorial_ps.py")),
        chief=True,
        workers=2,
        ps=1,
        timeout=300,
        env={"TUTORIAL_DIR": str(tmp_path)},
    )
    result = run_config(config, engine=SparkEngine(spark=spark_session))
    assert result.exit_code == 0, result.summary()
    results = _results("\n".join(f"[{t.task}] {line}" for t in result.tasks for line in t.output.splitlines()))
    assert set(results) == {"chief:0"}  # Workers and ps ran tfdist's TF server.
    assert results["chief:0"]["ps"] and results["chief:0"]["workers"] == 2
    assert len(results["chief:0"]["loss"]) == 5
    for task in ("worker:0", "worker:1", "ps:0"):
        assert f"INFO tfdist.launch.server: TensorFlow server {task} up" in result.task(task).output
    assert (tmp_path / "backup").is_dir()
    assert_all_gone([t.pid for t in result.tasks])


def test_a_failing_task_or_the_timeout_ends_the_run_fast_and_nothing_is_left(spark_session: Any) -> None:
    script = "import os, sys, time\nif os.environ['TFDIST_TASK'] == 'worker:1': sys.exit(7)\ntime.sleep(120)"
    statuses: list[str] = []
    start = time.monotonic()
    config = LaunchConfig(command=(PY, "-c", script), workers=3, grace_seconds=2, timeout=200)
    result = run_config(config, engine=SparkEngine(spark=spark_session), on_status=statuses.append)
    assert (result.exit_code, result.failed_task) == (7, "worker:1"), result.summary()
    assert time.monotonic() - start < 60  # Without fail-fast it would take 120 s.
    assert any("worker:1 ended the run" in s for s in statuses), statuses
    assert_all_gone([t.pid for t in result.tasks])
    # The run's timeout stops every task in its barrier task.
    start = time.monotonic()
    config = LaunchConfig(command=(PY, "-c", "import time; time.sleep(120)"), workers=2, timeout=3, grace_seconds=1)
    result = run_config(config, engine=SparkEngine(spark=spark_session))
    assert (result.exit_code, result.reason) == (124, "timeout"), result.summary()
    assert time.monotonic() - start < 30
    assert_all_gone([t.pid for t in result.tasks])


def test_what_spark_refuses_is_refused_first_with_the_fix(spark_session: Any) -> None:
    # Too few slots: the application has 6; a barrier stage of 7 would hang in Spark's slot check.
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"needs 7 task slots at once.*the application has 6") as caught:
        run_config(LaunchConfig(command=(PY, "-c", "pass"), workers=7), engine=SparkEngine(spark=spark_session))
    assert time.monotonic() - start < 30 and caught.value.field == "workers"
    # Executors whose Python lacks tfdist: this venv's base interpreter (same version, none of its packages),
    # as a notebook session started with another PYSPARK_PYTHON has.
    base = os.path.realpath(sys.executable)
    context = spark_session.sparkContext
    ours, context.pythonExec = context.pythonExec, base
    try:
        with pytest.raises(EngineError, match=rf"not importable by the Python the Spark executors run \({base} on"):
            run_config(LaunchConfig(command=(PY, "-c", "pass"), workers=2), engine=SparkEngine(spark=spark_session))
    finally:
        context.pythonExec = ours
    # Elastic options: a barrier stage has a fixed number of tasks.
    with pytest.raises(LaunchError, match="`min_workers`.*fixed number of tasks"):
        run_config(
            LaunchConfig(command=(PY, "-c", "pass"), workers=3, min_workers=2), engine=SparkEngine(spark=spark_session)
        )
    # The session is still good for the next job.
    again = run_config(LaunchConfig(command=(PY, "-c", "pass"), workers=2), engine=SparkEngine(spark=spark_session))
    assert again.exit_code == 0, again.summary()


def test_cli_refuses_dynamic_allocation_and_names_its_flags(spark_cluster: Any) -> None:
    done, _ = _cli(
        spark_cluster.master,
        ["--workers", "2", "--spark-conf", "spark.dynamicAllocation.enabled=true", "--", PY, "-c", "pass"],
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "spark.dynamicAllocation.enabled=false" in done.stderr and "`--spark-conf`" in done.stderr
    done, _ = _cli(spark_cluster.master, ["--spark-conf", "task.cpus", "--", PY, "-c", "pass"], timeout=60)
    assert done.returncode == 2 and "expected KEY=VALUE" in done.stderr
    done, _ = _cli(spark_cluster.master, ["--workers", "3", "--min-workers", "2", "--", PY, "-c", "pass"], timeout=60)
    assert done.returncode == 2 and "`--min-workers`" in done.stderr, done.stderr[-2000:]
