"""What each task of a launch runs, and with which environment: one rule for every engine and emitter.

The local runner, the Slurm and JobSet task entries (``tfdist.cli``) and the
Kubernetes manifests all take a task's program and variables from here.

Example:
    >>> server_argv("python")
    ['python', '-m', 'tfdist.launch.tasks.server']
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from tfdist.cluster.mesh_shape import MeshShape, dtensor_variables
from tfdist.cluster.spec import TF_CONFIG_VAR, ClusterSpec, split_task_name
from tfdist.launch.config import LaunchConfig
from tfdist.launch.tasks.programs import TaskProgram
from tfdist.runtime.logs import DEFAULT_LEVEL, LEVEL_VAR

TASK_VAR = "TFDIST_TASK"
_RESTART_VAR = "TFDIST_RESTART"


def server_argv(python: str = sys.executable) -> list[str]:
    """The TensorFlow server's command line, for tasks that do not run the user's command."""
    return TaskProgram.SERVER.argv(python=python)


def task_variables(config: LaunchConfig) -> dict[str, str]:
    """The variables every task of ``config`` gets, wherever it runs (local children, TFJob and JobSet pods).

    Example:
        >>> task_variables(LaunchConfig(command=("python",), workers=2, ps=1, chief=True))["TF_NUM_INTEROP_THREADS"]
        '4'
    """
    env = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
    inter_floor = 0
    if config.mode == "parameter_server":
        # TF's parameter-server guide: inter-op threads >= workers + 1 on small machines.
        inter_floor = config.workers + int(config.chief) + 1
        env["GRPC_FAIL_FAST"] = "use_caller"
    if config.threads_per_task:
        env["TF_NUM_INTRAOP_THREADS"] = str(config.threads_per_task)
        env["OMP_NUM_THREADS"] = str(config.threads_per_task)
        inter_floor = max(inter_floor, config.threads_per_task)
    if inter_floor:
        env["TF_NUM_INTEROP_THREADS"] = str(inter_floor)
    return env


def child_env(
    base: Mapping[str, str], config: LaunchConfig, spec: ClusterSpec, task: str, restart: int
) -> dict[str, str]:
    """Returns the environment for ``task`` ('type:index'); ``base`` is not changed."""
    task_type, index = split_task_name(task)
    env = dict(base)
    env.update(config.env)
    env[TF_CONFIG_VAR] = json.dumps(spec.to_tf_config(task_type, index))
    env.update(task_variables(config))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # The tfdist logger's default in the task (tfdist/runtime/logs.py): `log_level`, else what the launcher got.
    if config.log_level is not None:
        env[LEVEL_VAR] = config.log_level
    else:
        env.setdefault(LEVEL_VAR, DEFAULT_LEVEL)
    if config.mesh is not None and task_type in ("chief", "worker"):
        env.update(dtensor_variables(spec.with_task(task_type, index), MeshShape.parse(config.mesh)))
    env[TASK_VAR] = task
    env[_RESTART_VAR] = str(restart)
    return env
