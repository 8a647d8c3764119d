"""The table of task programs: every module a launch starts with ``python -m``, and its command line.

The local runner, the engines, the function runner and the emitted Kubernetes and Slurm jobs start these
programs only through :class:`TaskProgram`, so each module name is spelled once, here. The layer rule
(``tests/test_layers.py``) reads this table: a module that uses ``TaskProgram.SERVER`` uses
``tfdist.launch.tasks.server``, as an ``import`` would.

Example:
    >>> TaskProgram.SERVER.argv("--exit-with-chief", "3", python="python")
    ['python', '-m', 'tfdist.launch.tasks.server', '--exit-with-chief', '3']
    >>> TaskProgram.SLURM.shell('"$PYTHON"', "--pick-port-base")
    '"$PYTHON" -m tfdist.launch.tasks.slurm --pick-port-base'
"""

from __future__ import annotations

import enum
import sys


class TaskProgram(enum.Enum):
    """A program of :mod:`tfdist.launch.tasks`; its value is the module that ``python -m`` runs."""

    SERVER = "tfdist.launch.tasks.server"  # a TensorFlow server (ps, and workers that run no user code)
    SLURM = "tfdist.launch.tasks.slurm"  # a Slurm task's entry: its TF_CONFIG from SLURM_*, then the command
    JOBSET = "tfdist.launch.tasks.jobset"  # a JobSet pod's entry: its TF_CONFIG from the JobSet labels
    TF_CONFIG = "tfdist.launch.tasks.tf_config"  # a TFJob pod's entry under a mesh: the DTENSOR_* variables
    FUNCTION = "tfdist.launch.tasks.function"  # a Python function as a task
    FORKSERVER = "tfdist.launch.tasks.forkserver"  # an interpreter with TensorFlow imported that forks tasks
    NETNS = "tfdist.launch.tasks.netns"  # the holder of the local engine's private network namespace
    DATA_SERVICE = "tfdist.launch.tasks.data_service"  # a tf.data service dispatcher and its workers

    @property
    def module(self) -> str:
        """The module ``python -m`` runs, e.g. ``'tfdist.launch.tasks.server'``."""
        return str(self.value)

    def argv(self, *args: str, python: str = sys.executable) -> list[str]:
        """The program's command line: ``[python, '-m', module, *args]``."""
        return [python, "-m", self.module, *args]

    def shell(self, python: str, *words: str) -> str:
        """The command line as shell text, for a script: ``words`` are shell words already quoted."""
        return " ".join(self.argv(*words, python=python))
