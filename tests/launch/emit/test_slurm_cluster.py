"""What ``tfdist-launch --emit slurm`` prints, submitted with ``sbatch`` to a real Slurm cluster.

The ``slurm_cluster`` fixture (tests/conftest.py) starts munged, slurmctld and slurmd on 127.0.0.1 with
scripts/slurm_local.py, installing Debian's slurm-wlm and munge first when they are missing. Jobs are
submitted with PATH=/usr/bin:/bin, so they work only because the script pins the interpreter.
"""

from __future__ import annotations

import collections
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from tests.support import SUPPORT, exact_tasks, mesh_tasks
from tfdist.cluster import slurm as _slurm
from tfdist.testing import RESULT_PREFIX

pytestmark = [pytest.mark.slurm]
TASKS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tasks_slurm_cluster.py")
BASE_PYTHON = os.path.join(sys.base_prefix, "bin", "python3")  # The venv's base interpreter: no tfdist.


def emit(*args: str) -> str:
    """What ``tfdist-launch --emit slurm ARGS`` prints (run by this test's interpreter)."""
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", "--emit", "slurm", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def task_command(function: str, *args: Any) -> list[str]:
    return ["python", "-m", "tfdist.launch.tasks.function", "--file", TASKS_FILE, function, json.dumps(list(args))]


# Job states after which Slurm runs nothing more of a job (not COMPLETING, not requeued): scontrol's names.
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


class Job:
    """A batch job submitted without ``--wait``: ``sbatch --wait`` polls after 2, 8, 32 s and then every 32 s,
    so a job ending 10 s after submission was seen at 42 s. ``poll`` asks ``scontrol`` instead (twice a second
    in ``finish``) and returns what ``sbatch --wait`` would: the exit status, 1 if a signal ended the job, or
    None while Slurm still runs it."""

    def __init__(self, cluster: Any, job_id: str) -> None:
        self.cluster, self.job_id = cluster, job_id

    def poll(self) -> int | None:
        record = job_record(self.cluster, self.job_id)
        if record.get("JobState") not in FINAL_STATES:
            return None
        status, signal = (int(part) for part in record["ExitCode"].split(":"))
        return 1 if signal else status


def submit(cluster: Any, script: str, workdir: str, *, pythonpath: str | None = None) -> Job:
    """``sbatch --parsable`` of ``script`` from a bare environment; the job's output goes to workdir."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "job.sbatch")
    with open(path, "w") as f:
        f.write(script)
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_CONF": cluster.conf,
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath,
    }
    done = subprocess.run(
        ["sbatch", "--parsable", "--chdir", workdir, "--output", os.path.join(workdir, "job.out"), path],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    job_id = done.stdout.strip().split(";")[0]
    assert done.returncode == 0 and job_id.isdigit(), f"sbatch printed {done.stdout!r}, {done.stderr!r}"
    return Job(cluster, job_id)


def finish(job: Job, cluster: Any, timeout: float) -> tuple[int, dict[str, str], str]:
    """Waits until Slurm is done with the job; returns its exit code, the job's record and its output."""
    deadline = time.monotonic() + timeout
    while (code := job.poll()) is None:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", "--full", "--user", "root"], env=cluster.env, timeout=30)
            pytest.fail(f"job {job.job_id} still not finished after {timeout} s: {job_record(cluster, job.job_id)}")
        time.sleep(0.5)
    record = job_record(cluster, job.job_id)
    with open(os.path.join(record["WorkDir"], "job.out"), errors="replace") as f:
        output = f.read()
    return code, record, output


def job_record(cluster: Any, job_id: str) -> dict[str, str]:
    """The job as ``scontrol`` keeps it (MinJobAge=900 in the fixture; no slurmdbd here for sacct)."""
    done = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], env=cluster.env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return dict(item.split("=", 1) for item in done.stdout.split() if "=" in item)


def seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _records(root: str, prefix: str, tag: str) -> dict[str, dict[str, Any]]:
    """The PREFIX-*.json files the test tasks wrote, keyed 'TASK/TAG' (TAG formatted with the record)."""
    found = {}
    for path in glob.glob(os.path.join(root, f"{prefix}-*.json")):
        with open(path) as f:
            value = json.load(f)
        found[f"{value['task']}/{tag.format(**value)}"] = value
    return found


