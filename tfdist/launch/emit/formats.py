"""The same topology for real engines: per-task TF_CONFIG, a Kubeflow TFJob, a JobSet, a Slurm script.

Example:
    >>> from tfdist.launch import LaunchConfig, tf_configs
    >>> config = LaunchConfig(command=("python", "train.py"), workers=2)
    >>> sorted(tf_configs(config))
    ['worker:0', 'worker:1']
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import LaunchConfig, require_config
from tfdist.launch.emit.kubernetes import TFJOB_PORT, jobset_manifest, tfjob_manifest, validate_tfjob
from tfdist.launch.emit.slurm import slurm_script

__all__ = ["jobset_manifest", "slurm_script", "tf_configs", "tfjob_manifest", "to_yaml", "validate_tfjob"]

EMIT_FORMATS = ("tf-config", "tfjob", "jobset", "slurm")


def _emit_spec(config: LaunchConfig, *, hosts: Sequence[str] | None = None, port: int = TFJOB_PORT) -> ClusterSpec:
    """The cluster on real hosts: ``hosts`` in task order, or ``{job}-{index}`` names."""
    names = require_config(config).task_names()
    require_int(LaunchError, "port", port, minimum=1, maximum=65535)
    if hosts is not None and (
        isinstance(hosts, str) or not isinstance(hosts, Sequence) or not all(isinstance(host, str) for host in hosts)
    ):
        raise invalid(LaunchError, "hosts", hosts, "a list of host names, one per task")
    hosts = list(hosts) if hosts else [name.replace(":", "-") for name in names]
    if len(hosts) < len(names):
        raise invalid(LaunchError, "hosts", hosts, f"{len(names)} hosts, one per task ({', '.join(names)})")
    jobs: dict[str, list[str]] = {}
    for name, host in zip(names, hosts):
        jobs.setdefault(split_task_name(name)[0], []).append(host if ":" in host else f"{host}:{port}")
    return ClusterSpec(jobs={job: dict(enumerate(addresses)) for job, addresses in jobs.items()})


def tf_configs(
    config: LaunchConfig, *, hosts: Sequence[str] | None = None, port: int = TFJOB_PORT
) -> dict[str, dict[str, Any]]:
    """TF_CONFIG for every task, keyed 'type:index'."""
    spec = _emit_spec(config, hosts=hosts, port=port)
    return {t.name: spec.to_tf_config(t.type, t.index) for t in spec.tasks()}


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))  # A JSON string is a valid double-quoted YAML scalar.


def to_yaml(value: Any, indent: int = 0) -> str:
    """A small YAML writer for manifests (mappings, lists, scalars).

    Example:
        >>> to_yaml({"kind": "TFJob", "spec": {"replicas": 2, "args": ["train.py"]}}).splitlines()
        ['kind: "TFJob"', 'spec:', '  replicas: 2', '  args:', '    - "train.py"']
    """
    pad = "  " * indent
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, list) and len(item) > 8 and not any(isinstance(v, (dict, list)) for v in item):
                out.append(f"{pad}{key}: {to_yaml(item)}")
            elif isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{key}:\n{to_yaml(item, indent + 1)}")
            else:
                out.append(f"{pad}{key}: {_yaml_scalar(item)}")
        return "\n".join(out)
    if isinstance(value, list) and len(value) > 8 and not any(isinstance(v, (dict, list)) for v in value):
        return pad + "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"  # A flow sequence, e.g. exit codes.
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
