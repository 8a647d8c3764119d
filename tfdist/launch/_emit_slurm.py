"""The ``sbatch`` script ``tfdist-launch --emit slurm`` prints (see docs/slurm.md)."""

from __future__ import annotations

import re
import shlex
import sys
from typing import Optional

from tfdist import exit_codes
from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import LaunchConfig, require_config

# Exit codes a rerun cannot fix: tfdist's bad-configuration code, and a command that cannot be run.
PERMANENT_CODES = (exit_codes.BAD_CONFIG, exit_codes.CANNOT_EXECUTE, exit_codes.NOT_FOUND)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_TIME = re.compile(r"^(?:\d{1,6}|\d{1,6}:\d{1,2}|\d{1,6}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(?::\d{1,2}){0,2}"
                   r"|UNLIMITED|INFINITE)$")
_PYTHON_NAME = re.compile(r"^python(?:3(?:\.\d+)?)?$")
_FIRST_FAILURE = r"s/^srun: error: .*: tasks\{0,1\} [0-9,-]*: Exited with exit code \([0-9]*\).*/\1/p"


def check_job_name(name: str) -> str:
    """A Slurm job name that cannot break out of its ``#SBATCH`` line."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(LaunchError, "--name", name, "1-128 letters, digits, '.', '_', '+' or '-', "
                      "starting with a letter or digit", "Example: --name resnet-50.")
    return name


def check_time(text: str) -> str:
    """A Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED."""
    if not isinstance(text, str) or not _TIME.match(text):
        raise invalid(LaunchError, "--time", text, "a Slurm time limit (MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED)",
                      "Example: --time 04:00:00.")
    return text


def check_python(python: str) -> str:
    """An interpreter path without control characters (it is shell-quoted in the script)."""
    if not isinstance(python, str) or not python or any(ord(c) < 32 or ord(c) == 127 for c in python):
        raise invalid(LaunchError, "--python", python, "the path of a Python with tfdist installed on every node")
    return python


def slurm_script(config: LaunchConfig, *, name: str = "tfdist-job", time_limit: str = "01:00:00",
                 cpus_per_task: Optional[int] = None, gpus_per_task: int = 0, port_base: Optional[int] = None,
                 python: Optional[str] = None, tf_log_level: int = 2) -> str:
    """An ``sbatch`` script: one Slurm task per TF task, each building TF_CONFIG with tfdist.

    Args:
      config: The topology and command; ``config.max_restarts`` reruns of the
        step after a failure (each resumes from the user's BackupAndRestore).
      name: The Slurm job name.
      time_limit: ``#SBATCH --time``.
      cpus_per_task: ``#SBATCH --cpus-per-task``; None: Slurm's default.
      gpus_per_task: ``#SBATCH --gpus-per-task`` when > 0.
      port_base: A fixed first port per node; None: a per-job port base from
        ``SLURM_JOB_ID`` and a free-port check (see ``tfdist._slurm.job_port_base``).
      python: The interpreter the tasks run (and the command, when it starts
        with ``python``/``python3``); default the one running this.
      tf_log_level: Default ``TF_CPP_MIN_LOG_LEVEL`` (the submit environment's value wins).

    Example:
        >>> from tfdist.launch.config import LaunchConfig
        >>> script = slurm_script(LaunchConfig(command=("python", "train.py"), workers=2), python="/opt/py")
        >>> "PYTHON=/opt/py" in script and "#SBATCH --ntasks=2" in script
        True
    """
    require_config(config)
    check_job_name(name)
    check_time(time_limit)
    python = check_python(sys.executable if python is None else python)
    require_int(LaunchError, "--gpus", gpus_per_task, minimum=0, maximum=1024)
    require_int(LaunchError, "--tf-log-level", tf_log_level, minimum=0, maximum=3)
    if cpus_per_task is not None:
        require_int(LaunchError, "--cpus-per-task", cpus_per_task, minimum=1, maximum=65536)
    counts = {job: n for job, n in (("chief", int(config.chief)), ("worker", config.workers), ("ps", config.ps),
                                    ("evaluator", int(config.evaluator))) if n}
    total = sum(counts.values())
    if port_base is not None:
        require_int(LaunchError, "--port-base", port_base, minimum=1024, maximum=65536 - total,
                    fix=f"The {total} tasks on one node use --port-base .. --port-base+{total - 1}.")
    jobs = ",".join(f"{job}={n}" for job, n in counts.items())
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --ntasks={total}", f"#SBATCH --time={time_limit}"]
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={gpus_per_task}")
    command = shlex.join(config.command)
    if _PYTHON_NAME.match(config.command[0]):  # 'python train.py' runs on the pinned interpreter too.
        command = " ".join(['"$PYTHON"', *map(shlex.quote, config.command[1:])])
    task_args = (f"-m tfdist.cli.slurm_task --jobs {jobs} --port-base \"$PORT_BASE\" --restart \"$attempt\" "
                 f"--run-on {shlex.quote(config.run_on)} -- {command}")
    ports = (f"PORT_BASE={port_base}" if port_base is not None else
             "# This job's ports: a slot of 20000-32767 chosen by SLURM_JOB_ID, the next slot if a port is taken.\n"
             'PORT_BASE=$("$PYTHON" -m tfdist.cli.slurm_task --pick-port-base) || exit 2')
    lines += [
        f"# tfdist job {jobs}: one Slurm task per TensorFlow task, each building its TF_CONFIG from SLURM_*",
        "# (job names sorted, ranks in order, ports PORT_BASE+i for the i-th task on a node).",
        "set -uo pipefail",
        f"PYTHON={shlex.quote(python)}",
        f"MAX_RESTARTS={config.max_restarts}",
        f'export TF_CPP_MIN_LOG_LEVEL="${{TF_CPP_MIN_LOG_LEVEL:-{tf_log_level}}}"',
        "export TF_USE_LEGACY_KERAS=1",
        "# Every node must run tfdist with this interpreter: check once per node before the real step.",
        "if ! srun --ntasks-per-node=1 --ntasks=\"${SLURM_JOB_NUM_NODES:-1}\" \"$PYTHON\" -c 'import tfdist' >&2; then",
        '  echo "tfdist job: error: $PYTHON cannot import tfdist on every node of this job (srun names the node'
        ' above). Install tfdist for that interpreter on every node, or emit the script with --python PATH." >&2',
        "  exit 2",
        "fi",
        ports,
        'SRUN_LOG=$(mktemp "${TMPDIR:-/tmp}/tfdist-srun.XXXXXX")',
        "trap 'rm -f \"$SRUN_LOG\"' EXIT",
        "attempt=0",
        "while true; do",
        '  { srun --kill-on-bad-exit=1 "$PYTHON" ' + task_args + ' 2>&1 1>&3 | tee "$SRUN_LOG" >&2; } 3>&1',
        "  code=$?",
        '  [ "$code" -eq 0 ] && exit 0',
        "  # srun returns 128+signal when it stopped the other tasks: the job's code is the first task's failure.",
        f"  first=$(sed -n '{_FIRST_FAILURE}' \"$SRUN_LOG\" | head -n 1)",
        '  code=${first:-$code}',
        f'  case "$code" in {"|".join(map(str, PERMANENT_CODES))}) exit "$code";; esac  # a rerun would fail the same way',
        '  [ "$attempt" -ge "$MAX_RESTARTS" ] && exit "$code"',
        "  attempt=$((attempt + 1))",
        '  echo "tfdist job: step failed with exit code $code; restart $attempt of $MAX_RESTARTS" >&2',
        "  sleep 1",
        "done",
        "",
    ]
    return "\n".join(lines)
