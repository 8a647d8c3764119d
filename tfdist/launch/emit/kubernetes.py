"""Kubernetes manifests for a topology: a Kubeflow ``TFJob`` (training-operator v1) and a ``JobSet``.

Both are checked against the admission rules of their controllers before they
are returned (see docs/kubernetes.md), so ``kubectl apply`` does not reject
them: names are DNS-1035 labels, quantities are Kubernetes quantities, and
nothing a user typed can add YAML keys or lines.
"""

from __future__ import annotations

import re
from typing import Any

from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import LaunchConfig, require_config
from tfdist.launch.environment import keras_variables, server_argv, task_variables
from tfdist.launch.tasks.programs import TaskProgram
from tfdist.runtime import exit_codes
from tfdist.runtime.versions import tf_keras_installed

TFJOB_PORT = 2222
_CONTAINER = "tensorflow"  # The training operator requires a container of this name.
_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
_CLEAN_POD_POLICIES = ("All", "Running", "None")
_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
_JOBSET_LABELS = {
    "JOBSET_NAME": "jobset.sigs.k8s.io/jobset-name",
    "REPLICATED_JOB_NAME": "jobset.sigs.k8s.io/replicatedjob-name",
    "JOB_INDEX": "jobset.sigs.k8s.io/job-index",
    "JOBSET_RESTART_ATTEMPT": "jobset.sigs.k8s.io/restart-attempt",
}
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE]\d+)?$")
_INT32 = 2**31 - 1


def _check_dns1035(field: str, name: Any, *, max_length: int = 63) -> str:
    """A DNS-1035 label (what the training operator requires of a TFJob name)."""
    if not isinstance(name, str) or len(name) > max_length or not _DNS1035.match(name):
        raise invalid(
            LaunchError,
            field,
            name,
            f"a DNS-1035 label: at most {max_length} lower-case letters, digits "
            "or '-', starting with a letter and ending with a letter or digit",
            "Example: 'resnet-50'.",
        )
    return name


def _check_namespace(namespace: Any) -> str:
    """A Kubernetes namespace (a DNS-1123 label)."""
    if not isinstance(namespace, str) or len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        raise invalid(
            LaunchError,
            "namespace",
            namespace,
            "a DNS-1123 label: at most 63 lower-case letters, "
            "digits or '-', starting and ending with a letter or digit",
            "Example: 'training'.",
        )
    return namespace


def _check_quantity(field: str, value: Any) -> str:
    """A positive Kubernetes resource quantity such as '4', '500m' or '16Gi'."""
    if not isinstance(value, str) or not _QUANTITY.match(value) or not re.search(r"[1-9]", value.split("e")[0]):
        raise invalid(LaunchError, field, value, "a positive Kubernetes quantity such as '4', '500m' or '16Gi'")
    return value


def _check_image(image: Any) -> str:
    """A container image reference; tfdist must be installed in it."""
    if not isinstance(image, str) or not image or not (image.isascii() and image.isprintable()) or " " in image:
        raise invalid(
            LaunchError,
            "image",
            image or None,
            "a container image with tfdist installed",
            "TensorFlow's own images do not have tfdist: build one (FROM tensorflow/tensorflow:2.17.1, "
            "COPY a tfdist clone and pip install it) and pass it as `image` (REGISTRY/NAME:TAG).",
        )
    return image


_GPU = "nvidia.com/gpu"


def _limits(cpu: str | None, memory: str | None, gpus: int) -> dict[str, Any]:
    require_int(LaunchError, "gpus", gpus, minimum=0, maximum=64)
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpu"] = _check_quantity("cpu", cpu)
    if memory is not None:
        limits["memory"] = _check_quantity("memory", memory)
    if gpus:
        limits[_GPU] = str(gpus)  # A quantity, as the API serializes it.
    return limits


