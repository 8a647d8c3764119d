"""The environment of each child task: a copy of the parent's plus TF_CONFIG and limits."""

from __future__ import annotations

import json
from collections.abc import Mapping

from tfdist.cluster import TF_CONFIG_VAR, ClusterSpec
from tfdist.launch.config import LaunchConfig

TASK_VAR = "TFDIST_TASK"
RESTART_VAR = "TFDIST_RESTART"


def child_env(base: Mapping[str, str], config: LaunchConfig, spec: ClusterSpec, task: str,
              restart: int) -> dict[str, str]:
    """Returns the environment for ``task`` ('type:index'); ``base`` is not changed."""
    task_type, _, index = task.partition(":")
    env = dict(base)
    env.update(config.env)
    env[TF_CONFIG_VAR] = json.dumps(spec.to_tf_config(task_type, int(index)))
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env[TASK_VAR] = task
    env[RESTART_VAR] = str(restart)
    inter_floor = 0
    if config.mode == "parameter_server":
        # TF's parameter-server guide: inter-op threads >= workers + 1 on small machines.
        inter_floor = spec.num_workers + 1
        env["GRPC_FAIL_FAST"] = "use_caller"
    if config.threads_per_task:
        env["TF_NUM_INTRAOP_THREADS"] = str(config.threads_per_task)
        env["OMP_NUM_THREADS"] = str(config.threads_per_task)
        inter_floor = max(inter_floor, config.threads_per_task)
    if inter_floor:
        env["TF_NUM_INTEROP_THREADS"] = str(inter_floor)
    return env