def results(root: str) -> dict[str, dict[str, Any]]:
    """result-TASK-RESTART.json files, keyed 'task/restart'."""
    return _records(root, "result", "{restart}")


def test_failures_end_the_job_at_once_with_their_code(slurm_cluster: Any, tmp_path: Any) -> None:
    """No TensorFlow here: three jobs at once, each failing a different way."""
    show = (
        "import os, sys, time; t = os.environ['TFDIST_TASK']; "
        "print('|'.join(['ENV', t, os.environ['TF_CONFIG'], os.environ['TF_CPP_MIN_LOG_LEVEL'], "
        "os.environ['TF_USE_LEGACY_KERAS'], sys.executable]), flush=True); "
        "time.sleep(1); sys.exit(7) if t == 'worker:1' else time.sleep(300)"
    )
    jobs = {
        # A task exits 7: the job fails within seconds with 7 (srun itself would report 143 for the others).
        "code7": submit(
            slurm_cluster,
            emit("--workers", "3", "--max-restarts", "0", "--", "python", "-c", show),
            str(tmp_path / "code7"),
        ),
        # The interpreter has no tfdist: the script stops at once and names it (exit 2, no restarts).
        "no_tfdist": submit(
            slurm_cluster,
            emit("--workers", "2", "--max-restarts", "3", "--python", BASE_PYTHON, "--", "true"),
            str(tmp_path / "no_tfdist"),
            pythonpath="",
        ),
        # A command that does not exist: 127 (not retried although restarts are allowed), one line, no traceback.
        "no_cmd": submit(
            slurm_cluster, emit("--workers", "2", "--max-restarts", "3", "--", "/no/such/cmd"), str(tmp_path / "no_cmd")
        ),
    }
    done = {name: finish(job, slurm_cluster, timeout=120) for name, job in jobs.items()}

    code, record, output = done["code7"]
    assert code == 7, output
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "7:0"), record
    assert seconds(record["EndTime"]) - seconds(record["StartTime"]) <= 15, record
    envs = [line.split("|") for line in output.splitlines() if line.startswith("ENV|")]
    assert len(envs) == 3, output
    ports = {int(address.rsplit(":", 1)[1]) for address in json.loads(envs[0][2])["cluster"]["worker"]}
    base = _slurm.job_port_base(int(record["JobId"]), 3, lambda port: True)
    assert ports == {base, base + 1, base + 2}, (ports, base)  # From SLURM_JOB_ID, not the old fixed 8888.
    assert {tuple(e[3:6]) for e in envs} == {("2", "1", sys.executable)}, envs  # Pinned, quiet, legacy Keras.

    code, record, output = done["no_tfdist"]
    assert code == 2 and record["ExitCode"] == "2:0", output
    assert f"{BASE_PYTHON} cannot import tfdist on every node" in output, output
    assert "No module named 'tfdist'" in output and "srun: error: localhost" in output, output  # The node.
    assert "tfdist.launch.tasks.slurm: " not in output and "restart" not in output, output  # Stopped before the step.

    code, record, output = done["no_cmd"]
    assert code == 127 and record["ExitCode"] == "127:0", output
    assert "cannot run '/no/such/cmd'" in output and "Traceback" not in output, output
    assert "restart 1" not in output, output


