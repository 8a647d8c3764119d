"""tfdist doctor, probing, resolvers and the Keras shim."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from tfdist import ClusterSpec, launch, testing
from tfdist.cluster.probe import probe_tasks
from tfdist.launch import Link
from tfdist.plan import parse_quantity


def _doctor(*args: str, tf_config: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    return testing.run_python([sys.executable, "-m", "tfdist.cli.main", "doctor", *args], env=env, timeout=60)


def test_valid_config_prints_role_and_fingerprint() -> None:
    spec = ClusterSpec.local(workers=2, chief=True)
    done = _doctor(tf_config=json.dumps(spec.to_tf_config("worker", 1)))
    assert done.returncode == 0, done.stdout
    assert "role:        worker:1\n" in done.stdout
    assert f"fingerprint: {spec.fingerprint}" in done.stdout
    assert "<- this task" in done.stdout


def test_invalid_config_exits_2_with_the_reason() -> None:
    done = _doctor("--tf-config", '{"cluster": {"worker": ["a:99999"]}}')
    assert done.returncode == 2
    assert "port in 1..65535" in done.stderr
    assert done.stdout == ""


def test_probe_under_multi_worker_mirrored_expects_closed_ports(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        up = f"127.0.0.1:{listener.getsockname()[1]}"
        closed = ClusterSpec.local(workers=1).tasks()[0].address
        config = {"cluster": {"chief": [up], "worker": [closed]}, "task": {"type": "worker", "index": 0}}
        path = tmp_path / "tf_config.json"
        path.write_text(json.dumps(config))
        done = _doctor("--tf-config", f"@{path}", "--probe", "1")
        assert done.returncode == 0, done.stdout  # The worker sees the chief; its own port is skipped.
        assert "probe chief:0      listening\n" in done.stdout
        assert "probe worker:0" not in done.stdout
        config["task"] = {"type": "chief", "index": 0}
        done = _doctor("--tf-config", json.dumps(config), "--probe", "5")
        assert done.returncode == 0, done.stdout  # Refused: the host is up, the worker not started yet.
        port = closed.rpartition(":")[2]
        refused = (
            f"probe worker:0     host up, port {port} not open (connection refused): expected before it builds "
            "its strategy\n"
        )
        assert refused in done.stdout
        assert "not listening yet: worker:0 - under multi_worker_mirrored" in done.stdout
        assert "unreachable" not in done.stdout
        spec = ClusterSpec.from_tf_config(config)
        assert probe_tasks(spec, timeout=0.3) == {"worker:0": False}
        assert probe_tasks(spec, timeout=0.3, include_self=True) == {"chief:0": True, "worker:0": False}


def test_probe_under_parameter_servers_needs_the_servers_up_and_names_dns() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        up = f"127.0.0.1:{listener.getsockname()[1]}"
        chief, closed = (t.address for t in ClusterSpec.local(workers=2).tasks())
        config: dict[str, Any] = {
            "cluster": {"chief": [chief], "worker": [closed, "no-such-host.invalid:2222"], "ps": [up]},
            "task": {"type": "chief", "index": 0},
        }
        done = _doctor("--tf-config", json.dumps(config), "--probe", "0.5")
        assert done.returncode == 3, done.stdout
        assert "probe ps:0         listening\n" in done.stdout
        assert f"probe worker:0     NOT listening: host up, port {closed.rpartition(':')[2]} not open" in done.stdout
        assert "probe worker:1     NOT reachable: cannot resolve host 'no-such-host.invalid': DNS (" in done.stdout
        assert "unreachable: worker:0, worker:1 - is the task running" in done.stdout
        config["task"] = {"type": "worker", "index": 0}  # The chief listens only once its strategy is built.
        del config["cluster"]["worker"][1]
        done = _doctor("--tf-config", json.dumps(config), "--probe", "5")
        assert done.returncode == 0, done.stdout
        assert "probe chief:0      host up" in done.stdout
        assert "not listening yet: chief:0 - under parameter_server the chief" in done.stdout
        assert "this task:   runs a TensorFlow server, not the training program" in done.stdout


def test_measure_link_runs_on_every_task_and_speaks_plans_units() -> None:
    addresses = [t.address for t in ClusterSpec.local(workers=2).tasks()]
    configs = [json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}) for i in (0, 1)]
    argv = [sys.executable, "-m", "tfdist.cli.main", "doctor", "--probe", "20", "--measure-link"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    tasks = [subprocess.Popen(argv, env={**env, "TF_CONFIG": c}, stdout=subprocess.PIPE, text=True) for c in configs]
    outputs = [task.communicate(timeout=60)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    for me, peer, output in ((0, 1, outputs[0]), (1, 0, outputs[1])):
        found = re.search(
            rf"^link worker:{me} -> worker:{peer}: (\S+) \([\d.]+ MB/s\): tfdist plan --link (\S+)$", output, re.M
        )
        assert found and found.group(1) == found.group(2), output
        plan = testing.run_python(
            [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--params", "1M", "--link", found[1]],
            timeout=60,
        )
        assert plan.returncode == 0, plan.stderr
    alone = _doctor("--probe", "0.5", "--measure-link", tf_config=configs[0])
    assert alone.returncode == 3, alone.stdout  # Nobody measures back: named, with what to run.
    assert "link worker:0 -> worker:1: not measured (" in alone.stdout
    assert "on every task at once, before training" in alone.stdout
    without = _doctor("--measure-link", tf_config=configs[0])
    assert without.returncode == 2 and "Pass e.g. --probe 30 --measure-link." in without.stderr, without.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_measure_link_measures_a_shaped_link_between_simulated_hosts() -> None:
    command = [sys.executable, "-m", "tfdist.cli.main", "doctor", "--probe", "30", "--measure-link"]
    result = launch.run(command, workers=2, simulate_hosts=2, links=("100mbit",), timeout=120)
    assert result.exit_code == 0, result.summary()
    for me, peer in ((0, 1), (1, 0)):
        output = result.task(f"worker:{me}").output
        found = re.search(rf"^link worker:{me} -> worker:{peer}: (\S+) ", output, re.M)
        assert found, output
        rate = Link.parse(found[1]).bits_per_second
        assert 85e6 <= rate <= 105e6, found[1]  # TCP's payload on a 100 Mbit/s token bucket, both ways at once


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_measure_host_times_the_collectives_on_every_task_and_speaks_plans_flags() -> None:
    command = [sys.executable, "-m", "tfdist.cli.main", "doctor", "--probe", "30", "--measure-link", "--measure-host"]
    result = launch.run(command, workers=2, timeout=120)
    assert result.exit_code == 0, result.summary()
    printed = []
    for me in (0, 1):
        output = result.task(f"worker:{me}").output
        found = re.search(
            rf"^host worker:{me}: collectives (\S+) each way \(the link's share taken out\), memory (\S+), top-k "
            r"selection \S+ and scatter \S+, thin products \S+ \(rank 1: \S+\): tfdist plan (--collective-bandwidth "
            r"\S+ --memory-bandwidth \S+ --select-bandwidth \S+ --scatter-bandwidth \S+ --matmul-bandwidth \S+ "
            r"--matvec-bandwidth \S+)$",
            output,
            re.M,
        )
        assert found, output
        printed.append(found[3])
    assert printed[0] == printed[1]  # Every task reports the slowest task's rates.
    rates = dict(zip(printed[0].split()[::2], (parse_quantity(v, "bandwidth") for v in printed[0].split()[1::2])))
    # The selection builds an index list: compute, well below a plain stream through memory.
    assert rates["--select-bandwidth"] < rates["--memory-bandwidth"] / 2, rates
    # The scatter writes each value to a random place: far below the selection's scan.
    assert rates["--scatter-bandwidth"] < rates["--select-bandwidth"] / 10, rates
    plan = testing.run_python(
        [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--link", "1gbit", "--shapes", "[[64, 64]]"]
        + ["--choose", *printed[0].split()],
        timeout=60,
    )
    assert plan.returncode == 0 and "defaults measured" not in plan.stdout, plan.stdout + plan.stderr
    without = _doctor("--measure-host", tf_config=json.dumps(ClusterSpec.local(workers=2).to_tf_config("worker", 0)))
    assert without.returncode == 2 and "Pass e.g. --probe 30 --measure-host." in without.stderr, without.stderr


# TF_CONFIGs doctor and build_strategy("auto") must judge alike; None: the variable unset.
VERDICT_CASES = {
    "unset": None,
    "empty": "",
    "one_worker_without_task": {"cluster": {"worker": ["127.0.0.1:1"]}},
    "workers_without_task": {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}},
    "chief_and_worker_without_task": {"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}},
    "ps_cluster_without_task": {
        "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    },
    "ps_without_chief": {
        "cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0},
    },
    "ps_without_chief_or_task": {"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}},
}
_BUILD_EACH = """
import json, os, sys, tfdist
out = {}
for name, text in json.loads(sys.argv[1]).items():
    os.environ.pop("TF_CONFIG", None)
    if text is not None:
        os.environ["TF_CONFIG"] = text
    try:
        out[name] = ["built", type(tfdist.build_strategy("auto")).__name__]
    except tfdist.ClusterSpecError as err:
        out[name] = ["ClusterSpecError", str(err), err.field]
    except Exception as err:
        out[name] = ["raw", f"{type(err).__name__}: {err}"]