def _mesh_wrap(config: LaunchConfig) -> list[str] | None:
    """With a mesh, TFJob pods run the command through the TF_CONFIG entry, which adds the DTENSOR_* variables."""
    if config.mesh is None:
        return None
    return TaskProgram.TF_CONFIG.argv("--mesh", config.mesh, "--", python="python")


def _container(
    config: LaunchConfig,
    job: str,
    image: str,
    limits: dict[str, Any],
    env: list[dict[str, Any]],
    wrap: list[str] | None = None,
) -> dict[str, Any]:
    runs_command = job in config.cmd_task_types()
    command = list(config.command) if runs_command else server_argv("python")
    variables = task_variables(config)
    if wrap is not None:
        command = wrap + list(config.command)  # tfdist's entry adds TF_USE_LEGACY_KERAS where the pod has tf-keras.
    else:  # The pod runs the command itself: tf-keras here stands for tf-keras in the image.
        variables.update(keras_variables(tf_keras_installed()))
    container: dict[str, Any] = {
        "name": _CONTAINER,
        "image": image,
        "command": command,
        "env": [{"name": name, "value": value} for name, value in variables.items()] + env,
        "ports": [{"name": "tfjob-port", "containerPort": TFJOB_PORT}],
    }
    if not _trains(config, job):  # GPUs go where the model trains: not to ps pods, nor a PS coordinator.
        limits = {key: value for key, value in limits.items() if key != _GPU}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return container


def _trains(config: LaunchConfig, job: str) -> bool:
    """Whether tasks of ``job`` run the model: workers and the evaluator; the chief too without ps."""
    return job in ("worker", "evaluator") or (job == "chief" and config.mode != "parameter_server")


def tfjob_manifest(
    config: LaunchConfig,
    *,
    image: str,
    name: str = "tfdist-job",
    namespace: str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int = 0,
    restart_policy: str = "ExitCode",
    clean_pod_policy: str = "Running",
    ttl_seconds_after_finished: int | None = None,
) -> dict[str, Any]:
    """A Kubeflow training-operator ``TFJob`` (kubeflow.org/v1) that passes the operator's admission rules.

    Tasks that run user code get ``config.command``; in a parameter-server
    topology the workers and ps run tfdist's TensorFlow server. With
    ``restart_policy='ExitCode'`` (the default) the operator restarts a pod
    only for retryable exit codes (128-255: see :mod:`tfdist.runtime.exit_codes`).

    Args:
      config: Topology and command; ``max_restarts`` becomes ``backoffLimit``.
      image: A container image with tfdist installed (required).
      name: The TFJob name (a DNS-1035 label).
      namespace: Kubernetes namespace; None: kubectl's current one.
      cpu: CPU limit per task, e.g. '4'.
      memory: Memory limit per task, e.g. '16Gi'.
      gpus: ``nvidia.com/gpu`` per task.
      restart_policy: One of Always, OnFailure, Never, ExitCode.
      clean_pod_policy: One of All, Running, None.
      ttl_seconds_after_finished: Delete the TFJob this long after it ends.

    Example:
        >>> from tfdist.launch import LaunchConfig
        >>> job = tfjob_manifest(LaunchConfig(command=("python", "train.py"), workers=2), image="me/train:1")
        >>> validate_tfjob(job), job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"]
        ([], 'ExitCode')
    """
    require_config(config)
    _check_dns1035("name", name)
    image = _check_image(image)
    limits = _limits(cpu, memory, gpus)
    replicas = _tfjob_replicas(config, image, limits, restart_policy)
    run_policy = _run_policy(config, clean_pod_policy, ttl_seconds_after_finished)
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(name, namespace),
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": replicas},
    }
    problems = validate_tfjob(manifest)
    if problems:  # Not reached for valid arguments; a guard against emitting what the operator rejects.
        raise invalid(LaunchError, "tfjob", name, "a manifest the training operator admits", "; ".join(problems))
    return manifest


