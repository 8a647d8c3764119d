"""Elastic Slurm jobs without a cluster: the script's node range, and tasks sized from their allocation.

The real requeue (a node fails, the job runs on with fewer workers) is in tests/launch/emit/test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tfdist import ClusterSpecError, LaunchError
from tfdist.cluster import slurm as _slurm
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit

SHOW = [
    sys.executable,
    "-c",
    "import os; print(os.environ['TF_CONFIG'] + '|' + os.environ['TFDIST_WORLD_SIZE'] + "
    "'|' + os.environ['TFDIST_MEMBERSHIP'] + '|' + os.environ['TFDIST_TASK'])",
]


def _config(**kwargs: object) -> LaunchConfig:
    return LaunchConfig(command=("python", "train.py"), **kwargs)


def _emit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``tfdist-launch --emit slurm ARGS`` in a subprocess."""
    argv = [sys.executable, "-m", "tfdist.cli.launch", "--emit", "slurm", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _header(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize(
    "kwargs, per_node, nodes",
    [
        ({"workers": 8, "min_workers": 4}, 1, "--nodes=4-8"),
        ({"workers": 8, "min_workers": 4, "max_workers": 6}, 1, "--nodes=4-6"),
        ({"workers": 5, "min_workers": 3, "chief": True}, 2, "--nodes=2-3"),  # 4..6 tasks, 2 per node.
        ({"workers": 3, "min_workers": 2}, 3, "--nodes=1"),  # The test cluster's one node.
    ],
)
def test_elastic_script_asks_for_a_node_range_and_requeue(kwargs: dict, per_node: int, nodes: str) -> None:
    script = emit.slurm_script(_config(**kwargs), python="/opt/py", tasks_per_node=per_node)
    header = _header(script)
    assert f"#SBATCH {nodes}" in header and f"#SBATCH --ntasks-per-node={per_node}" in header, header
    assert {"#SBATCH --requeue", "#SBATCH --open-mode=append"} <= set(header), header
    assert not any(line.startswith("#SBATCH --ntasks=") for line in header), header
    chief = int(bool(kwargs.get("chief")))
    most = chief + kwargs.get("max_workers", kwargs["workers"])
    assert f'TASKS=$("$PYTHON" -m tfdist.launch.tasks.slurm --allocated-tasks {most}) || exit 2' in script
    srun = next(line for line in script.splitlines() if " srun --kill-on-bad-exit" in line)
    assert '--ntasks="$TASKS"' in srun and f"--min-workers {kwargs['min_workers']} --" in srun, srun
    assert ("--jobs chief=1 " in srun) == bool(chief), srun


def test_plain_script_is_unchanged_but_may_pack_tasks() -> None:
    header = _header(emit.slurm_script(_config(workers=4), python="/opt/py", tasks_per_node=2))
    assert "#SBATCH --ntasks=4" in header and "#SBATCH --ntasks-per-node=2" in header, header
    assert "#SBATCH --requeue" not in header and not any("--nodes" in line for line in header), header


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"workers": 3, "min_workers": 2, "ps": 1, "chief": True}, "`ps`.*drop `min_workers`"),
        ({"workers": 3, "min_workers": 2, "evaluator": True}, "`evaluator`"),
        ({"workers": 3, "min_workers": 2, "loses": ("worker:2@after=x",)}, "`loses`"),
    ],
)
def test_elastic_script_refuses_what_slurm_cannot_do(kwargs: dict, field: str) -> None:
    with pytest.raises(LaunchError, match=field):
        emit.slurm_script(_config(**kwargs), python="/opt/py")


def test_one_task_per_node_is_said_to_slurm() -> None:
    """Issue 26 item 10: --tasks-per-node 1 writes the line (Slurm would pack tasks); unset, none is written."""
    one = _header(emit.slurm_script(_config(workers=3), python="/opt/py", tasks_per_node=1))
    assert "#SBATCH --ntasks=3" in one and "#SBATCH --ntasks-per-node=1" in one, one
    unset = _header(emit.slurm_script(_config(workers=3), python="/opt/py"))
    assert "#SBATCH --ntasks=3" in unset and not any("ntasks-per-node" in line for line in unset), unset
    elastic = _header(emit.slurm_script(_config(workers=3, min_workers=2), python="/opt/py"))
    assert "#SBATCH --nodes=2-3" in elastic and "#SBATCH --ntasks-per-node=1" in elastic, elastic


def test_more_sbatch_options_are_written_and_checked() -> None:
    """Issue 26 item 10: --partition, --account, --qos and the like reach the script; tfdist's own are refused."""
    header = _header(
        emit.slurm_script(_config(workers=2), python="/opt/py", sbatch=("partition=gpu", "--account=ml", "exclusive"))
    )
    assert header[-3:] == ["#SBATCH --partition=gpu", "#SBATCH --account=ml", "#SBATCH --exclusive"], header
    for option, message in (
        ("time=5", "it writes --time). Set it with `time_limit`"),
        ("ntasks-per-node=2", "Set it with `tasks_per_node`"),
        ("partition=a;rm -rf /", "without spaces, quotes or shell characters"),
        ("partition=$(id)", "without spaces, quotes or shell characters"),
        ("", "one sbatch option"),
    ):
        with pytest.raises(LaunchError, match=re.escape(message)):
            emit.slurm_script(_config(workers=2), python="/opt/py", sbatch=(option,))
    done = _emit_cli("--sbatch", "qos=high", "--sbatch=--time=9", "--", "t")
    assert (
        done.returncode == 2 and "Invalid value for `--sbatch`" in done.stderr and "Set it with `--time`" in done.stderr
    )


