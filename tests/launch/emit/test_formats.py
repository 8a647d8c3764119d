"""--emit: what is printed parses back, and real engines' TF_CONFIGs for it are accepted."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time

import pytest
import yaml

from tfdist import ClusterSpec
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit
from tfdist.runtime.versions import tf_keras_installed

PS_TOPOLOGY = LaunchConfig(
    command=("python", "train.py", "--epochs", "3"), workers=2, ps=2, chief=True, evaluator=True, max_restarts=3
)


def operator_tf_config(manifest: dict, replica_type: str, index: int, namespace: str = "default") -> str:
    """TF_CONFIG as Kubeflow's training operator writes it: lower-case jobs, DNS names, no evaluator."""
    name = manifest["metadata"]["name"]
    cluster = {}
    for rtype, spec in manifest["spec"]["tfReplicaSpecs"].items():
        job = rtype.lower()
        if job == "evaluator":
            continue
        port = spec["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        cluster[job] = [f"{name}-{job}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return json.dumps(
        {"cluster": cluster, "task": {"type": replica_type.lower(), "index": index}, "environment": "cloud"}
    )


def test_tf_config_per_task() -> None:
    configs = emit.tf_configs(PS_TOPOLOGY, hosts=["h0", "h1", "h2:3000", "h3", "h4", "h5"], port=2222)
    assert sorted(configs) == ["chief:0", "evaluator:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    fingerprints = {ClusterSpec.from_tf_config(c).fingerprint for c in configs.values()}
    assert len(fingerprints) == 1
    assert configs["worker:1"]["cluster"]["worker"] == ["h1:2222", "h2:3000"]


def test_tfjob_manifest_parses_and_operator_config_is_accepted() -> None:
    manifest = yaml.safe_load(
        emit.to_yaml(emit.tfjob_manifest(PS_TOPOLOGY, name="rec", image="me/img:1", cpu="4", memory="8Gi"))
    )
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 2, "Evaluator": 1}
    chief = replicas["Chief"]["template"]["spec"]["containers"][0]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert (chief["name"], chief["image"]) == ("tensorflow", "me/img:1")
    assert chief["command"] == ["python", "train.py", "--epochs", "3"]
    assert worker["command"] == ["python", "-m", "tfdist.launch.tasks.server"]
    assert chief["resources"]["limits"] == {"cpu": "4", "memory": "8Gi"}
    assert ({"name": "TF_USE_LEGACY_KERAS", "value": "1"} in chief["env"]) is tf_keras_installed()
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 3
    for rtype, count in (("Chief", 1), ("Worker", 2), ("PS", 2), ("Evaluator", 1)):
        for index in range(count):
            spec = ClusterSpec.from_tf_config(operator_tf_config(manifest, rtype, index))
            assert (spec.num_workers, spec.num_ps, spec.environment) == (3, 2, "cloud")
            assert spec.task_type == rtype.lower()


def test_collective_tfjob_runs_the_command_everywhere() -> None:
    config = LaunchConfig(command=("python", "train.py"), workers=4)
    manifest = yaml.safe_load(emit.to_yaml(emit.tfjob_manifest(config, image="me/train:1")))
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["containers"][0]["command"] == ["python", "train.py"]
    assert list(manifest["spec"]["tfReplicaSpecs"]) == ["Worker"]


def test_slurm_script_and_its_tasks() -> None:
    script = emit.slurm_script(PS_TOPOLOGY, name="rec", cpus_per_task=4, port_base=9000)
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=rec\n#SBATCH --ntasks=6")
    assert "#SBATCH --cpus-per-task=4" in script
    assert "\nPORT_BASE=9000\n" in script
    srun = next(line for line in script.splitlines() if " srun --kill-on-bad-exit" in line)
    assert '--jobs chief=1,worker=2,ps=2,evaluator=1 --port-base "$PORT_BASE"' in srun
    # Run what srun would run on each of 6 Slurm tasks over 2 nodes, with a program that shows its env.
    show = [sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"]
    args = srun.split('"$PYTHON" ', 1)[1].split(" -- ")[0]
    tail = shlex.split(args.replace('"$PORT_BASE"', "9000").replace('"$attempt"', "0"))
    seen = {}
    for procid in range(6):
        env = dict(
            os.environ, SLURM_PROCID=str(procid), SLURM_STEP_NODELIST="n[1-2]", SLURM_STEP_TASKS_PER_NODE="3(x2)"
        )
        argv = [sys.executable] + tail[:-1] + ["all", "--"] + show  # --run-on all: every task shows its env.
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        spec = ClusterSpec.from_tf_config(done.stdout.strip().splitlines()[-1])
        seen[spec.task.name] = spec.fingerprint  # type: ignore[union-attr]
    assert sorted(seen) == ["chief:0", "evaluator:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    assert len(set(seen.values())) == 1


def test_slurm_ps_task_serves_tensorflow() -> None:
    env = dict(
        os.environ,
        SLURM_PROCID="1",
        SLURM_STEP_NODELIST="n1",
        SLURM_STEP_TASKS_PER_NODE="4",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    argv = [
        sys.executable,
        "-m",
        "tfdist.launch.tasks.slurm",
        "--jobs",
        "chief=1,ps=1,worker=2",
        "--port-base",
        "0",
        "--",
        "never-run-on-ps",
    ]
    env["SLURM_STEP_NODELIST"] = "127.0.0.1"
    from tfdist.cluster import address as _address

    base = next(p for p in range(20000, 60000, 7) if all(_address.port_is_free("127.0.0.1", p + i) for i in range(4)))
    argv[argv.index("0")] = str(base)  # The 4 tasks on this "node" use base..base+3.
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while (
            not any("TensorFlow server ps:0 up" in line for line in lines)
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        assert any("TensorFlow server ps:0 up" in line for line in lines), "".join(lines)
    finally:
        proc.terminate()
        assert proc.wait(30) == 0  # SIGTERM stops the server cleanly.


def test_slurm_task_reports_bad_environment() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.tasks.slurm", "--", "true"],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "SLURM_PROCID" in done.stderr


def test_cli_emit() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", "--emit", "tf-config", "--workers", "2", "--hosts", "a,b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["worker:0"]["cluster"] == {"worker": ["a:2222", "b:2222"]}
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", "--emit", "tfjob", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "a program to run after '--'" in done.stderr


def test_server_watch_ends_after_the_chief_goes() -> None:
    """What lets a Slurm PS job end: the server leaves once the chief was up and then gone for the grace."""
    import socket

    from tfdist.launch.server import watch_chief

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    never_up = threading.Event()
    threading.Thread(target=watch_chief, args=("127.0.0.1:1", never_up), kwargs={"grace": 0.2}, daemon=True).start()
    done = threading.Event()
    listener.listen()
    watcher = threading.Thread(target=watch_chief, args=(address, done), kwargs={"grace": 1.0, "interval": 0.1})
    watcher.start()
    time.sleep(1.5)
    assert not done.is_set()  # The chief is up: keep serving.
    listener.close()
    gone = time.monotonic()
    assert done.wait(10)
    assert 0.8 <= time.monotonic() - gone <= 5
    watcher.join(5)
    assert not never_up.is_set()  # A chief never seen is a chief still starting, not a finished one.
    never_up.set()


# Issue #17, "Nonsense accepted": every value that goes into an emitted script or manifest is validated.
NONSENSE = {
    "slurm_name_injection": (["--emit", "slurm", "--name", "x\necho PWNED"], "--name"),
    "slurm_name_space": (["--emit", "slurm", "--name", "my job"], "--name"),
    "slurm_time_forever": (["--emit", "slurm", "--time", "forever"], "--time"),
    "slurm_time_injection": (["--emit", "slurm", "--time", "1:00\n#SBATCH --x"], "--time"),
    "slurm_port_base_70000": (["--emit", "slurm", "--port-base", "70000"], "--port-base"),
    "slurm_port_base_negative": (["--emit", "slurm", "--port-base", "-1"], "--port-base"),
    "slurm_port_base_no_room": (["--emit", "slurm", "--workers", "4", "--port-base", "65534"], "--port-base"),
    "slurm_cpus_negative": (["--emit", "slurm", "--cpus-per-task", "-2"], "--cpus-per-task"),
    "slurm_gpus_negative": (["--emit", "slurm", "--gpus", "-1"], "--gpus"),
    "slurm_python_newline": (["--emit", "slurm", "--python", "/py\nrm -rf /"], "--python"),
    "slurm_tf_log_level": (["--emit", "slurm", "--tf-log-level", "9"], "--tf-log-level"),
    "tfjob_name_spaces": (["--emit", "tfjob", "--image", "i:1", "--name", "My Job"], "--name"),
    "tfjob_name_300": (["--emit", "tfjob", "--image", "i:1", "--name", "a" * 300], "--name"),
    "tfjob_name_empty": (["--emit", "tfjob", "--image", "i:1", "--name", ""], "--name"),
    "tfjob_namespace": (["--emit", "tfjob", "--image", "i:1", "--namespace", "Bad NS"], "--namespace"),
    "tfjob_gpus_negative": (["--emit", "tfjob", "--image", "i:1", "--gpus", "-1"], "--gpus"),
    "tfjob_cpu_abc": (["--emit", "tfjob", "--image", "i:1", "--cpu", "abc"], "--cpu"),
    "tfjob_cpu_zero": (["--emit", "tfjob", "--image", "i:1", "--cpu", "0"], "--cpu"),
    "tfjob_memory_injection": (["--emit", "tfjob", "--image", "i:1", "--memory", "1Gi\nkind: Pod"], "--memory"),
    "tfjob_no_image": (["--emit", "tfjob"], "--image"),
    "tfjob_image_newline": (["--emit", "tfjob", "--image", "i:1\nkind: Pod"], "--image"),
    "tfjob_image_not_ascii": (["--emit", "tfjob", "--image", "imäge:1"], "--image"),
    "jobset_no_image": (["--emit", "jobset"], "--image"),
    "jobset_name": (["--emit", "jobset", "--image", "i:1", "--name", "Bad_Name"], "--name"),
}


@pytest.mark.parametrize("case", sorted(NONSENSE))
def test_cli_rejects_nonsense_in_one_line(case: str) -> None:
    args, field = NONSENSE[case]
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.launch", *args, "--", "python", "train.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and f"`{field}`" in done.stderr, done.stderr


def test_slurm_script_quotes_the_command_for_bash(tmp_path) -> None:
    """Whatever the command holds (newlines, $(...), quotes), bash hands the task exactly that argv."""
    command = ["python", "-c", "print(1)\necho PWNED $(touch /tmp/pwned) `id` 'q' \"d\"", "a b", "--x=$HOME"]
    script = emit.slurm_script(LaunchConfig(command=command, workers=2), python="/opt/py 3/bin/python")
    assert "\necho PWNED" not in script.split("srun")[0]
    srun = script.split("srun --kill-on-bad-exit=1 ", 1)[1].split(" 2>&1 1>&3")[0]
    probe = (
        "PYTHON=" + shlex.quote("/opt/py 3/bin/python") + "; PORT_BASE=20000; attempt=0; "
        "set -- " + srun + "; printf '%s\\0' \"$@\""
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    argv = done.stdout.split("\0")[:-1]
    assert argv[argv.index("--") + 1 :] == ["/opt/py 3/bin/python", *command[1:]]  # 'python' runs pinned.
    assert argv[0] == "/opt/py 3/bin/python" and not os.path.exists("/tmp/pwned")
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH --job-name=tfdist-job", "#SBATCH --ntasks=2", "#SBATCH --time=01:00:00"]


def test_slurm_task_missing_command_is_one_line() -> None:
    """`python -m tfdist.launch.tasks.slurm ... -- /no/such/cmd` raised FileNotFoundError (issue #17)."""
    env = dict(os.environ, SLURM_PROCID="0", SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="1")
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.launch.tasks.slurm", "--", "/no/such/cmd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 127 and "Traceback" not in done.stderr, done.stderr
    assert "cannot run '/no/such/cmd'" in done.stderr.splitlines()[-1]


def test_pods_get_the_same_task_variables_as_local_children() -> None:
    """One rule for a task's environment: the TFJob pods carry what tfdist-launch gives local tasks."""
    from tfdist.launch import environment

    config = LaunchConfig(command=("python", "train.py"), workers=2, ps=1, chief=True, threads_per_task=2)
    spec = ClusterSpec.local(workers=2, ps=1, chief=True)
    local = environment.child_env({}, config, spec, "chief:0", restart=0)
    manifest = emit.tfjob_manifest(config, image="me/train:1")
    for replica in manifest["spec"]["tfReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        pod = {item["name"]: item["value"] for item in container["env"] if "value" in item}
        assert pod["TF_NUM_INTEROP_THREADS"] == local["TF_NUM_INTEROP_THREADS"] == "4"  # workers + 1 (PS guide)
        assert all(pod[name] == local[name] for name in environment.task_variables(config))
