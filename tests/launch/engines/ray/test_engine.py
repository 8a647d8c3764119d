"""The Ray engine on a real Ray, started by the tests on 127.0.0.1: placement, environment, restarts, faults.

Ray is heavy (about 1 GB, seconds to start), so one Ray head (`ray start --head`, as a user would run it) is
shared by the tests that join a cluster; the CLI tests start their own local Ray, as `tfdist-launch --engine ray`
does without --ray-address, and check that none of it is left afterwards.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfdist.launch.engines.ray.engine import LOOPBACK_VAR

# Before Ray is imported anywhere in this process: every Ray daemon and worker binds to loopback. The test
# cluster is loopback-only, so it runs without Ray's token authentication (a join with an explicit address
# would otherwise need RAY_AUTH_MODE=token in the driver; see docs/ray.md).
os.environ.setdefault(LOOPBACK_VAR, "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray", reason='Ray is not installed; pip install ".[ray]"')

from tests.support import (
    exact_tasks,
    mesh_tasks,
    ray_tasks,
)
from tests.support.processes import assert_all_gone
from tests.support.ray_helpers import STOP_AT_ONCE, stop_ray_block
from tfdist import ClusterSpec, EngineError, testing
from tfdist.cluster import address as _address
from tfdist.cluster.probe import can_connect
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.ray.engine import RayEngine
from tfdist.launch.events import KillAt
from tfdist.launch.supervisor.runner import run_config

pytestmark = [pytest.mark.ray, pytest.mark.multiprocess, pytest.mark.timeout(400)]
REPO = Path(__file__).resolve().parents[4]
PY = sys.executable
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
ENV_REPORT = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in ['TF_CONFIG', 'TF_USE_LEGACY_KERAS', "
    "'TF_NUM_INTRAOP_THREADS', 'TF_NUM_INTEROP_THREADS', 'TFDIST_TASK', 'TFDIST_RESTART', "
    "'TFDIST_DATA_SERVICE', 'FROM_LAUNCHER']}))"
)
_RAY_DAEMONS = ("raylet", "gcs_server")


def _processes(names: tuple[str, ...]) -> set[int]:
    """Pids of running processes whose command name is one of ``names``."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                found.add(int(entry))
    return found


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A one-node Ray cluster on 127.0.0.1 (`ray start --head --block`); yields its address."""
    port, client_port = _address.free_ports(2)
    proc = subprocess.Popen(
        [
            RAY_CLI,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=6",
            "--node-ip-address=127.0.0.1",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--ray-client-server-port={client_port}",
        ],
        env=dict(os.environ, **{LOOPBACK_VAR: "0", "RAY_AUTH_MODE": "disabled"}, **STOP_AT_ONCE),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        assert can_connect(address, timeout=90), "ray start --head did not come up"
        yield address
    finally:
        stop_ray_block(proc)


def _run(
    target: Any,
    address: str,
    *,
    args: tuple = (),
    lines: list | None = None,
    statuses: list | None = None,
    engine_options: dict | None = None,
    **options: Any,
) -> tuple[Any, dict[str, Any]]:
    """Runs ``target`` on the Ray at ``address``; returns the result and each task's returned value."""
    config = LaunchConfig(command=tuple(testing.command_for(target, args)), **options)
    sink = (lambda task, line: lines.append((task, line))) if lines is not None else None
    result = run_config(
        config,
        engine=RayEngine(address=address, **(engine_options or {})),
        on_line=sink,
        on_status=statuses.append if statuses is not None else None,
    )
    values = {}
    for task in result.tasks:
        for line in task.output.splitlines():
            if line.startswith(testing.RESULT_PREFIX):
                values[task.task] = json.loads(line[len(testing.RESULT_PREFIX) :])
    return result, values


