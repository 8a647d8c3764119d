"""``python -m tfdist.launch.tasks.server``: a standard TensorFlow server for one task of a cluster.

``tfdist-launch`` (and the TFJob and Slurm scripts it emits) runs this on every task that does not run
user code: the workers and ps of a parameter-server cluster. It reads the task from ``TF_CONFIG`` and
serves until SIGTERM or Ctrl-C, or, with ``--exit-with-chief SECONDS``, until the chief has been gone
that long. The library function is :func:`tfdist.launch.server.run_server`; this module is only its
entry point, which the ``tfdist.launch`` package does not import (so ``python -m`` runs it cleanly).
On a worker task the server also runs the staging agent (:mod:`tfdist.data.storage.staging`) that stages the
``s3://`` objects the worker's datasets read where TensorFlow has no ``s3`` file system.

    TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' python -m tfdist.launch.tasks.server
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from tfdist.errors import LaunchError, invalid
from tfdist.runtime import program

PROG = "python -m tfdist.launch.tasks.server"
MAX_EXIT_WITH_CHIEF = 86400.0


@program.cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status after the server stops."""
    parser = program.ArgumentParser(prog=PROG, description="Serve this task of the TF_CONFIG cluster.")
    parser.add_argument(
        "--exit-with-chief",
        type=program.finite_float,
        default=None,
        metavar="SECONDS",
        help="end (exit 0) once the chief has been unreachable this long after it was up",
    )
    args = parser.parse_args(argv)
    grace = args.exit_with_chief
    if grace is not None and not 0 < grace < MAX_EXIT_WITH_CHIEF:
        raise invalid(LaunchError, "--exit-with-chief", grace, f"seconds in (0, {MAX_EXIT_WITH_CHIEF:g})")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tfdist.cluster.spec import ClusterSpec
    from tfdist.launch.server import run_server

    spec = ClusterSpec.from_tf_config()  # Checked before TensorFlow is imported.
    return run_server(spec, exit_with_chief=grace)


if __name__ == "__main__":
    from tfdist.runtime.clean_exit import exit_cleanly

    exit_cleanly(main)
    sys.exit(1)  # Not reached.
