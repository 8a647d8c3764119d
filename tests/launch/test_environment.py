"""A task's environment: TF_USE_LEGACY_KERAS=1 only where the task's interpreter has tf-keras (no TF import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfdist.cluster.spec import ClusterSpec
from tfdist.launch import environment
from tfdist.launch.config import LaunchConfig
from tfdist.runtime.versions import tf_keras_installed


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a venv with nothing installed: a stack without tf-keras (as TensorFlow 2.22's)."""
    venv = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    return str(venv / "bin" / "python")


def test_the_interpreter_a_command_starts_with_is_found_on_the_tasks_path(bare_python: str) -> None:
    path = {"PATH": os.path.dirname(bare_python)}
    assert environment.tasks_python(["python", "train.py"], path) == bare_python
    minor = "python{}.{}".format(*sys.version_info[:2])  # What a venv has beside python and python3.
    assert environment.tasks_python([minor, "-m", "x"], path) == os.path.join(path["PATH"], minor)
    assert environment.tasks_python([bare_python, "train.py"], {}) == bare_python
    assert environment.tasks_python(["bash", "train.sh"], path) is None  # Not an interpreter: this one stands.
    assert environment.tasks_python(["python"], {"PATH": "/no/such/dir"}) is None


def test_tf_keras_is_looked_up_in_the_interpreter_the_tasks_run(bare_python: str) -> None:
    here = tf_keras_installed()
    assert tf_keras_installed(bare_python, {}) is False
    assert tf_keras_installed(sys.executable, dict(os.environ)) is here
    assert tf_keras_installed("/no/such/python") is here  # It cannot answer: this interpreter's answer.

    def config(*command: str) -> LaunchConfig:
        return LaunchConfig(command=command, workers=1)

    on_path = {"PATH": os.path.dirname(bare_python)}
    assert environment.tasks_have_tf_keras(config("python", "train.py"), on_path) is False
    assert environment.tasks_have_tf_keras(config(bare_python, "train.py"), {}) is False
    assert environment.tasks_have_tf_keras(config(sys.executable, "-c", "pass"), {}) is here
    assert environment.tasks_have_tf_keras(config("true"), on_path) is here  # No interpreter: this one's.


def test_only_a_task_whose_interpreter_has_tf_keras_gets_tf_use_legacy_keras() -> None:
    config = LaunchConfig(command=("python", "train.py"), workers=2)
    spec = ClusterSpec.local(workers=2)
    with_tf_keras = environment.child_env({"PATH": "/bin"}, config, spec, "worker:0", 0, tf_keras=True)
    without = environment.child_env({"PATH": "/bin"}, config, spec, "worker:0", 0, tf_keras=False)
    assert with_tf_keras["TF_USE_LEGACY_KERAS"] == "1" and "TF_USE_LEGACY_KERAS" not in without
    assert {k: v for k, v in with_tf_keras.items() if k != "TF_USE_LEGACY_KERAS"} == without
    here = environment.child_env({}, config, spec, "worker:1", 0)  # A task entry: its own interpreter decides.
    assert ("TF_USE_LEGACY_KERAS" in here) is tf_keras_installed()
    assert "TF_USE_LEGACY_KERAS" not in environment.task_variables(config)  # Not a rule of the config alone.
    yours = environment.child_env({"TF_USE_LEGACY_KERAS": "0"}, config, spec, "worker:0", 0, tf_keras=False)
    assert yours["TF_USE_LEGACY_KERAS"] == "0"  # Without tf-keras the launcher leaves your setting alone.


def test_a_launch_gives_tf_use_legacy_keras_to_tasks_whose_interpreter_has_tf_keras(bare_python: str) -> None:
    from tfdist import launch

    report = "import os; print('LEGACY', os.environ.get('TF_USE_LEGACY_KERAS'))"
    seen = {}
    for python in (sys.executable, bare_python):
        result = launch.run([python, "-c", report], workers=1, timeout=60, base_env={"PATH": os.defpath})
        assert (result.exit_code, result.reason) == (0, "ok")
        seen[python] = result.task("worker:0").output.splitlines()[-1]
    assert seen == {sys.executable: f"LEGACY {'1' if tf_keras_installed() else None}", bare_python: "LEGACY None"}