@pytest.mark.multiprocess
def test_two_mwms_jobs_at_once_one_restarting_with_an_evaluator(slurm_cluster: Any, tmp_path: Any) -> None:
    """Job A: 2 workers + evaluator, worker:1 crashes after epoch 1, --max-restarts 1. Job B: 2 workers."""
    root_a, root_b = str(tmp_path / "a"), str(tmp_path / "b")
    for root in (root_a, root_b):
        os.makedirs(root)
    job_a = submit(
        slurm_cluster,
        emit("--workers", "2", "--evaluator", "--max-restarts", "1", "--", *task_command("slurm_mwms", root_a, 3, 1)),
        root_a,
    )
    job_b = submit(slurm_cluster, emit("--workers", "2", "--", *task_command("slurm_mwms", root_b, 2)), root_b)
    code_a, record_a, output_a = finish(job_a, slurm_cluster, timeout=420)
    code_b, record_b, output_b = finish(job_b, slurm_cluster, timeout=420)
    assert (code_b, record_b["JobState"], record_b["ExitCode"]) == (0, "COMPLETED", "0:0"), output_b
    assert (code_a, record_a["JobState"], record_a["ExitCode"]) == (0, "COMPLETED", "0:0"), output_a

    b = results(root_b)
    assert sorted(b) == ["worker:0/0", "worker:1/0"], output_b
    assert b["worker:0/0"]["weights"] == b["worker:1/0"]["weights"]
    assert b["worker:0/0"]["replicas"] == 2

    a = results(root_a)
    assert os.path.exists(os.path.join(root_a, "crashed"))
    assert "step failed with exit code 3; restart 1 of 1" in output_a, output_a
    assert sorted(a) == ["evaluator:0/1", "worker:0/1", "worker:1/1"], (sorted(a), output_a)
    assert a["worker:0/1"]["weights"] == a["worker:1/1"]["weights"]
    for task in ("worker:0/1", "worker:1/1"):
        assert a[task]["epochs_begun"] == [2], a[task]  # Resumed from the backup of epoch 1, not from 0.
    evaluator = a["evaluator:0/1"]
    assert json.loads(evaluator["env"]["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    procids = {a[t]["env"]["SLURM_PROCID"] for t in a}
    assert len(procids) == 3, procids  # The side-car is a Slurm task of its own.
    # It stops after evaluating the last epoch's checkpoint, so after that was written (the workers go on a few
    # seconds more under load: fit's end, their results), and with training, not at the job's limit.
    last = os.path.getmtime(os.path.join(root_a, "ckpt", "ckpt-3.index"))
    assert evaluator["end"] >= last, (evaluator["end"], last)
    assert evaluator["end"] <= seconds(record_a["EndTime"]) + 1

    ports = [
        set(json.loads(r[t]["env"]["TF_CONFIG"])["cluster"]["worker"])
        for r, t in ((a, "worker:0/1"), (b, "worker:0/0"))
    ]
    assert not ports[0] & ports[1], ports
    for output in (output_a, output_b):
        assert "Could not start gRPC server" not in output and "already exists" not in output


@pytest.mark.multiprocess
def test_parameter_server_job_ends_when_the_chief_does(slurm_cluster: Any, tmp_path: Any) -> None:
    root = str(tmp_path)
    started = time.time()
    job = submit(
        slurm_cluster,
        emit("--chief", "--workers", "2", "--ps", "1", "--time", "30", "--", *task_command("slurm_ps", root)),
        root,
    )
    code, record, output = finish(job, slurm_cluster, timeout=420)
    assert (code, record["JobState"], record["ExitCode"]) == (0, "COMPLETED", "0:0"), output
    chief = results(root)["chief:0/0"]
    assert chief["is_ps"], chief
    lag = seconds(record["EndTime"]) - chief["end"]
    assert lag <= 15, (lag, output)  # Not at the time limit (30 min), and no 137 from srun --wait.
    for task in ("ps:0", "worker:0", "worker:1"):  # Each server saw the chief go and left by itself.
        assert re.search(r"Chief at \S+ gone for \d+s: the coordinator is done, stopping", output), output
        assert f"TensorFlow server {task} stopping" in output, output
    assert output.count("the coordinator is done") == 3, output
    assert "CANCELLED" not in output and "Terminated" not in output, output
    assert seconds(record["EndTime"]) - started < 400


def _job_field(cluster: Any, job_id: str, field: str) -> str:
    return job_record(cluster, job_id).get(field, "")


def _wait(what: str, ready: Any, timeout: float, job: Job, workdir: str) -> None:
    """Polls ``ready()`` (progress, not time, decides); fails with the job's output if it ends or time runs out."""
    deadline = time.monotonic() + timeout
    while not ready():
        if job.poll() is not None or time.monotonic() > deadline:
            with open(os.path.join(workdir, "job.out"), errors="replace") as f:
                pytest.fail(f"no {what} (job ended with {job.poll()}):\n{f.read()[-4000:]}")
        time.sleep(0.5)


def _elastic_records(root: str) -> dict[str, dict[str, Any]]:
    """elastic-*.json files, keyed 'task/g<generation>'."""
    return _records(root, "elastic", "g{generation}")


@pytest.mark.multiprocess
def test_elastic_job_requeued_with_fewer_tasks_resumes_from_the_backup(slurm_cluster: Any, tmp_path: Any) -> None:
    """3 workers; mid-epoch, after a backup, the node fails; Slurm requeues the job, which runs on with 2 workers.

    Exactly once on Slurm, counted: the fit is tests/support/exact_tasks.py's (480 records, global batch 24,
    a count per record in a weight the backup restores, BackupAndRestore every 4 batches + ResumeInput).
    The tasks pause after batch 9 of epoch 1, so the backup of batch 7 is the last: the requeued group of 2
    resumes at epoch 1, step 8, and after 4 epochs every record is counted 4 times and the weights equal
    SGD computed in numpy over the epoch order's steps.

    The single test node stands for the cluster: its failure requeues the job (Slurm's own NODE_FAIL path),
    and the requeued job is given 2 tasks instead of 3 (``scontrol update`` of the pending job), as a
    ``--nodes=MIN-MAX`` job gets fewer nodes on a real cluster. Everything after that is the emitted script's
    and the tasks' own doing: the step's size, TF_CONFIG, TFDIST_WORLD_SIZE/TFDIST_MEMBERSHIP, the resume.
    """
    root, name = str(tmp_path), f"elastic-{os.getpid()}"
    prefix = os.path.join(root, "data", "part")
    exact_tasks.write_data(prefix)
    script = emit(
        "--workers",
        "3",
        "--min-workers",
        "2",
        "--tasks-per-node",
        "3",
        "--name",
        name,
        "--time",
        "10",
        "--",
        *task_command("slurm_elastic", root, 4, 1, 9),
    )
    for line in (
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=3",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        '--ntasks="$TASKS"',
        "--allocated-tasks 3",
        "--min-workers 2 --",
    ):
        assert line in script, script
    assert "#SBATCH --ntasks=" not in script, script  # The size comes from the allocation, not a fixed count.
    job = submit(slurm_cluster, script, root)
    try:
        _wait("pause mid-epoch 1, after a backup", lambda: os.path.exists(os.path.join(root, "paused")), 300, job, root)
        queue = subprocess.run(
            ["squeue", "-h", "-n", name, "-o", "%i"], env=slurm_cluster.env, capture_output=True, text=True, timeout=30
        )
        job_id = queue.stdout.strip()
        assert job_id.isdigit(), queue
        first = _elastic_records(root)
        assert sorted(first) == ["worker:0/g0", "worker:1/g0", "worker:2/g0"], first
        # The node fails: Slurm stops the tasks and requeues the job (--requeue), which waits ~120 s to be eligible.
        subprocess.run(
            ["scontrol", "update", "NodeName=localhost", "State=DOWN", "Reason=tfdist-elastic-test"],
            env=slurm_cluster.env,
            check=True,
            timeout=30,
        )
        _wait(
            "requeue",
            lambda: (
                (_job_field(slurm_cluster, job_id, "JobState"), _job_field(slurm_cluster, job_id, "Restarts"))
                == ("PENDING", "1")
            ),
            60,
            job,
            root,
        )
        # Slurm holds the requeued job ~120 s so that the old run can leave the node (slurmd drains a node that
        # is asked to start a job id it still runs: "Duplicate jobid"). The test waits for exactly that, the
        # old run's slurmstepd sockets gone from the spool (slurmd's own check), then lets the job start now.
        spool = os.path.join(slurm_cluster.directory, "spool")
        _wait("old run gone from the node", lambda: not glob.glob(os.path.join(spool, f"*_{job_id}.*")), 60, job, root)
        # The requeued job gets a smaller allocation.
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "NumTasks=2", "TasksPerNode=2", "StartTime=now"],
            env=slurm_cluster.env,
            check=True,
            timeout=30,
        )
    finally:  # The node serves the other tests again (ReturnToService=2 usually does it at once).
        subprocess.run(
            ["scontrol", "update", "NodeName=localhost", "State=RESUME"],
            env=slurm_cluster.env,
            capture_output=True,
            timeout=30,
        )
    code, record, output = finish(job, slurm_cluster, timeout=420)
    assert (code, record["JobState"], record["ExitCode"], record["Restarts"]) == (0, "COMPLETED", "0:0", "1"), output

    found = _elastic_records(root)
    assert sorted(found) == ["worker:0/g0", "worker:0/g1", "worker:1/g0", "worker:1/g1", "worker:2/g0"], output
    for task in ("worker:0", "worker:1", "worker:2"):
        before = found[f"{task}/g0"]
        assert (before["world_size"], before["replicas"], before["per_replica_batch"]) == (3, 3, 8), before
        assert before["epochs_begun"] == [0, 1] and before["logged_world_size"] == [3.0], before
        assert before["steps"] == {"0": 20, "1": 10}, before
        assert before["slurm_restart"] in (None, "0") and not before.get("done"), before
    after = [found["worker:0/g1"], found["worker:1/g1"]]
    reference = exact_tasks.ideal_weights(prefix, epochs=4)
    for rec in after:
        assert (rec["world_size"], rec["replicas"], rec["per_replica_batch"], rec["slurm_restart"]) == (2, 2, 12, "1")
        assert len(rec["tf_config"]["cluster"]["worker"]) == 2, rec
        assert rec["epochs_begun"] == [1, 2, 3], rec  # Resumed from the backup inside epoch 1, not from 0.
        assert rec["steps"] == {"1": 12, "2": 20, "3": 20}, rec  # Steps 8-19 of epoch 1: 480 / 24 per epoch.
        assert rec["logged_world_size"] == [2.0, 2.0, 2.0] and rec["done"], rec
        assert collections.Counter(rec["counts"]) == {4: exact_tasks.RECORDS}, rec["counts"]
        assert max(abs(a - b) for a, b in zip(rec["weights"], reference, strict=True)) < 2e-5, (
            rec["weights"],
            reference,
        )
    assert after[0]["weights"] == after[1]["weights"]
    assert output.count("Input resumes at epoch 1, step 8 (DataPosition(epoch=1, step=8))") == 2, output
    assert "Slurm restart count 0: 3 tasks on 1 node(s)" in output, output  # Both runs, in one appended file.
    assert "Slurm restart count 1: 2 tasks on 1 node(s)" in output, output
    assert "elastic membership 1 (Slurm restart count): world size 2 (2 workers, at least 2)" in output, output