print("RESULT " + json.dumps(out))
"""


def test_doctor_and_build_strategy_judge_each_tf_config_alike() -> None:
    texts = {name: c if c is None or isinstance(c, str) else json.dumps(c) for name, c in VERDICT_CASES.items()}
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    done = testing.run_python([sys.executable, "-c", _BUILD_EACH, json.dumps(texts)], env=env, timeout=180)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    built = json.loads(line.removeprefix("RESULT "))
    fields = {}
    for name, text in texts.items():
        doctor = _doctor(tf_config=text)
        if built[name][0] == "built":
            assert doctor.returncode == 0, (name, doctor.stderr)
            assert built[name][1] == "_DefaultDistributionStrategy", name
            assert "build_strategy('auto') picks 'default'" in doctor.stdout, name
        else:
            assert built[name][0] == "ClusterSpecError", (name, built[name])  # Never TF's raw error.
            assert doctor.returncode == 2, (name, doctor.stdout)
            assert doctor.stderr == f"tfdist doctor: error: TF_CONFIG is invalid: {built[name][1]}\n"
            fields[name] = built[name][2]
    assert fields == {
        "workers_without_task": "task",
        "chief_and_worker_without_task": "task",
        "ps_cluster_without_task": "task",
        "ps_without_chief": "cluster.chief",
        "ps_without_chief_or_task": "cluster.chief",
    }
    done = _doctor("--probe", "1")  # No TF_CONFIG: one process, nothing to probe.
    assert done.returncode == 0, done.stderr
    assert "role:        single process (no TF_CONFIG: no cluster)" in done.stdout
    assert "probe:       nothing to probe, no other task" in done.stdout


def test_resolver_keeps_evaluator_out_and_defaults_to_grpc() -> None:
    from tfdist.strategy.resolver import cluster_resolver

    spec = ClusterSpec(
        jobs=cast(Any, {"chief": ["c:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]}),
        task_type="worker",
        task_id=1,
        environment="cloud",
    )
    resolver = cluster_resolver(spec)
    assert resolver.cluster_spec().as_dict() == {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    task = (resolver.task_type, resolver.task_id, resolver.rpc_layer, resolver.environment)
    assert task == ("worker", 1, "grpc", "cloud")
    sparse = cluster_resolver(
        ClusterSpec(jobs=cast(Any, {"worker": {"2": "w:2", "5": "w:5"}}), task_type="worker", task_id=5)
    )
    assert sparse.cluster_spec().task_indices("worker") == [2, 5]


def test_tfdist_keras_is_tf_keras_of_tf_minor() -> None:
    import tensorflow as tf
    import tf_keras

    from tfdist import keras

    assert keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2]
    assert keras.layers is tf_keras.layers
    assert keras.Sequential is tf_keras.Sequential


def test_stack_report_exits_0_on_a_supported_stack() -> None:
    done = _doctor("--stack")
    assert done.returncode == 0, done.stderr[-2000:]
    for line in (
        "tensorflow:",
        "tf-keras:",
        "keras (Keras 3):",
        "TF_USE_LEGACY_KERAS:",
        "tensorboard:",
        "tensorflow-io:",
        "  s3://",
        "internals:          ok: all",
        "stack: supported",
    ):
        assert line in done.stdout
    # Keras 3's trainer names and those of tfdist's Keras 3 features, resolved (both stacks pin Keras 3.15.1).
    assert re.search(r"^Keras 3 fit: +keras 3\.\d+\.\d+: fit fixed for MultiWorkerMirroredStrategy$", done.stdout, re.M)


def test_the_task_report_ends_with_a_stack_line() -> None:
    spec = ClusterSpec.local(workers=1)
    done = _doctor(tf_config=json.dumps(spec.to_tf_config("worker", 0)))
    assert done.returncode == 0, done.stderr
    assert re.search(r"stack:       TF 2\.\d+\.\d+, tf-keras 2\.\d+\.\d+: supported", done.stdout)