def test_joined_cluster_tasks_get_their_env_output_and_data_service(ray_head: str, tmp_path: Path) -> None:
    lines: list[tuple[str, str]] = []
    statuses: list[str] = []
    config = LaunchConfig(
        command=(PY, "-c", ENV_REPORT),
        workers=2,
        chief=True,
        evaluator=True,
        threads_per_task=1,
        data_service_workers=1,
        log_dir=str(tmp_path),
        timeout=120,
        env={"FROM_LAUNCHER": "yes"},
    )
    result = run_config(
        config,
        engine=RayEngine(address=ray_head, placement="spread"),
        on_line=lambda task, line: lines.append((task, line)),
        on_status=statuses.append,
    )
    assert (result.exit_code, result.reason) == (0, "ok"), result.summary()
    services, fingerprints = set(), set()
    for task in ("chief:0", "worker:0", "worker:1", "evaluator:0"):
        env = json.loads(result.task(task).output.splitlines()[-1])
        spec = ClusterSpec.from_tf_config(env["TF_CONFIG"])
        assert spec.task is not None and spec.task.name == task
        assert all(t.address.startswith("127.0.0.1:") for t in spec.tasks())  # Loopback only.
        fingerprints.add(spec.fingerprint)
        services.add(env["TFDIST_DATA_SERVICE"])
        assert (env["TF_USE_LEGACY_KERAS"], env["TFDIST_TASK"], env["TFDIST_RESTART"]) == ("1", task, "0")
        assert (env["TF_NUM_INTRAOP_THREADS"], env["FROM_LAUNCHER"]) == ("1", "yes")
        assert any(t == task for t, _ in lines)
        assert result.task(task).output.splitlines()[-1] in (tmp_path / f"{task.replace(':', '-')}.log").read_text()
    assert len(fingerprints) == 1 and fingerprints == {result.cluster.fingerprint}
    assert len(services) == 1 and services.pop().startswith("grpc://127.0.0.1:")
    assert any("tf.data service started" in s for s in statuses), statuses
    assert len({t.address for t in result.cluster.tasks()}) == 4  # Every task drew its own port.
    assert not ray.is_initialized()  # The run left the cluster ...
    assert can_connect(ray_head, timeout=5)  # ... and the cluster is still up.


def test_a_job_the_cluster_cannot_hold_is_an_engine_error(ray_head: str) -> None:
    config = LaunchConfig(command=(PY, "-c", "pass"), workers=2)
    start = time.monotonic()
    with pytest.raises(EngineError, match=r"could not hold the job.*cpus-per-task") as caught:
        run_config(config, engine=RayEngine(address=ray_head, cpus_per_task=64, ready_timeout=1))
    assert time.monotonic() - start < 60
    assert caught.value.field == "placement group"
    assert not ray.is_initialized()
    # The placement group was removed: the whole cluster is free for the next job.
    result, _ = _run([PY, "-c", "pass"], ray_head, workers=2, timeout=60, engine_options={"cpus_per_task": 3})
    assert result.exit_code == 0, result.summary()


def test_mwms_crash_mid_epoch_resumes_at_the_next_record_on_ray(ray_head: str, tmp_path: Path) -> None:
    # Issue 24 on Ray: worker 1 is SIGKILLed once the leader printed batch 10 of epoch 1; the whole group restarts
    # from the backup (BackupAndRestore every 4 batches + ResumeInput) and every record is trained on exactly
    # once per epoch, counted in a weight the backup restores; the weights equal SGD's in numpy.
    prefix = str(tmp_path / "part")
    exact_tasks.write_data(prefix)
    reference = np.array(exact_tasks.ideal_weights(prefix, epochs=3))
    result, values = _run(
        exact_tasks.counted_fit,
        ray_head,
        workers=2,
        timeout=300,
        max_restarts=1,
        grace_seconds=1,  # MWMS tasks ignore SIGTERM (TF's preemption notifier): the group restart waits it out.
        kills=(KillAt(task="worker:1", after="^STEP 1 10$"),),
        args=(str(tmp_path), prefix, {"shard_policy": "data", "backup": "plain"}),
    )
    assert result.exit_code == 0, result.summary()
    assert [t.restarts for t in result.tasks] == [1, 1]  # MWMS: the whole group restarts.
    for task in ("worker:0", "worker:1"):
        assert collections.Counter(values[task]["counts"]) == {3: exact_tasks.RECORDS}, (task, values[task]["counts"])
        np.testing.assert_allclose(values[task]["weights"], reference, rtol=0, atol=2e-5)
        assert values[task]["restart"] == 1
    resumed = re.findall(r"Input resumes at epoch 1, step (\d+)", result.task("worker:0").output)
    assert len(resumed) == 1 and int(resumed[0]) % 4 == 0, resumed  # Resumed mid-epoch, at a backup.


