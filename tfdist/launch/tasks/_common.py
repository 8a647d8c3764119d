"""What every scheduler task entry (slurm_task, jobset_task) does once it knows its cluster: exec the program."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, invalid
from tfdist.launch import environment
from tfdist.launch.config import LaunchConfig
from tfdist.runtime import exit_codes

# Servers (ps, and workers of a parameter-server job) end this long after the chief is gone, so the job ends.
SERVER_EXIT_WITH_CHIEF = 3.0


def parse_jobs(text: str) -> dict[str, int]:
    """Parses ``--jobs`` 'chief=1,worker=2,ps=1'."""
    jobs = {}
    for part in text.split(","):
        job, _, count = part.partition("=")
        if not (count.isascii() and count.isdigit()):
            raise invalid(LaunchError, "--jobs", text, "JOB=COUNT pairs, e.g. 'chief=1,worker=2,ps=1'")
        jobs[job.strip()] = int(count)
    return jobs


def exec_task(
    prefix: str,
    spec: ClusterSpec,
    command: Sequence[str],
    *,
    run_on: str,
    restart: int,
    variables: Mapping[str, str] | None = None,
    mesh: str | None = None,
) -> int:
    """Execs this task's program (the command, or tfdist's TF server) with TF_CONFIG; returns only on failure.

    ``variables`` are set in the program's environment too (e.g. TFDIST_WORLD_SIZE of an elastic Slurm job);
    with ``mesh`` ('batch=2,model=2') the chief and workers become the clients of a DTensor mesh.

    Raises:
      LaunchError: The command and topology do not make a valid launch.
    """
    config = LaunchConfig(
        command=tuple(command),
        workers=len(spec.jobs.get("worker", ())),
        ps=spec.num_ps,
        chief=spec.has_chief,
        evaluator="evaluator" in spec.jobs,
        run_on=run_on,
        mesh=mesh,
    )
    task = spec.task.name  # type: ignore[union-attr]
    program = (
        list(config.command)
        if config.runs_command(task)
        else [*environment.server_argv(), "--exit-with-chief", str(SERVER_EXIT_WITH_CHIEF)]
    )
    env = environment.child_env(os.environ, config, spec, task, restart=restart)
    env.update(variables or {})
    sys.stderr.write(f"{prefix}{spec.describe()}\n")
    sys.stderr.flush()
    try:
        os.execvpe(program[0], program, env)
    except OSError as err:  # Not found (127) or not executable (126), as a shell reports them.
        code = exit_codes.NOT_FOUND if isinstance(err, FileNotFoundError) else exit_codes.CANNOT_EXECUTE
        sys.stderr.write(
            f"{prefix}error: cannot run {program[0]!r} on {os.uname().nodename}: {err.strerror}. "
            "Check the command after '--' and PATH there.\n"
        )
        return code
    return exit_codes.FAILED  # Not reached.
