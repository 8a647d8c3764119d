"""What each task of a launch runs, and with which environment: one rule for every engine and emitter.

The local runner, the Slurm and JobSet task entries (``tfdist.cli``) and the
Kubernetes manifests all take a task's program and variables from here.

``TF_USE_LEGACY_KERAS=1`` (``tf.keras`` is then tf-keras) goes only to tasks whose interpreter has tf-keras
installed: without it (TensorFlow 2.22 has none) the setting makes ``tf.keras`` fail to import. The task
entries (Slurm, JobSet, a TFJob under a mesh) look at their own interpreter; the local launcher at the one
the command starts with (:func:`tasks_python`); a TFJob's pods, which run the command directly, get what the
interpreter writing the manifest has.

Example:
    >>> server_argv("python")
    ['python', '-m', 'tfdist.launch.tasks.server']
    >>> tasks_python(["bash", "train.sh"], {}) is None
    True
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence

from tfdist.cluster.mesh_shape import MeshShape, dtensor_variables
from tfdist.cluster.spec import TF_CONFIG_VAR, ClusterSpec, split_task_name
from tfdist.launch.config import LaunchConfig
from tfdist.launch.tasks.programs import TaskProgram
from tfdist.runtime.logs import DEFAULT_LEVEL, LEVEL_VAR
from tfdist.runtime.versions import tf_keras_installed

TASK_VAR = "TFDIST_TASK"
_RESTART_VAR = "TFDIST_RESTART"
LEGACY_KERAS_VAR = "TF_USE_LEGACY_KERAS"
PYTHON_NAME = re.compile(r"^python(?:3(?:\.\d+)?)?$")  # 'python', 'python3', 'python3.11': an interpreter.


def server_argv(python: str = sys.executable) -> list[str]:
    """The TensorFlow server's command line, for tasks that do not run the user's command."""
    return TaskProgram.SERVER.argv(python=python)


def task_variables(config: LaunchConfig) -> dict[str, str]:
    """The variables every task of ``config`` gets, wherever it runs (local children, TFJob and JobSet pods).

    Example:
        >>> task_variables(LaunchConfig(command=("python",), workers=2, ps=1, chief=True))["TF_NUM_INTEROP_THREADS"]
        '4'
    """
    env = {"PYTHONUNBUFFERED": "1"}
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


def keras_variables(tf_keras: bool) -> dict[str, str]:
    """``TF_USE_LEGACY_KERAS=1`` where the task's interpreter has tf-keras (``tf.keras`` is then tf-keras, and a
    Keras 3 script says ``import keras``); nothing where it has none, where the setting breaks ``tf.keras``."""
    return {LEGACY_KERAS_VAR: "1"} if tf_keras else {}


def tasks_python(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The Python interpreter ``command`` starts with ('python3 train.py', '/venv/bin/python -m x'), found on
    ``env``'s PATH; None when it starts with something else (a script, a binary) or is not found."""
    if not command or not PYTHON_NAME.match(os.path.basename(command[0])):
        return None
    return shutil.which(command[0], path=env.get("PATH", os.defpath))


def tasks_have_tf_keras(config: LaunchConfig, base: Mapping[str, str]) -> bool:
    """Whether the interpreter ``config``'s command runs has tf-keras installed, asked once per launch: this
    interpreter's metadata when the command runs it (or is no Python interpreter), else that interpreter's,
    asked in a child process with the tasks' environment."""
    env = {**base, **config.env}
    python = tasks_python(config.command, env)
    if python is None or _this_interpreter(python):
        return tf_keras_installed()
    return tf_keras_installed(python, env)


def _this_interpreter(python: str) -> bool:
    """Whether ``python`` is this interpreter: the same file, from the same directory (a venv's ``bin``)."""
    here = sys.executable
    same_directory = os.path.dirname(os.path.abspath(python)) == os.path.dirname(os.path.abspath(here))
    return same_directory and os.path.realpath(python) == os.path.realpath(here)


def child_env(
    base: Mapping[str, str],
    config: LaunchConfig,
    spec: ClusterSpec,
    task: str,
    restart: int,
    *,
    tf_keras: bool | None = None,
) -> dict[str, str]:
    """Returns the environment for ``task`` ('type:index'); ``base`` is not changed.

    ``tf_keras``: whether the task's interpreter has tf-keras (:func:`keras_variables`); None: this one's.
    """
    task_type, index = split_task_name(task)
    env = dict(base)
    env.update(config.env)
    env[TF_CONFIG_VAR] = json.dumps(spec.to_tf_config(task_type, index))
    env.update(task_variables(config))
    env.update(keras_variables(tf_keras_installed() if tf_keras is None else tf_keras))
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
