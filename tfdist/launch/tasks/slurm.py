"""One Slurm task of a tfdist job: build TF_CONFIG from ``SLURM_*`` and exec the task's program.

Used by the batch scripts ``tfdist-launch --emit slurm`` writes:

    srun python -m tfdist.launch.tasks.slurm --jobs chief=1,worker=2,ps=1 --port-base 20224 -- python train.py

``--pick-port-base`` (in the batch script, once per job) prints the port base
for this job: see :func:`tfdist.cluster.slurm.job_port_base`.

Elastic jobs (``--emit slurm --min-workers M``, docs/slurm.md) size the step from the allocation the job
got: the batch script runs ``--allocated-tasks MAX`` (prints the allocation's task count, at most MAX), and
each task runs with ``--min-workers M``: every task that ``--jobs`` does not name is a worker, and the
program sees ``TFDIST_WORLD_SIZE`` (chief + workers) and ``TFDIST_MEMBERSHIP`` (``SLURM_RESTART_COUNT``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tfdist.cluster import address as _address
from tfdist.cluster import slurm as _slurm
from tfdist.cluster.elastic import MEMBERSHIP_VAR, WORLD_SIZE_VAR
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import RUN_ON_CHOICES
from tfdist.launch.tasks._common import exec_task, parse_jobs
from tfdist.runtime import program

_PROG = "python -m tfdist.launch.tasks.slurm"


def _pick_port_base(env: dict[str, str]) -> int:
    job_id = env.get("SLURM_JOB_ID", "")
    if not (job_id.isascii() and job_id.isdigit()):
        raise invalid(
            LaunchError,
            "SLURM_JOB_ID",
            job_id or None,
            "the job id Slurm sets",
            "Run --pick-port-base inside an sbatch script.",
        )
    per_node = _slurm.expand_tasks_per_node("SLURM_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1"))
    return _slurm.job_port_base(int(job_id), max(per_node), lambda port: _address.port_is_free("0.0.0.0", port))


def _elastic(
    jobs: dict[str, int] | None, min_workers: int, env: dict[str, str]
) -> tuple[dict[str, int], dict[str, str]]:
    """The jobs of an elastic step (the tasks --jobs does not name are workers) and the membership variables."""
    require_int(LaunchError, "--min-workers", min_workers, minimum=1)
    jobs = _slurm.elastic_jobs(jobs or {}, _slurm.step_tasks(env), min_workers=min_workers)
    generation = _slurm.restart_count(env)
    world_size = jobs["worker"] + jobs.get("chief", 0)
    if env.get("SLURM_PROCID") == "0":
        sys.stderr.write(
            f"{_PROG}: elastic membership {generation} (Slurm restart count): world size {world_size}"
            f" ({jobs['worker']} workers, at least {min_workers})\n"
        )
    return jobs, {WORLD_SIZE_VAR: str(world_size), MEMBERSHIP_VAR: str(generation)}


def _parser() -> argparse.ArgumentParser:
    parser = program.ArgumentParser(prog=_PROG)
    parser.add_argument("--jobs", default=None, help="JOB=COUNT pairs; default every task a worker")
    parser.add_argument("--port-base", type=int, default=8888, help="port of the first task on each node")
    parser.add_argument(
        "--pick-port-base",
        action="store_true",
        help="print this job's port base (from SLURM_JOB_ID and free ports) and exit",
    )
    parser.add_argument(
        "--allocated-tasks",
        type=int,
        default=None,
        metavar="MAX",
        help="print the tasks of this allocation (SLURM_TASKS_PER_NODE), at most MAX, and exit",
    )
    parser.add_argument(
        "--min-workers",
        type=int,
        default=None,
        metavar="M",
        help="elastic: the tasks --jobs does not name are workers (at least M); sets "
        "TFDIST_WORLD_SIZE and TFDIST_MEMBERSHIP (= SLURM_RESTART_COUNT)",
    )
    parser.add_argument("--run-on", choices=RUN_ON_CHOICES, default="auto")
    parser.add_argument("--mesh", default=None, help="a DTensor mesh over chief and workers, e.g. batch=2,model=2")
    parser.add_argument("--restart", type=int, default=0, help="attempt number (TFDIST_RESTART)")
    return parser


@program.cli_main(_PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Execs the task's program; a tfdist error is one line on stderr (exit 2 for bad input, 1 for a failure)."""
    flags, command = program.split_command(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(flags)
    if args.pick_port_base:
        sys.stdout.write(f"{_pick_port_base(dict(os.environ))}\n")
        return 0
    if args.allocated_tasks is not None:
        require_int(LaunchError, "--allocated-tasks", args.allocated_tasks, minimum=1)
        sys.stdout.write(f"{min(_slurm.allocated_tasks(os.environ), args.allocated_tasks)}\n")
        return 0
    require_int(LaunchError, "--port-base", args.port_base, minimum=1, maximum=65535)
    require_int(LaunchError, "--restart", args.restart, minimum=0)
    jobs = parse_jobs(args.jobs) if args.jobs else None
    variables: dict[str, str] = {}
    if args.min_workers is not None:
        jobs, variables = _elastic(jobs, args.min_workers, dict(os.environ))
    spec = ClusterSpec.from_slurm(jobs=jobs, port_base=args.port_base)
    return exec_task(
        f"{_PROG}: ", spec, command, run_on=args.run_on, restart=args.restart, variables=variables, mesh=args.mesh
    )


if __name__ == "__main__":
    sys.exit(main())