def test_a_mesh_splits_the_model_over_ray_actors(ray_head: str, tmp_path: Path) -> None:
    # Issue 25 on Ray: --mesh model=2 makes both actors' processes DTensor clients; each holds half of every
    # split variable, both train the same steps, and every record comes once per epoch.
    files = mesh_tasks.write_records(str(tmp_path))
    result, values = _run(
        mesh_tasks.mesh_fit, ray_head, workers=2, mesh="model=2", timeout=300, args=(files, 8, str(tmp_path))
    )
    assert result.exit_code == 0, result.summary()
    first, second = values["worker:0"], values["worker:1"]
    assert first["losses"] == second["losses"]
    # It trains as one process of plain tf-keras does on the same weights and batches.
    np.testing.assert_allclose(first["losses"], mesh_tasks.reference_losses(files, 8, tmp_path), atol=1e-5, rtol=0)
    assert first["mesh"] == [["model"], [2]]
    for _, whole, here, specs, _ in first["bytes"]:
        assert here == (whole // 2 if "model" in specs else whole)
    assert sorted(i for step in first["ids"] for i in step) == list(range(mesh_tasks.RECORDS))


def test_ps_fit_survives_a_worker_killed_mid_fit_and_only_it_restarts(ray_head: str) -> None:
    statuses: list[str] = []
    result, values = _run(
        ray_tasks.ps_fit_progress,
        ray_head,
        workers=2,
        ps=1,
        chief=True,
        timeout=300,
        max_restarts=1,
        kills=("worker:1@after=progress epoch 1$",),
        args=(6, 20),
        statuses=statuses,
    )
    assert result.exit_code == 0, result.summary()
    value = values["chief:0"]
    assert value["is_ps"] and value["workers"] == 2
    assert len(value["loss"]) == 6
    assert {t.task: t.restarts for t in result.tasks} == {"chief:0": 0, "worker:0": 0, "worker:1": 1, "ps:0": 0}
    kill = [s for s in statuses if "fault injection" in s]
    assert kill and "worker:1" in kill[0], statuses
    assert set(values) == {"chief:0"}  # Workers and ps ran tfdist's TF server.


# Every process a CLI run starts, its own Ray's daemons included, inherits this variable: those are the run's,
# whatever other test session (CI runs two at once) starts Ray daemons of its own meanwhile.
_CLI_RUN = f"{os.getpid()}-{time.time_ns()}"


def _cli(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [PY, "-m", "tfdist.cli.launch", "--engine", "ray", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TFDIST_TEST_CLI_RUN=_CLI_RUN),
    )
    return done, time.monotonic() - start


def _own_daemons() -> set[int]:
    """The Ray daemons the CLI runs of this session started (those whose environment has its mark)."""
    mark = f"TFDIST_TEST_CLI_RUN={_CLI_RUN}\0".encode()
    own = set()
    for pid in _processes(_RAY_DAEMONS):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes():
                own.add(pid)
        except OSError:
            continue
    return own


def _started_pids(stderr: str) -> list[int]:
    return [int(p) for p in re.findall(r"started \([^,]+, pid (\d+)", stderr)]


def test_cli_local_ray_mwms_identical_weights_and_nothing_left(tmp_path: Path) -> None:
    done, _ = _cli(
        [
            "--workers",
            "2",
            "--timeout",
            "300",
            "--log-dir",
            str(tmp_path),
            "--",
            PY,
            str(REPO / "scripts" / "demo_train.py"),
            "--epochs",
            "2",
        ],
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(m) for m in re.findall(r"^\[worker:\d\] RESULT (.*)$", done.stdout, re.M)]
    assert len(results) == 2
    assert len({r["weights_sha1"] for r in results}) == 1
    assert [r["replicas"] for r in results] == [2, 2]
    assert "RESULT" in (tmp_path / "worker-1.log").read_text()
    pids = _started_pids(done.stderr)
    assert len(pids) == 2, done.stderr
    assert_all_gone(pids)
    assert_all_gone(list(_own_daemons()), within=15)  # The run's own Ray is gone.


def test_cli_failing_task_fails_the_run_fast_and_nothing_is_left() -> None:
    script = "import os, sys, time\nif os.environ['TFDIST_TASK'] == 'worker:1': sys.exit(7)\ntime.sleep(120)"
    done, seconds = _cli(["--workers", "3", "--grace", "2", "--timeout", "200", "--", PY, "-c", script], timeout=240)
    assert done.returncode == 7, done.stderr[-3000:]
    assert seconds < 90, seconds  # Ray start-up included; without fail-fast it would take 120 s.
    assert "worker:1 ended the run" in done.stderr
    pids = _started_pids(done.stderr)
    assert len(pids) == 3, done.stderr
    assert_all_gone(pids)
    assert_all_gone(list(_own_daemons()), within=15)