def _tfjob_replicas(config: LaunchConfig, image: str, limits: dict[str, Any], restart_policy: str) -> dict[str, Any]:
    """A TFJob's ``tfReplicaSpecs``: one replica type per TF job, each restarted by ``restart_policy``."""
    if restart_policy not in _RESTART_POLICIES:
        raise invalid(LaunchError, "restart_policy", restart_policy, f"one of {', '.join(_RESTART_POLICIES)}")
    return {
        _REPLICA_TYPES[job]: {
            "replicas": count,
            "restartPolicy": restart_policy,
            "template": {"spec": {"containers": [_container(config, job, image, limits, [], _mesh_wrap(config))]}},
        }
        for job, count in config.task_counts().items()
    }


def _run_policy(config: LaunchConfig, clean_pod_policy: str, ttl_seconds_after_finished: int | None) -> dict[str, Any]:
    """A TFJob's ``runPolicy``: which pods to delete, how many restarts, when to delete the job."""
    if clean_pod_policy not in _CLEAN_POD_POLICIES:
        raise invalid(LaunchError, "clean_pod_policy", clean_pod_policy, f"one of {', '.join(_CLEAN_POD_POLICIES)}")
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": clean_pod_policy,
        "backoffLimit": require_int(LaunchError, "max_restarts", config.max_restarts, minimum=0, maximum=_INT32),
    }
    if ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = require_int(
            LaunchError, "ttl_seconds_after_finished", ttl_seconds_after_finished, minimum=0, maximum=_INT32
        )
    return run_policy


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    """A manifest's ``metadata``: the name, and the namespace when one is given (else kubectl's current one)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = _check_namespace(namespace)
    return metadata


def validate_tfjob(manifest: dict[str, Any]) -> list[str]:
    """The training operator's admission checks for a TFJob (tfjob_webhook.go and the v1 API types).

    Returns one message per violation; an empty list means the operator admits it.
    """
    problems = []
    name = manifest.get("metadata", {}).get("name")
    if not isinstance(name, str) or len(name) > 63 or not _DNS1035.match(name):
        problems.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    spec = manifest.get("spec", {})
    policy = spec.get("runPolicy", {})
    if policy.get("cleanPodPolicy", "None") not in _CLEAN_POD_POLICIES:
        problems.append(f"spec.runPolicy.cleanPodPolicy: {policy['cleanPodPolicy']!r} not in {_CLEAN_POD_POLICIES}")
    for key in ("backoffLimit", "ttlSecondsAfterFinished", "activeDeadlineSeconds"):
        value = policy.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _INT32:
            problems.append(f"spec.runPolicy.{key}: {value!r} is not a non-negative int32")
    replica_specs = spec.get("tfReplicaSpecs")
    if not replica_specs:
        return problems + ["spec.tfReplicaSpecs: must be required"]
    if sum(rtype in ("Chief", "Master") for rtype in replica_specs) > 1:
        problems.append("spec.tfReplicaSpecs: must not have more than 1 Chief or Master role")
    for rtype, replica in replica_specs.items():
        path = f"spec.tfReplicaSpecs[{rtype}]"
        if replica.get("restartPolicy", "Never") not in _RESTART_POLICIES:
            problems.append(f"{path}.restartPolicy: {replica['restartPolicy']!r} not in {_RESTART_POLICIES}")
        containers = ((replica.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            problems.append(f"{path}.template.spec.containers: must be specified")
        for index, container in enumerate(containers):
            if not container.get("image"):
                problems.append(f"{path}.template.spec.containers[{index}].image: must be required")
        if containers and not any(c.get("name") == _CONTAINER for c in containers):
            problems.append(f"{path}.template.spec.containers: must have at least one container with name {_CONTAINER}")
    return problems


def jobset_manifest(
    config: LaunchConfig,
    *,
    image: str,
    name: str = "tfdist-job",
    namespace: str | None = None,
    cpu: str | None = None,
    memory: str | None = None,
    gpus: int = 0,
) -> dict[str, Any]:
    """A ``JobSet`` (jobset.x-k8s.io/v1alpha2) whose pods build their TF_CONFIG with tfdist.

    Kubeflow Trainer v2 runs TrainJobs as JobSets but gives TensorFlow no
    TF_CONFIG. Here each TF job type is one replicated Job of indexed pods with
    stable host names (``{name}-{job}-0-{index}.{name}``); every pod runs
    ``python -m tfdist.launch.tasks.jobset``, which reads the JobSet labels (passed
    in by the downward API) and ``JOB_COMPLETION_INDEX``, builds TF_CONFIG with
    :meth:`ClusterSpec.from_jobset` and execs the command (or the TF server).
    Exit codes follow :mod:`tfdist.runtime.exit_codes`: 1-127 fail the JobSet,
    others restart it, up to ``config.max_restarts`` times.

    Example:
        >>> from tfdist.launch import LaunchConfig
        >>> js = jobset_manifest(LaunchConfig(command=("python", "train.py"), workers=2), image="me/train:1")
        >>> [r["name"] for r in js["spec"]["replicatedJobs"]], js["spec"]["network"]["subdomain"]
        (['worker'], 'tfdist-job')
    """
    require_config(config)
    _check_dns1035("name", name)
    image = _check_image(image)
    limits = _limits(cpu, memory, gpus)
    counts = config.task_counts()
    for job, count in counts.items():  # JobSet's webhook: the longest pod name must be a DNS-1035 label.
        _check_dns1035("name", name, max_length=63 - len(f"-{job}-0-{count - 1}-abcde"))
    env, wrap = _label_variables(), _jobset_entry(config, counts)
    replicated = [
        _indexed_job(job, count, container=_container(config, job, image, limits, env, wrap=wrap), subdomain=name)
        for job, count in counts.items()
    ]
    trainers = ["chief"] if config.mode == "parameter_server" else [j for j in ("chief", "worker") if j in counts]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(name, namespace),
        "spec": {
            "network": {"enableDNSHostnames": True, "subdomain": name, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": trainers},
            "failurePolicy": {
                "maxRestarts": config.max_restarts,
                "rules": [
                    {"name": "permanentExitCode", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
                ],
            },
            "replicatedJobs": replicated,
        },
    }


def _label_variables() -> list[dict[str, Any]]:
    """The JobSet labels a pod reads (``JOBSET_NAME``, ``JOB_INDEX``, ...), passed in by the downward API."""
    return [
        {"name": var, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
        for var, label in _JOBSET_LABELS.items()
    ]


def _jobset_entry(config: LaunchConfig, counts: dict[str, int]) -> list[str]:
    """What a JobSet pod runs before the command: tfdist's JobSet entry, which builds TF_CONFIG from the labels."""
    jobs = ",".join(f"{job}={n}" for job, n in counts.items())
    return TaskProgram.JOBSET.argv(
        "--jobs",
        jobs,
        "--port",
        str(TFJOB_PORT),
        "--run-on",
        config.run_on,
        *(["--mesh", config.mesh] if config.mesh is not None else []),
        "--",
        python="python",
    )


def _indexed_job(job: str, count: int, *, container: dict[str, Any], subdomain: str) -> dict[str, Any]:
    """One replicated Job of a JobSet: ``count`` indexed pods of ``job``, failed for good on a permanent exit code."""
    permanent = [code for code in range(1, 256) if not exit_codes.is_retryable(code)]
    pod = {"restartPolicy": "Never", "subdomain": subdomain, "containers": [container]}
    return {
        "name": job,
        "replicas": 1,
        "template": {
            "spec": {
                "parallelism": count,
                "completions": count,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "FailJob",
                            "onExitCodes": {"containerName": _CONTAINER, "operator": "In", "values": permanent},
                        }
                    ]
                },
                "template": {"spec": pod},
            }
        },
    }
