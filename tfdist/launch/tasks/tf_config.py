"""One task of a cluster whose manager wrote TF_CONFIG: add what tfdist's launcher would, then exec the command.

A TFJob pod (or a Vertex AI or hand-made cluster's task) gets ``TF_CONFIG`` from its manager and runs the
command directly. To make it a DTensor client of a mesh it also needs ``DTENSOR_*`` variables, which only a
launcher may write; this entry is that launcher, one task at a time. ``tfdist-launch --emit tfjob --mesh``
wraps the command in it:

    python -m tfdist.launch.tasks.tf_config --mesh batch=2,model=2 -- python train.py
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, invalid
from tfdist.launch.tasks._common import exec_task
from tfdist.runtime import program

_PROG = "python -m tfdist.launch.tasks.tf_config"


@program.cli_main(_PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Execs the command with this task's variables; a tfdist error is one line on stderr (exit 2 / 1)."""
    flags, command = program.split_command(sys.argv[1:] if argv is None else argv)
    parser = program.ArgumentParser(prog=_PROG)
    parser.add_argument("--mesh", default=None, help="a DTensor mesh over chief and workers, e.g. batch=2,model=2")
    args = parser.parse_args(flags)
    if not command:
        raise invalid(LaunchError, "command", [], "a program after '--', e.g. -- python train.py")
    if not os.environ.get("TF_CONFIG"):
        raise invalid(
            LaunchError,
            "TF_CONFIG",
            None,
            "the cluster manager's TF_CONFIG in this task's environment",
            "Run this entry inside a TFJob pod (or any task whose manager writes TF_CONFIG).",
        )
    spec = ClusterSpec.from_tf_config(env=os.environ)
    # Every task the manager started runs the command (it chose what each runs); TF_CONFIG itself is kept.
    return exec_task(f"{_PROG}: ", spec, command, run_on="all", restart=0, mesh=args.mesh)


if __name__ == "__main__":
    sys.exit(main())
