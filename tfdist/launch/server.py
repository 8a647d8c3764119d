"""A standard TensorFlow server for the worker and ps tasks of a cluster.

``tfdist-launch`` runs ``python -m tfdist.launch.server`` on every task that
does not run user code (the workers and ps of a parameter-server cluster).

Example:
    >>> # TF_CONFIG='{"cluster": {...}, "task": {"type": "ps", "index": 0}}' \\
    >>> #     python -m tfdist.launch.server
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Optional

from tfdist.cluster import ClusterSpec
from tfdist.errors import LaunchError, invalid

__all__ = ["run_server"]

_log = logging.getLogger("tfdist.launch.server")


def run_server(spec: Optional[ClusterSpec] = None, *, stop: Optional[threading.Event] = None) -> int:
    """Serves this task until SIGTERM/SIGINT (or ``stop`` is set); returns 0.

    Args:
      spec: The cluster and this task; default from ``TF_CONFIG``.
      stop: Optional event that ends the server when set.
    """
    import tensorflow as tf

    from tfdist.resolver import cluster_resolver

    spec = spec if spec is not None else ClusterSpec.from_tf_config()
    if spec.task is None or spec.task_type == "evaluator":
        raise invalid(LaunchError, "task_type", spec.task_type, "a chief, worker or ps task of the cluster",
                      "Set TF_CONFIG's 'task' to the task this server plays.")
    resolver = cluster_resolver(spec)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=spec.task_type, task_index=spec.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    _log.info("TensorFlow server %s up at %s (%s).", spec.task.name, server.target, spec.describe())
    done = stop or threading.Event()

    def _handle(signum: int, frame: Optional[FrameType]) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _handle)
    signal.signal(signal.SIGINT, _handle)
    while not done.wait(1.0):
        pass
    _log.info("TensorFlow server %s stopping.", spec.task.name)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from tfdist.clean_exit import exit_cleanly

    exit_cleanly(run_server)
    sys.exit(1)  # Not reached.
