"""The ``sbatch`` script ``tfdist-launch --emit slurm`` prints (see docs/slurm.md)."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence

from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import LaunchConfig, require_config
from tfdist.launch.environment import PYTHON_NAME
from tfdist.launch.tasks.programs import TaskProgram
from tfdist.runtime import exit_codes

# Exit codes a rerun cannot fix: tfdist's bad-configuration code, and a command that cannot be run.
_PERMANENT_CODES = (exit_codes.BAD_CONFIG, exit_codes.CANNOT_EXECUTE, exit_codes.NOT_FOUND)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_TIME = re.compile(
    r"^(?:\d{1,6}|\d{1,6}:\d{1,2}|\d{1,6}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(?::\d{1,2}){0,2}"
    r"|UNLIMITED|INFINITE)$"
)
_PYTHON = '"$PYTHON"'  # The script's pinned interpreter, as a shell word.
_FIRST_FAILURE = r"s/^srun: error: .*: tasks\{0,1\} [0-9,-]*: Exited with exit code \([0-9]*\).*/\1/p"

# How an elastic run sizes its step: from the allocation Slurm granted this run, at most chief + --max-workers.
_ELASTIC_SIZE = """\
# Elastic: the step has as many tasks as the allocation Slurm granted this run (fewer nodes of the
# --nodes range, or a requeued job given fewer tasks), at most chief + --max-workers.
TASKS=$({size}) || exit 2
echo "tfdist job: Slurm restart count ${{SLURM_RESTART_COUNT:-0}}: $TASKS tasks on ${{SLURM_JOB_NUM_NODES:-1}} node(s)" >&2"""


def _check_job_name(name: str) -> str:
    """A Slurm job name that cannot break out of its ``#SBATCH`` line."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(
            LaunchError,
            "name",
            name,
            "1-128 letters, digits, '.', '_', '+' or '-', starting with a letter or digit",
            "Example: 'resnet-50'.",
        )
    return name


def _check_time(text: str) -> str:
    """A Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED."""
    if not isinstance(text, str) or not _TIME.match(text):
        raise invalid(
            LaunchError,
            "time_limit",
            text,
            "a Slurm time limit (MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED)",
            "Example: '04:00:00'.",
        )
    return text


def _check_python(python: str) -> str:
    """An interpreter path without control characters (it is shell-quoted in the script)."""
    if not isinstance(python, str) or not python or any(ord(c) < 32 or ord(c) == 127 for c in python):
        raise invalid(LaunchError, "python", python, "the path of a Python with tfdist installed on every node")
    return python


# The #SBATCH options the script writes itself, with the argument that sets each.
_OWN_OPTIONS = {
    "job-name": "name",
    "time": "time_limit",
    "ntasks": "workers",
    "nodes": "min_workers",
    "ntasks-per-node": "tasks_per_node",
    "cpus-per-task": "cpus_per_task",
    "gpus-per-task": "gpus_per_task",
    "requeue": "min_workers",
    "open-mode": "min_workers",
}
_SBATCH_OPTION = re.compile(r"^(?:--)?([a-z][a-z0-9-]*)(?:=([^\s'\"`$\\;]+))?$")


def _sbatch_options(options: Sequence[str]) -> list[str]:
    """``options`` as ``--name[=value]``, each checked: one option of plain characters, not one tfdist writes."""
    if isinstance(options, str) or not isinstance(options, (list, tuple)):
        raise invalid(LaunchError, "sbatch", options, "a list of options such as ['partition=gpu']")
    out = []
    for option in options:
        match = _SBATCH_OPTION.match(option) if isinstance(option, str) else None
        if match is None:
            raise invalid(
                LaunchError,
                "sbatch",
                option,
                "one sbatch option, 'name=value' or '--name=value', without spaces, quotes or shell characters",
                "For example 'partition=gpu', 'account=ml' or 'qos=high'.",
            )
        if match.group(1) in _OWN_OPTIONS:
            raise invalid(
                LaunchError,
                "sbatch",
                option,
                f"an option tfdist does not write itself (it writes --{match.group(1)})",
                f"Set it with `{_OWN_OPTIONS[match.group(1)]}`.",
            )
        out.append(f"--{match.group(1)}" + (f"={match.group(2)}" if match.group(2) is not None else ""))
    return out


