"""One pod of a tfdist JobSet: build TF_CONFIG from the JobSet's labels and index, then exec the task's program.

Used by the manifests ``tfdist-launch --emit jobset`` writes (Kubeflow Trainer v2 runs TrainJobs as JobSets
but writes no TF_CONFIG):

    python -m tfdist.launch.tasks.jobset --jobs chief=1,worker=2,ps=1 --port 2222 -- python train.py
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, require_int
from tfdist.launch.config import RUN_ON_CHOICES
from tfdist.launch.tasks._common import exec_task, parse_jobs
from tfdist.runtime import program

_PROG = "python -m tfdist.launch.tasks.jobset"


@program.cli_main(_PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Execs the pod's program; a tfdist error is one line on stderr (exit 2 for bad input, 1 for a failure)."""
    flags, command = program.split_command(sys.argv[1:] if argv is None else argv)
    parser = program.ArgumentParser(prog=_PROG)
    parser.add_argument("--jobs", required=True, help="JOB=COUNT pairs, e.g. chief=1,worker=2,ps=1")
    parser.add_argument("--port", type=int, default=2222, help="the port every task listens on")
    parser.add_argument("--subdomain", default=None, help="the JobSet's network subdomain; default its name")
    parser.add_argument("--run-on", choices=RUN_ON_CHOICES, default="auto")
    parser.add_argument("--mesh", default=None, help="a DTensor mesh over chief and workers, e.g. batch=2,model=2")
    args = parser.parse_args(flags)
    require_int(LaunchError, "--port", args.port, minimum=1, maximum=65535)
    spec = ClusterSpec.from_jobset(jobs=parse_jobs(args.jobs), port=args.port, subdomain=args.subdomain)
    # JobSet's restart count (a label, passed in by the manifest) becomes TFDIST_RESTART.
    attempt = os.environ.get("JOBSET_RESTART_ATTEMPT") or "0"
    restart = int(attempt) if attempt.isascii() and attempt.isdigit() else 0
    return exec_task(f"{_PROG}: ", spec, command, run_on=args.run_on, restart=restart, mesh=args.mesh)


if __name__ == "__main__":
    sys.exit(main())
