"""One Slurm task of a tfdist job: build TF_CONFIG from ``SLURM_*`` and exec the task's program.

Used by the batch scripts ``tfdist-launch --emit slurm`` writes:

    srun python -m tfdist.cli.slurm_task --jobs chief=1,worker=2,ps=1 --port-base 20224 -- python train.py

``--pick-port-base`` (in the batch script, once per job) prints the port base
for this job: see :func:`tfdist._slurm.job_port_base`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from tfdist import _address, _slurm
from tfdist.cli import _common
from tfdist.cli._task import exec_task, parse_jobs
from tfdist.cluster import ClusterSpec
from tfdist.errors import LaunchError, invalid, require_int
from tfdist.launch.config import RUN_ON_CHOICES

_PROG = "python -m tfdist.cli.slurm_task"


def _pick_port_base(env: dict[str, str]) -> int:
    job_id = env.get("SLURM_JOB_ID", "")
    if not (job_id.isascii() and job_id.isdigit()):
        raise invalid(LaunchError, "SLURM_JOB_ID", job_id or None, "the job id Slurm sets",
                      "Run --pick-port-base inside an sbatch script.")
    per_node = _slurm.expand_tasks_per_node("SLURM_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1"))
    return _slurm.job_port_base(int(job_id), max(per_node), lambda port: _address.port_is_free("0.0.0.0", port))


def _parser() -> argparse.ArgumentParser:
    parser = _common.ArgumentParser(prog=_PROG)
    parser.add_argument("--jobs", default=None, help="JOB=COUNT pairs; default every task a worker")
    parser.add_argument("--port-base", type=int, default=8888, help="port of the first task on each node")
    parser.add_argument("--pick-port-base", action="store_true",
                        help="print this job's port base (from SLURM_JOB_ID and free ports) and exit")
    parser.add_argument("--run-on", choices=RUN_ON_CHOICES, default="auto")
    parser.add_argument("--restart", type=int, default=0, help="attempt number (TFDIST_RESTART)")
    return parser


@_common.cli_main(_PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Execs the task's program; a tfdist error is one line on stderr (exit 2 for bad input, 1 for a failure)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:cut])
    command = argv[cut + 1:]
    if args.pick_port_base:
        sys.stdout.write(f"{_pick_port_base(dict(os.environ))}\n")
        return 0
    require_int(LaunchError, "--port-base", args.port_base, minimum=1, maximum=65535)
    require_int(LaunchError, "--restart", args.restart, minimum=0)
    jobs = parse_jobs(args.jobs) if args.jobs else None
    spec = ClusterSpec.from_slurm(jobs=jobs, port_base=args.port_base)
    return exec_task(f"{_PROG}: ", spec, command, run_on=args.run_on, restart=args.restart)


if __name__ == "__main__":
    sys.exit(main())
