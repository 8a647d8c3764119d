"""Kubernetes manifests: the training operator's TFJob admission rules, the SDK's model, JobSet pods simulated.

No cluster here, so this checks what can be checked: the rules of training-operator v1's tfjob_webhook.go and
API types, the ``kubeflow-training`` SDK (``KubeflowOrgV1TFJob``) and the Kubernetes client's ``V1JobTemplateSpec``
loading the manifests, JobSet's documented fields (jobset_types.go, v1alpha2) and webhook rules, and what each
JobSet pod computes from the environment Kubernetes and the manifest give it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from tfdist import ClusterSpec, ClusterSpecError
from tfdist.errors import LaunchError
from tfdist.launch.config import LaunchConfig
from tfdist.launch.emit import formats as emit
from tfdist.runtime import exit_codes
from tfdist.runtime.versions import tf_keras_installed

PS = LaunchConfig(command=("python", "train.py"), workers=2, ps=1, chief=True, evaluator=True, max_restarts=3)
MWMS = LaunchConfig(command=("python", "train.py", "--epochs", "3"), workers=3)
IMAGE = "registry.example/train:1"


def tfjob(config: LaunchConfig = PS, **options: Any) -> dict[str, Any]:
    """The manifest as kubectl would read it: through the YAML tfdist prints."""
    return yaml.safe_load(emit.to_yaml(emit.tfjob_manifest(config, image=IMAGE, **options)))


def jobset(config: LaunchConfig = PS, **options: Any) -> dict[str, Any]:
    return yaml.safe_load(emit.to_yaml(emit.jobset_manifest(config, image=IMAGE, **options)))


# ------------------------------------------------------------------ TFJob: the operator's admission rules
def _set(path: str, value: Any) -> Callable[[dict], None]:
    def change(manifest: dict) -> None:
        *parents, last = path.split(".")
        node = manifest
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return change


_DELETE = object()
_WORKER = "spec.tfReplicaSpecs.Worker.template.spec.containers.0"
BROKEN = {  # rule -> (change to a valid manifest, what the operator's message names)
    "name_not_dns1035": (_set("metadata.name", "My Job"), "metadata.name"),
    "name_too_long": (_set("metadata.name", "a" * 64), "metadata.name"),
    "name_empty": (_set("metadata.name", ""), "metadata.name"),
    "name_starts_with_digit": (_set("metadata.name", "1job"), "metadata.name"),
    "no_replica_specs": (_set("spec.tfReplicaSpecs", {}), "spec.tfReplicaSpecs: must be required"),
    "two_chiefs": (
        lambda m: m["spec"]["tfReplicaSpecs"].update(Master=copy.deepcopy(m["spec"]["tfReplicaSpecs"]["Chief"])),
        "more than 1 Chief or Master",
    ),
    "no_containers": (_set("spec.tfReplicaSpecs.PS.template.spec.containers", []), "[PS].template.spec.containers"),
    "no_image": (_set(f"{_WORKER}.image", ""), "[Worker].template.spec.containers[0].image"),
    "container_not_tensorflow": (_set(f"{_WORKER}.name", "main"), "container with name tensorflow"),
    "restart_policy": (_set("spec.tfReplicaSpecs.Chief.restartPolicy", "Sometimes"), "[Chief].restartPolicy"),
    "clean_pod_policy": (_set("spec.runPolicy.cleanPodPolicy", "Some"), "cleanPodPolicy"),
    "backoff_limit": (_set("spec.runPolicy.backoffLimit", -1), "backoffLimit"),
    "ttl": (_set("spec.runPolicy.ttlSecondsAfterFinished", -5), "ttlSecondsAfterFinished"),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_each_operator_rule_is_checked(rule: str) -> None:
    manifest = tfjob(ttl_seconds_after_finished=600)
    assert emit.validate_tfjob(manifest) == []
    change, message = BROKEN[rule]
    change(manifest)
    problems = emit.validate_tfjob(manifest)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(
    "config",
    [PS, MWMS, LaunchConfig(command=("t",), workers=1, chief=True, run_on="chief")],
    ids=["ps", "mwms", "chief_only"],
)
def test_emitted_tfjobs_pass_and_load_into_the_sdk(config: LaunchConfig) -> None:
    manifest = tfjob(config, namespace="ml-team", cpu="4", memory="16Gi", gpus=1, ttl_seconds_after_finished=3600)
    assert emit.validate_tfjob(manifest) == []
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert sum(r in ("Chief", "Master") for r in replicas) <= 1
    assert {r["restartPolicy"] for r in replicas.values()} == {"ExitCode"}
    assert manifest["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": config.max_restarts,
        "ttlSecondsAfterFinished": 3600,
    }
    training = pytest.importorskip("kubeflow.training", reason="the test extra installs kubeflow-training")
    client = training.ApiClient()
    job = client.deserialize(SimpleNamespace(data=json.dumps(manifest)), "KubeflowOrgV1TFJob")
    assert isinstance(job, training.KubeflowOrgV1TFJob)
    assert job.metadata.name == "tfdist-job" and job.spec.run_policy.clean_pod_policy == "Running"
    for rtype, spec in job.spec.tf_replica_specs.items():
        container = spec.template.spec.containers[0]
        assert (container.name, container.image) == ("tensorflow", IMAGE), rtype
    # Every field tfdist writes is one the SDK knows: the model serializes back to the same manifest.
    assert client.sanitize_for_serialization(job) == manifest


@pytest.mark.parametrize("build", [emit.tfjob_manifest, emit.jobset_manifest], ids=["tfjob", "jobset"])
def test_gpus_go_where_the_model_trains(build: Any) -> None:
    """Issue 26 item 10: --gpus puts nvidia.com/gpu on workers (and an MWMS chief), not on ps or a PS coordinator."""

    def gpus_by_job(config: LaunchConfig) -> dict[str, str | None]:
        manifest = build(config, image=IMAGE, gpus=2)
        if "tfReplicaSpecs" in manifest["spec"]:
            pods = {k.lower(): v["template"]["spec"] for k, v in manifest["spec"]["tfReplicaSpecs"].items()}
        else:
            pods = {j["name"]: j["template"]["spec"]["template"]["spec"] for j in manifest["spec"]["replicatedJobs"]}
        return {
            job: pod["containers"][0].get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            for job, pod in pods.items()
        }

    ps = LaunchConfig(command=("t",), workers=2, ps=1, chief=True, evaluator=True)
    assert gpus_by_job(ps) == {"chief": None, "worker": "2", "ps": None, "evaluator": "2"}
    mwms = LaunchConfig(command=("t",), workers=2, chief=True)
    assert gpus_by_job(mwms) == {"chief": "2", "worker": "2"}


def test_the_exit_code_table_matches_the_operators_rule() -> None:
    """restartPolicy ExitCode: 1-127 permanent, 128-255 retried (train_util.IsRetryableExitCode)."""
    retried = {exit_codes.PREEMPTED, exit_codes.LOST_PEER, 137, 143}
    permanent = {exit_codes.FAILED, exit_codes.BAD_CONFIG, exit_codes.CANNOT_EXECUTE, exit_codes.NOT_FOUND}
    assert all(exit_codes.is_retryable(c) for c in retried) and not any(exit_codes.is_retryable(c) for c in permanent)
    assert [c for c in range(1, 256) if exit_codes.is_retryable(c)] == list(range(128, 256))
    import tensorflow as tf

    from tfdist.keras.cluster_aware import exit_preempted
    from tfdist.runtime.clean_exit import exit_code_for_exception

    assert exit_code_for_exception(tf.errors.UnavailableError(None, None, "peer gone")) == exit_codes.LOST_PEER
    assert exit_code_for_exception(tf.errors.DeadlineExceededError(None, None, "x")) == exit_codes.LOST_PEER
    assert exit_code_for_exception(LaunchError("bad flag")) == exit_codes.BAD_CONFIG
    assert exit_code_for_exception(ZeroDivisionError()) == exit_codes.FAILED
    with pytest.raises(SystemExit) as stopped:
        exit_preempted()
    assert stopped.value.code == exit_codes.PREEMPTED  # TF's default 42 would not be retried by the operator.
    # An uncaught lost-peer error in a script run through exit_cleanly: the process exits 201.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import tensorflow as tf, tfdist\n"
            "def main():\n    raise tf.errors.UnavailableError(None, None, 'worker:1 is gone')\n"
            "tfdist.exit_cleanly(main)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == exit_codes.LOST_PEER, done.stderr[-2000:]


# ------------------------------------------------------------------ JobSet
# Fields of jobset.x-k8s.io/v1alpha2 (api/jobset/v1alpha2/jobset_types.go json tags) and their enums.
JOBSET_SPEC = {
    "replicatedJobs",
    "network",
    "successPolicy",
    "failurePolicy",
    "startupPolicy",
    "suspend",
    "coordinator",
    "managedBy",
    "ttlSecondsAfterFinished",
    "volumeClaimPolicies",
}
REPLICATED_JOB = {"name", "groupName", "template", "replicas", "dependsOn"}
NETWORK = {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"}
SUCCESS_POLICY = {"operator": {"All", "Any"}, "targetReplicatedJobs": None}
FAILURE_POLICY = {"maxRestarts", "restartStrategy", "rules"}
FAILURE_RULE = {"name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns", "targetReplicatedJobs"}
FAILURE_ACTIONS = {
    "FailJobSet",
    "RestartJobSet",
    "RestartJobSetAndIgnoreMaxRestarts",
    "RestartJob",
    "RestartJobAndIgnoreMaxRestarts",
}
FAILURE_REASONS = {
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
}  # jobset_webhook.go validOnJobFailureReasons
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # jobset_webhook.go ruleNameFmt
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("config", [PS, MWMS], ids=["ps", "mwms"])
def test_jobset_follows_the_documented_schema(config: LaunchConfig) -> None:
    manifest = jobset(config, namespace="ml-team", cpu="500m", memory="2Gi")
    assert (manifest["apiVersion"], manifest["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    spec = manifest["spec"]
    assert set(spec) <= JOBSET_SPEC
    assert set(spec["network"]) <= NETWORK and spec["network"]["enableDNSHostnames"] is True
    assert set(spec["successPolicy"]) <= set(SUCCESS_POLICY) and spec["successPolicy"]["operator"] in {"All", "Any"}
    names = [r["name"] for r in spec["replicatedJobs"]]
    assert set(spec["successPolicy"]["targetReplicatedJobs"]) <= set(names)
    assert spec["successPolicy"]["targetReplicatedJobs"] == (["chief"] if config.ps else ["worker"])
    assert set(spec["failurePolicy"]) <= FAILURE_POLICY and spec["failurePolicy"]["maxRestarts"] == config.max_restarts
    for rule in spec["failurePolicy"]["rules"]:
        assert set(rule) <= FAILURE_RULE and rule["action"] in FAILURE_ACTIONS and RULE_NAME.match(rule["name"])
        assert set(rule["onJobFailureReasons"]) <= FAILURE_REASONS
    kubernetes = pytest.importorskip("kubernetes", reason="kubeflow-training (test extra) brings the client")
    client = kubernetes.client.ApiClient()
    for rjob in spec["replicatedJobs"]:
        assert set(rjob) <= REPLICATED_JOB and rjob["replicas"] == 1
        job = rjob["template"]["spec"]
        pod_name = f"{manifest['metadata']['name']}-{rjob['name']}-0-{job['completions'] - 1}-abcde"
        assert DNS1035.match(pod_name) and len(pod_name) <= 63  # jobset_webhook.go: longest pod name
        template = client.deserialize(SimpleNamespace(data=json.dumps(rjob["template"])), "V1JobTemplateSpec")
        assert client.sanitize_for_serialization(template) == rjob["template"]  # Only fields the Job API has.
        codes = job["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
        assert codes == [c for c in range(1, 256) if not exit_codes.is_retryable(c)]  # The operator's table.
        assert exit_codes.BAD_CONFIG in codes and exit_codes.PREEMPTED not in codes
        assert job["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it.


def _pod_env(manifest: dict[str, Any], rjob: dict[str, Any], index: int) -> dict[str, str]:
    """The environment Kubernetes gives pod ``index`` of ``rjob``: labels through the downward API, and the index."""
    labels = {
        "jobset.sigs.k8s.io/jobset-name": manifest["metadata"]["name"],
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": "2",
    }
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for var in rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "valueFrom" in var:
            label = cast(
                "re.Match[str]", re.fullmatch(r"metadata\.labels\['(.+)'\]", var["valueFrom"]["fieldRef"]["fieldPath"])
            ).group(1)
            env[var["name"]] = labels[label]
        else:
            env[var["name"]] = var["value"]
    return env


def test_tf_use_legacy_keras_is_in_a_pod_running_the_command_where_tf_keras_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TFJob pod runs the command itself: the interpreter writing the manifest stands for the image's. A JobSet
    pod, or a TFJob pod under a mesh, starts through tfdist's entry, which looks at the pod's own interpreter."""
    from tfdist.launch.emit import kubernetes

    def names(manifest: dict[str, Any]) -> set[str]:
        pods = [r["template"]["spec"] for r in manifest["spec"].get("tfReplicaSpecs", {}).values()]
        pods += [r["template"]["spec"]["template"]["spec"] for r in manifest["spec"].get("replicatedJobs", [])]
        return {var["name"] for pod in pods for container in pod["containers"] for var in container["env"]}

    mesh = LaunchConfig(command=("python", "train.py"), workers=2, mesh="batch=2")
    for installed in (True, False):
        monkeypatch.setattr(kubernetes, "tf_keras_installed", lambda value=installed: value)
        chief = tfjob(PS)["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
        assert ({"name": "TF_USE_LEGACY_KERAS", "value": "1"} in chief["env"]) is installed
        assert ("TF_USE_LEGACY_KERAS" in names(tfjob(PS)) | names(tfjob(MWMS))) is installed
        assert "TF_USE_LEGACY_KERAS" not in names(jobset(PS)) | names(jobset(MWMS)) | names(tfjob(mesh))


def test_every_jobset_pod_builds_the_same_cluster_from_its_environment() -> None:
    manifest = jobset(PS, name="rec")
    show = [
        sys.executable,
        "-c",
        "import os; print(os.environ['TF_CONFIG']); print(os.environ.get('TF_USE_LEGACY_KERAS')); "
        "print(os.environ['TFDIST_TASK'] + ' ' + os.environ['TFDIST_RESTART'])",
    ]
    legacy = "1" if tf_keras_installed() else "None"  # The entry looks at the pod's interpreter (this one here).
    seen = {}
    for rjob in manifest["spec"]["replicatedJobs"]:
        for index in range(rjob["template"]["spec"]["completions"]):
            command = rjob["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
            cut = command.index("--")
            argv = [sys.executable] + command[1:cut] + ["--"] + show
            argv[argv.index("--run-on") + 1] = "all"  # Every pod shows its env, servers too.
            env = dict(os.environ, **_pod_env(manifest, rjob, index))
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            tf_config, keras_setting, line = done.stdout.strip().splitlines()[-3:]
            assert keras_setting == legacy
            task, restart = line.split()
            assert restart == "2"  # JobSet's restart attempt reaches the task as TFDIST_RESTART.
            spec = ClusterSpec.from_tf_config(tf_config)
            assert spec.task is not None
            assert spec.task.name == task == f"{rjob['name']}:{index}"
            # JobSet's documented host name: <jobSet.name>-<replicatedJob.name>-<job-index>-<pod-index>.<subdomain>
            # (TF_CONFIG leaves the evaluator out of the cluster, as TFJob does.)
            if rjob["name"] != "evaluator":
                assert spec.task.address == f"rec-{rjob['name']}-0-{index}.rec:2222"
            seen[task] = spec.fingerprint
    assert sorted(seen) == ["chief:0", "evaluator:0", "ps:0", "worker:0", "worker:1"]
    assert len(set(seen.values())) == 1


@pytest.mark.parametrize(
    "env, message",
    [
        ({}, "JOBSET_NAME"),
        (
            {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "trainer", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "0"},
            "one of the jobs",
        ),
        (
            {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "1", "JOB_COMPLETION_INDEX": "0"},
            "one indexed Job per TensorFlow job type",
        ),
        (
            {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "2"},
            "an index below 2",
        ),
        (
            {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "worker", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "x"},
            "non-negative integer",
        ),
    ],
    ids=["outside_jobset", "unknown_job", "second_job", "index_too_big", "bad_index"],
)
def test_from_jobset_rejects_what_is_not_a_tfdist_jobset_pod(env: dict[str, str], message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec.from_jobset(env, jobs={"chief": 1, "worker": 2})


def test_jobset_name_must_leave_room_for_pod_names() -> None:
    with pytest.raises(LaunchError, match="DNS-1035"):
        emit.jobset_manifest(MWMS, image=IMAGE, name="a" * 50)
