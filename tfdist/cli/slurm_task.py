"""One Slurm task of a tfdist job: build TF_CONFIG from ``SLURM_*`` and exec the task's program.

Used by the batch scripts ``tfdist-launch --emit slurm`` writes:

    srun python -m tfdist.cli.slurm_task --jobs chief=1,worker=2,ps=1 -- python train.py
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from tfdist.cluster import ClusterSpec
from tfdist.errors import Error, LaunchError, invalid
from tfdist.launch import _env
from tfdist.launch.config import RUN_ON_CHOICES, LaunchConfig
from tfdist.launch.runner import SERVER_ARGV


def _jobs(text: str) -> dict[str, int]:
    jobs = {}
    for part in text.split(","):
        job, _, count = part.partition("=")
        if not (count.isascii() and count.isdigit()):
            raise invalid(LaunchError, "--jobs", text, "JOB=COUNT pairs, e.g. 'chief=1,worker=2,ps=1'")
        jobs[job.strip()] = int(count)
    return jobs


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m tfdist.cli.slurm_task")
    parser.add_argument("--jobs", default=None, help="JOB=COUNT pairs; default every task a worker")
    parser.add_argument("--port-base", type=int, default=8888)
    parser.add_argument("--run-on", choices=RUN_ON_CHOICES, default="auto")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    try:
        jobs = _jobs(args.jobs) if args.jobs else None
        spec = ClusterSpec.from_slurm(jobs=jobs, port_base=args.port_base)
        config = LaunchConfig(command=tuple(command), workers=len(spec.jobs.get("worker", ())), ps=spec.num_ps,
                              chief=spec.has_chief, evaluator="evaluator" in spec.jobs, run_on=args.run_on)
        task = spec.task.name  # type: ignore[union-attr]
        program = list(config.command) if config.runs_command(task) else list(SERVER_ARGV)
        env = _env.child_env(os.environ, config, spec, task, restart=0)
    except Error as err:
        sys.stderr.write(f"tfdist slurm task: error: {err}\n")
        return 2
    sys.stderr.write(f"tfdist slurm task: {spec.describe()}\n")
    os.execvpe(program[0], program, env)
    return 1  # Not reached.


if __name__ == "__main__":
    sys.exit(main())