def test_a_mesh_job_splits_the_model_over_two_slurm_tasks(slurm_cluster: Any, tmp_path: Any) -> None:
    """Issue 25 on Slurm: --emit slurm --mesh model=2; the task entry makes both Slurm tasks DTensor clients."""
    root = str(tmp_path)
    files = mesh_tasks.write_records(root)
    command = [
        "python",
        "-m",
        "tfdist.launch.tasks.function",
        "--file",
        str(SUPPORT / "mesh_tasks.py"),
        "mesh_fit",
        json.dumps([files, 8, root]),
    ]
    code, record, output = finish(
        submit(slurm_cluster, emit("--workers", "2", "--mesh", "model=2", "--", *command), root), slurm_cluster, 420
    )
    assert (code, record["JobState"]) == (0, "COMPLETED"), output
    # From the files mesh_fit writes: srun merges both tasks' output, and their RESULT lines (over 4 KB) can
    # arrive cut into each other (a JSONDecodeError at column 4080 once).
    assert output.count(RESULT_PREFIX) == 2, output
    values = [json.loads((tmp_path / f"mesh-result-worker-{i}.json").read_text()) for i in range(2)]
    assert values[0]["losses"] == values[1]["losses"]
    # It trains as one process of plain tf-keras does on the same weights and batches.
    reference = mesh_tasks.reference_losses(files, 8, root)
    np.testing.assert_allclose(values[0]["losses"], reference, atol=1e-5, rtol=0)
    for _, whole, here, specs, _ in values[0]["bytes"]:
        assert here == (whole // 2 if "model" in specs else whole)
    assert sorted(i for step in values[0]["ids"] for i in step) == list(range(mesh_tasks.RECORDS))