def test_cli_tasks_per_node_is_checked() -> None:
    done = _emit_cli("--workers", "3", "--min-workers", "2", "--tasks-per-node", "0", "--", "true")
    assert done.returncode == 2 and "--tasks-per-node" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _run_step(script: str, tasks: int, restart: str | None, hosts: str = "n[1-2]") -> list[subprocess.CompletedProcess]:
    """Runs the script's srun line for each of ``tasks`` tasks, as srun would, with a program that shows its env."""
    srun = next(line for line in script.splitlines() if " srun --kill-on-bad-exit" in line)
    args = srun.split('"$PYTHON" ', 1)[1].split(" -- ")[0]
    tail = shlex.split(
        args.replace('"$PORT_BASE"', "9000").replace('"$attempt"', "0").replace("--run-on auto", "--run-on all")
    )
    counts = [tasks // 2 + tasks % 2, tasks // 2] if tasks > 1 else [1]
    per_node = ",".join(str(n) for n in counts)
    done = []
    for procid in range(tasks):
        env = dict(
            os.environ,
            SLURM_PROCID=str(procid),
            SLURM_STEP_NODELIST=hosts if tasks > 1 else "n1",
            SLURM_STEP_TASKS_PER_NODE=per_node,
        )
        env.pop("SLURM_RESTART_COUNT", None)
        if restart is not None:
            env["SLURM_RESTART_COUNT"] = restart
        done.append(
            subprocess.run([sys.executable, *tail, "--", *SHOW], env=env, capture_output=True, text=True, timeout=60)
        )
    return done


@pytest.mark.parametrize(
    "chief, tasks, restart, world, generation",
    [
        (False, 3, None, 3, 0),  # The first run: no SLURM_RESTART_COUNT yet.
        (False, 2, "1", 2, 1),  # Requeued once, on a smaller allocation.
        (True, 3, "2", 3, 2),  # chief + 2 workers: the chief counts in the world size.
    ],
)
def test_tasks_take_the_world_size_from_the_step(
    chief: bool, tasks: int, restart: str | None, world: int, generation: int
) -> None:
    script = emit.slurm_script(_config(workers=3, min_workers=2, chief=chief), python=sys.executable)
    done = _run_step(script, tasks, restart)
    seen = {}
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        tf_config, size, member, task = proc.stdout.strip().splitlines()[-1].split("|")
        assert (int(size), int(member)) == (world, generation)
        seen[task] = json.loads(tf_config)["cluster"]
    expected = (["chief:0"] if chief else []) + [f"worker:{i}" for i in range(tasks - chief)]
    assert sorted(seen) == expected
    assert len({json.dumps(c, sort_keys=True) for c in seen.values()}) == 1  # One cluster for every task.
    assert f"elastic membership {generation} (Slurm restart count): world size {world}" in done[0].stderr
    assert "elastic membership" not in done[-1].stderr  # Said once, by task 0.


def test_an_allocation_below_min_workers_fails_with_one_line() -> None:
    script = emit.slurm_script(_config(workers=3, min_workers=2, chief=True), python=sys.executable)
    proc = _run_step(script, 2, "1")[0]  # chief + 1 worker: below --min-workers 2.
    assert proc.returncode == 2 and "at least 3 tasks" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("per_node, most, expected", [("3(x2)", 4, "4"), ("2", 3, "2"), ("1(x2),2", 9, "4")])
def test_allocated_tasks_follows_slurm_tasks_per_node(per_node: str, most: int, expected: str) -> None:
    env = dict(os.environ, SLURM_TASKS_PER_NODE=per_node, SLURM_NTASKS="99")  # SLURM_NTASKS may be stale.
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.tasks.slurm", "--allocated-tasks", str(most)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr


def test_allocated_tasks_outside_a_job_is_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.tasks.slurm", "--allocated-tasks", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "SLURM_TASKS_PER_NODE" in done.stderr and "Traceback" not in done.stderr


def test_layout_helpers_reject_nonsense() -> None:
    with pytest.raises(ClusterSpecError, match="SLURM_RESTART_COUNT"):
        _slurm.restart_count({"SLURM_RESTART_COUNT": "x"})
    with pytest.raises(ClusterSpecError, match="no 'worker' count"):
        _slurm.elastic_jobs({"worker": 2}, 3, min_workers=1)
    with pytest.raises(ClusterSpecError, match="at least 3 tasks"):
        _slurm.elastic_jobs({"chief": 1}, 2, min_workers=2)
    assert _slurm.elastic_jobs({}, 4, min_workers=2) == {"worker": 4}
