"""The same topology for real engines: per-task TF_CONFIG, a Kubeflow TFJob, a Slurm script.

Example:
    >>> from tfdist.launch.config import LaunchConfig
    >>> from tfdist.launch import emit
    >>> config = LaunchConfig(command=("python", "train.py"), workers=2)
    >>> sorted(emit.tf_configs(config))
    ['worker:0', 'worker:1']
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from tfdist.cluster import ClusterSpec
from tfdist.launch._emit_slurm import slurm_script
from tfdist.launch.config import LaunchConfig

__all__ = ["emit_spec", "tf_configs", "tfjob_manifest", "slurm_script", "to_yaml", "EMIT_FORMATS"]

EMIT_FORMATS = ("tf-config", "tfjob", "slurm")
SERVER_COMMAND = ("python", "-m", "tfdist.launch.server")
TFJOB_PORT = 2222
_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


def _counts(config: LaunchConfig) -> dict[str, int]:
    counts = {"chief": int(config.chief), "worker": config.workers, "ps": config.ps, "evaluator": int(config.evaluator)}
    return {job: n for job, n in counts.items() if n}


def emit_spec(config: LaunchConfig, *, hosts: Optional[Sequence[str]] = None, port: int = TFJOB_PORT) -> ClusterSpec:
    """The cluster on real hosts: ``hosts`` in task order, or ``{job}-{index}`` names."""
    names = config.task_names()
    hosts = list(hosts) if hosts else [name.replace(":", "-") for name in names]
    if len(hosts) < len(names):
        from tfdist.errors import LaunchError, invalid

        raise invalid(LaunchError, "--hosts", hosts, f"{len(names)} hosts, one per task ({', '.join(names)})")
    jobs: dict[str, list[str]] = {}
    for name, host in zip(names, hosts):
        jobs.setdefault(name.split(":")[0], []).append(host if ":" in host else f"{host}:{port}")
    return ClusterSpec(jobs=jobs)


def tf_configs(config: LaunchConfig, *, hosts: Optional[Sequence[str]] = None,
               port: int = TFJOB_PORT) -> dict[str, dict[str, Any]]:
    """TF_CONFIG for every task, keyed 'type:index'."""
    spec = emit_spec(config, hosts=hosts, port=port)
    return {t.name: spec.to_tf_config(t.type, t.index) for t in spec.tasks()}


def tfjob_manifest(config: LaunchConfig, *, name: str = "tfdist-job", namespace: Optional[str] = None,
                   image: str = "tensorflow/tensorflow:2.17.1", cpu: Optional[str] = None,
                   memory: Optional[str] = None, gpus: int = 0) -> dict[str, Any]:
    """A Kubeflow training-operator ``TFJob`` (kubeflow.org/v1) for the topology.

    Tasks that run user code get ``config.command``; in a parameter-server
    topology the workers and ps run tfdist's TensorFlow server.
    """
    limits: dict[str, Any] = {}
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    replicas = {}
    for job, count in _counts(config).items():
        command = list(config.command) if job in config.cmd_task_types() else list(SERVER_COMMAND)
        container: dict[str, Any] = {
            "name": "tensorflow",  # The training operator requires this container name.
            "image": image,
            "command": command,
            "env": [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}] +
                   ([{"name": "GRPC_FAIL_FAST", "value": "use_caller"}] if config.ps else []),
            "ports": [{"name": "tfjob-port", "containerPort": TFJOB_PORT}],
        }
        if limits:
            container["resources"] = {"limits": dict(limits)}
        replicas[_REPLICA_TYPES[job]] = {"replicas": count, "restartPolicy": "OnFailure",
                                         "template": {"spec": {"containers": [container]}}}
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
            "spec": {"runPolicy": {"backoffLimit": config.max_restarts, "cleanPodPolicy": "Running"},
                     "tfReplicaSpecs": replicas}}


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))  # A JSON string is a valid double-quoted YAML scalar.


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for manifests (mappings, lists, scalars)."""
    pad = "  " * indent
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                out.append(f"{pad}{key}: {_yaml_scalar(item)}")
        return "\n".join(out)
    if isinstance(value, list):
        out = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                body = to_yaml(item, indent + 1).lstrip()
                out.append(f"{pad}- {body}")
            else:
                out.append(f"{pad}- {_yaml_scalar(item)}")
        return "\n".join(out)
    return pad + _yaml_scalar(value)
