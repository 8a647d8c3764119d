"""`--mesh` through the launcher: its checks, each task's environment, and the emitted jobs' task entries."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tfdist.cli import launch as launch_cli
from tfdist.cluster import ClusterSpec
from tfdist.errors import LaunchError
from tfdist.launch import environment
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit

COMMAND = ("python", "train.py")


def test_the_mesh_is_normalized_and_every_training_task_is_a_client() -> None:
    config = LaunchConfig(command=COMMAND, workers=2, chief=True, mesh=" model = 3 ")
    assert config.mesh == "model=3"
    jobs: dict[str, Any] = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    spec = ClusterSpec(jobs=jobs)
    envs = {t: environment.child_env({}, config, spec, t, restart=0) for t in ("chief:0", "worker:0", "worker:1")}
    assert [envs[t]["DTENSOR_CLIENT_ID"] for t in ("chief:0", "worker:0", "worker:1")] == ["0", "1", "2"]
    assert {e["DTENSOR_JOBS"] for e in envs.values()} == {"h:1,h:2,h:3"}
    assert {e["TFDIST_MESH"] for e in envs.values()} == {"model=3"}
    assert {e["DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"] for e in envs.values()} == {"0"}
    plain = environment.child_env({}, LaunchConfig(command=COMMAND, workers=2), spec, "worker:0", restart=0)
    assert not [name for name in plain if name.startswith("DTENSOR_")]


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        ({"workers": 2, "mesh": "model=3"}, "mesh", "multiple of the 2 processes"),
        ({"workers": 2, "mesh": "model"}, "mesh", "name=size"),
        ({"workers": 2, "ps": 1, "chief": True, "mesh": "model=2"}, "ps", "drop `ps`"),
        ({"workers": 2, "evaluator": True, "mesh": "model=2"}, "evaluator", "drop `evaluator`"),
        ({"workers": 2, "data_service_workers": 1, "mesh": "model=2"}, "data_service_workers", "drop the service"),
        ({"workers": 2, "min_workers": 1, "mesh": "model=2"}, "min_workers", "a mesh's shape is fixed"),
    ],
)
def test_launches_a_mesh_cannot_run_are_refused(kwargs: dict, field: str, text: str) -> None:
    with pytest.raises(LaunchError, match=text) as err:
        LaunchConfig(command=COMMAND, **kwargs)
    assert err.value.field == field


def test_cli_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch_cli.main(["--workers", "2", "--mesh", "model=3", "--", "true"]) == 2
    assert "`--mesh`" in capsys.readouterr().err
    assert launch_cli.main(["--emit", "tf-config", "--workers", "2", "--mesh", "model=2", "--", *COMMAND]) == 2
    assert "--mesh" in capsys.readouterr().err  # A bare TF_CONFIG list has no task entry to carry it.


def test_a_jobset_passes_the_mesh_to_its_task_entry() -> None:
    config = LaunchConfig(command=COMMAND, workers=2, mesh="batch=1,model=2")
    manifest = yaml.safe_load(emit.to_yaml(emit.jobset_manifest(config, image="me/train:1")))
    command = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--mesh") + 1] == "batch=1,model=2"


def test_tfjob_pods_become_mesh_clients_through_the_tf_config_entry() -> None:
    config = LaunchConfig(command=COMMAND, workers=2, chief=True, mesh="model=3")
    manifest = emit.tfjob_manifest(config, image="me/train:1")
    assert emit.validate_tfjob(manifest) == []
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        command = spec["template"]["spec"]["containers"][0]["command"]
        assert command == ["python", "-m", "tfdist.launch.tasks.tf_config", "--mesh", "model=3", "--", *COMMAND]
    # What the pods run, given the TF_CONFIG the operator writes for each.
    show = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
    seen = []
    for kind, index in (("chief", 0), ("worker", 0), ("worker", 1)):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        done = subprocess.run(
            [sys.executable, "-m", "tfdist.launch.tasks.tf_config", "--mesh", "model=3", "--", *show],
            env=dict(os.environ, TF_CONFIG=tf_config),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [e["DTENSOR_CLIENT_ID"] for e in seen] == ["0", "1", "2"]
    assert {e["DTENSOR_JOBS"] for e in seen} == {"c:2222,w0:2222,w1:2222"}
    assert {json.loads(e["TF_CONFIG"])["task"]["type"] for e in seen} == {"chief", "worker"}
    bare = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.tasks.tf_config", "--", "true"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.returncode == 2 and "`TF_CONFIG`" in bare.stderr


def test_slurm_tasks_of_an_emitted_script_become_mesh_clients() -> None:
    config = LaunchConfig(command=COMMAND, workers=2, mesh="model=2")
    script = emit.slurm_script(config, port_base=9000)
    srun = next(line for line in script.splitlines() if " srun --kill-on-bad-exit" in line)
    args = srun.split('"$PYTHON" ', 1)[1].split(" -- ")[0]
    tail = shlex.split(args.replace('"$PORT_BASE"', "9000").replace('"$attempt"', "0"))
    assert tail[tail.index("--mesh") + 1] == "model=2"
    show = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]
    seen = []
    for procid in range(2):
        env = dict(os.environ, SLURM_PROCID=str(procid), SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="2")
        done = subprocess.run([sys.executable, *tail, "--", *show], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [e["DTENSOR_CLIENT_ID"] for e in seen] == ["0", "1"]
    assert {e["DTENSOR_JOBS"] for e in seen} == {"n1:9000,n1:9001"}
    assert {e["TFDIST_MESH"] for e in seen} == {"model=2"}