def _elastic_header(config: LaunchConfig, tasks_per_node: int) -> list[str]:
    """``#SBATCH`` lines of an elastic job: a node range for chief + min..max workers, requeued on node failure."""
    for name in ("ps", "evaluator"):
        if getattr(config, name):
            raise invalid(
                LaunchError,
                name,
                getattr(config, name),
                "no parameter servers or evaluator in an elastic Slurm job",
                "Elastic Slurm jobs are chief/worker (MultiWorkerMirroredStrategy) "
                "jobs; drop `min_workers`, or this option.",
            )
    if config.loses or config.returns:
        raise invalid(
            LaunchError,
            "loses" if config.loses else "returns",
            (config.loses or config.returns)[0],
            "no fault injection in a Slurm script (the local engine's)",
            "On Slurm a failed node (or 'scontrol requeue') plays the loss; drop `loses` and `returns`.",
        )
    low, high = (-(-(int(config.chief) + n) // tasks_per_node) for n in (config.min_workers, config.max_workers))
    return [
        f"#SBATCH --nodes={low}-{high}" if low < high else f"#SBATCH --nodes={low}",
        f"#SBATCH --ntasks-per-node={tasks_per_node}",
        "# Elastic: Slurm requeues the job when a node fails, and the next run sizes itself from its allocation;",
        "# a requeued run appends to the output file.",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
    ]


def slurm_script(
    config: LaunchConfig,
    *,
    name: str = "tfdist-job",
    time_limit: str = "01:00:00",
    cpus_per_task: int | None = None,
    gpus_per_task: int = 0,
    port_base: int | None = None,
    python: str | None = None,
    tf_log_level: int = 2,
    tasks_per_node: int | None = None,
    sbatch: Sequence[str] = (),
) -> str:
    """An ``sbatch`` script: one Slurm task per TF task, each building TF_CONFIG with tfdist.

    Args:
      config: The topology and command; ``config.max_restarts`` reruns of the
        step after a failure (each resumes from the user's BackupAndRestore).
      name: The Slurm job name.
      time_limit: ``#SBATCH --time``.
      cpus_per_task: ``#SBATCH --cpus-per-task``; None: Slurm's default.
      gpus_per_task: ``#SBATCH --gpus-per-task`` when > 0.
      port_base: A fixed first port per node; None: a per-job port base from
        ``SLURM_JOB_ID`` and a free-port check (see ``tfdist.cluster.slurm.job_port_base``).
      python: The interpreter the tasks run (and the command, when it starts
        with ``python``/``python3``); default the one running this.
      tf_log_level: Default ``TF_CPP_MIN_LOG_LEVEL`` (the submit environment's value wins).
      tasks_per_node: ``#SBATCH --ntasks-per-node``: TF tasks per node (1: one per node, so Slurm
        never packs two on a machine); None: no line, Slurm places the tasks (an elastic job counts 1).
      sbatch: More ``#SBATCH`` options, e.g. ``("partition=gpu", "--account=ml", "qos=high")`` (the
        leading ``--`` is optional); the options tfdist writes itself are refused, naming the argument
        that sets them.

    With ``config.min_workers`` the job is elastic (docs/slurm.md): it asks for a node range
    (``--nodes=MIN-MAX`` for chief + min..max workers, ``tasks_per_node`` each), is requeued by Slurm when
    a node fails, and each run sizes its step from the allocation it got; tasks see ``TFDIST_WORLD_SIZE``
    and ``TFDIST_MEMBERSHIP`` (Slurm's restart count).

    Example:
        >>> from tfdist.launch import LaunchConfig
        >>> script = slurm_script(LaunchConfig(command=("python", "train.py"), workers=2), python="/opt/py")
        >>> "PYTHON=/opt/py" in script and "#SBATCH --ntasks=2" in script
        True
        >>> elastic = LaunchConfig(command=("python", "train.py"), workers=4, min_workers=2)
        >>> [line for line in slurm_script(elastic, python="/opt/py").splitlines() if "#SBATCH --nodes" in line]
        ['#SBATCH --nodes=2-4']
    """
    require_config(config)
    python = _check_settings(name, time_limit, python, gpus_per_task, tf_log_level, cpus_per_task)
    counts = config.task_counts()
    total = sum(counts.values())
    _check_placement(port_base, tasks_per_node, total)
    jobs = described = ",".join(f"{job}={n}" for job, n in counts.items())
    if config.min_workers is not None:  # The workers come from the allocation, not from --jobs.
        jobs = "chief=1" if config.chief else ""
        described = f"{jobs + ',' if jobs else ''}worker={config.min_workers}..{config.max_workers} (elastic)"
    header = _header(config, name, time_limit, total, tasks_per_node, cpus_per_task, gpus_per_task, sbatch)
    ports, step = _ports(config, port_base), _step(config, jobs)
    body = _body(config, described=described, python=python, tf_log_level=tf_log_level, ports=ports, step=step)
    return "\n".join([*header, *body])


def _check_settings(
    name: str, time_limit: str, python: str | None, gpus_per_task: int, tf_log_level: int, cpus_per_task: int | None
) -> str:
    """Checks the job's own settings; returns the interpreter the tasks run."""
    _check_job_name(name)
    _check_time(time_limit)
    python = _check_python(sys.executable if python is None else python)
    require_int(LaunchError, "gpus_per_task", gpus_per_task, minimum=0, maximum=1024)
    require_int(LaunchError, "tf_log_level", tf_log_level, minimum=0, maximum=3)
    if cpus_per_task is not None:
        require_int(LaunchError, "cpus_per_task", cpus_per_task, minimum=1, maximum=65536)
    return python


def _check_placement(port_base: int | None, tasks_per_node: int | None, total: int) -> None:
    """Checks where the ``total`` tasks go: the first port of a node, and tasks per node."""
    if port_base is not None:
        require_int(
            LaunchError,
            "port_base",
            port_base,
            minimum=1024,
            maximum=65536 - total,
            fix=f"The {total} tasks on one node use ports `port_base` to `port_base` + {total - 1}.",
        )
    if tasks_per_node is not None:
        require_int(LaunchError, "tasks_per_node", tasks_per_node, minimum=1, maximum=4096)


def _header(
    config: LaunchConfig,
    name: str,
    time_limit: str,
    total: int,
    tasks_per_node: int | None,
    cpus_per_task: int | None,
    gpus_per_task: int,
    sbatch: Sequence[str],
) -> list[str]:
    """The shebang and the ``#SBATCH`` lines: the tasks (a node range when elastic), time, CPUs, GPUs, the user's."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}"]
    if config.min_workers is not None:
        lines += [*_elastic_header(config, tasks_per_node or 1), f"#SBATCH --time={time_limit}"]
    else:
        lines += [f"#SBATCH --ntasks={total}", f"#SBATCH --time={time_limit}"]
        if tasks_per_node is not None:
            lines.append(f"#SBATCH --ntasks-per-node={tasks_per_node}")
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    if gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={gpus_per_task}")
    return lines + [f"#SBATCH {option}" for option in _sbatch_options(sbatch)]


def _ports(config: LaunchConfig, port_base: int | None) -> str:
    """The lines that set ``PORT_BASE`` and, in an elastic job, ``TASKS`` from the allocation."""
    ports = (
        f"PORT_BASE={port_base}"
        if port_base is not None
        else "# This job's ports: a slot of 20000-32767 chosen by SLURM_JOB_ID, the next slot if a port is taken.\n"
        f"PORT_BASE=$({TaskProgram.SLURM.shell(_PYTHON, '--pick-port-base')}) || exit 2"
    )
    if config.min_workers is not None:
        size = TaskProgram.SLURM.shell(_PYTHON, "--allocated-tasks", str(int(config.chief) + config.max_workers))
        ports += "\n" + _ELASTIC_SIZE.format(size=size)
    return ports


def _step(config: LaunchConfig, jobs: str) -> str:
    """The ``srun`` line of one attempt: every task runs tfdist's Slurm entry, which builds TF_CONFIG and the command.

    srun's output goes to the job's output; its errors also to ``$SRUN_LOG``, where the script finds the
    first task's exit code.
    """
    command = shlex.join(config.command)
    if PYTHON_NAME.match(config.command[0]):  # 'python train.py' runs on the pinned interpreter too.
        command = " ".join(['"$PYTHON"', *map(shlex.quote, config.command[1:])])
    flags = [f"--jobs {jobs}"] if jobs else []
    flags += ['--port-base "$PORT_BASE"', '--restart "$attempt"', f"--run-on {shlex.quote(config.run_on)}"]
    if config.mesh is not None:
        flags.append(f"--mesh {shlex.quote(config.mesh)}")
    srun = "srun --kill-on-bad-exit=1"
    if config.min_workers is not None:
        flags.append(f"--min-workers {config.min_workers}")
        srun += ' --ntasks="$TASKS"'
    task = TaskProgram.SLURM.shell(_PYTHON, *flags, "--", command)
    return f"{{ {srun} {task}" + ' 2>&1 1>&3 | tee "$SRUN_LOG" >&2; } 3>&1'


def _body(config: LaunchConfig, *, described: str, python: str, tf_log_level: int, ports: str, step: str) -> list[str]:
    """The script after the header: settings, the per-node interpreter check, and the step rerun on failure."""
    return [
        f"# tfdist job {described}: one Slurm task per TensorFlow task, each building its TF_CONFIG from SLURM_*",
        "# (job names sorted, ranks in order, ports PORT_BASE+i for the i-th task on a node).",
        "set -uo pipefail",
        f"PYTHON={shlex.quote(python)}",
        f"MAX_RESTARTS={config.max_restarts}",
        f'export TF_CPP_MIN_LOG_LEVEL="${{TF_CPP_MIN_LOG_LEVEL:-{tf_log_level}}}"',
        "# Every node must run tfdist with this interpreter: check once per node before the real step.",
        'if ! srun --ntasks-per-node=1 --ntasks="${SLURM_JOB_NUM_NODES:-1}" "$PYTHON" -c \'import tfdist\' >&2; then',
        '  echo "tfdist job: error: $PYTHON cannot import tfdist on every node of this job (srun names the node'
        ' above). Install tfdist for that interpreter on every node, or emit the script with --python PATH." >&2',
        "  exit 2",
        "fi",
        ports,
        'SRUN_LOG=$(mktemp "${TMPDIR:-/tmp}/tfdist-srun.XXXXXX")',
        "trap 'rm -f \"$SRUN_LOG\"' EXIT",
        "attempt=0",
        "while true; do",
        f"  {step}",
        "  code=$?",
        '  [ "$code" -eq 0 ] && exit 0',
        "  # srun returns 128+signal when it stopped the other tasks: the job's code is the first task's failure.",
        f"  first=$(sed -n '{_FIRST_FAILURE}' \"$SRUN_LOG\" | head -n 1)",
        "  code=${first:-$code}",
        f'  case "$code" in {"|".join(map(str, _PERMANENT_CODES))}) exit "$code";; esac  # a rerun would fail the same way',
        '  [ "$attempt" -ge "$MAX_RESTARTS" ] && exit "$code"',
        "  attempt=$((attempt + 1))",
        '  echo "tfdist job: step failed with exit code $code; restart $attempt of $MAX_RESTARTS" >&2',
        "  sleep 1",
        "done",
        "",
    ]
