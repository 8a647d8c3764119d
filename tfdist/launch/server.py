"""A standard TensorFlow server for the worker and ps tasks of a cluster.

``tfdist-launch`` runs it on every task that does not run user code (the
workers and ps of a parameter-server cluster) through its command-line entry
point, ``python -m tfdist.launch.tasks.server``; the package never imports that entry
point, so ``python -m`` runs it without a warning. Under a scheduler that waits
for every task (Slurm's ``srun``), ``exit_with_chief=SECONDS`` ends the server
with exit code 0 once the chief (the coordinator), after having been
reachable, stays unreachable that long, so the job ends when training does
instead of at its time limit. A worker's server also runs the staging agent
(:mod:`tfdist.data.storage.staging`) that serves its datasets' ``s3://`` objects where
TensorFlow has no ``s3`` file system.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, invalid

__all__ = ["run_server"]

_log = logging.getLogger("tfdist.launch.server")


def watch_chief(address: str, done: threading.Event, *, grace: float, interval: float = 0.5) -> None:
    """Sets ``done`` once ``address`` has accepted connections and then refused them for ``grace`` seconds.

    Before the chief first answers nothing happens: a coordinator that is
    still starting is not a finished one. Returns when ``done`` is set.

    Example:
        >>> import threading
        >>> done = threading.Event(); done.set()
        >>> watch_chief("127.0.0.1:1", done, grace=1.0)  # Returns at once: already done.
    """
    from tfdist.cluster.probe import can_connect

    seen, missed = False, 0.0
    while not done.wait(interval):
        if can_connect(address, timeout=interval, interval=interval):
            if not seen:
                _log.info("Chief at %s is up; this server ends %.0fs after it goes away.", address, grace)
            seen, missed = True, 0.0
        elif seen:
            missed += interval
            if missed >= grace:
                _log.info("Chief at %s gone for %.0fs: the coordinator is done, stopping.", address, grace)
                done.set()


def run_server(
    spec: ClusterSpec | None = None, *, stop: threading.Event | None = None, exit_with_chief: float | None = None
) -> int:
    """Serves this task until SIGTERM/SIGINT, ``stop`` is set, or the chief is gone; returns 0.

    Args:
      spec: The cluster and this task; default from ``TF_CONFIG``.
      stop: Optional event that ends the server when set.
      exit_with_chief: Seconds the chief may stay unreachable, after it was
        first seen, before this server ends; None: serve until stopped.
    """
    import tensorflow as tf

    from tfdist.strategy.resolver import cluster_resolver

    spec = spec if spec is not None else ClusterSpec.from_tf_config()
    if spec.task is None or spec.task_type == "evaluator":
        raise invalid(
            LaunchError,
            "task_type",
            spec.task_type,
            "a chief, worker or ps task of the cluster",
            "Set TF_CONFIG's 'task' to the task this server plays.",
        )
    resolver = cluster_resolver(spec)
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=spec.task_type,
        task_index=spec.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    _log.info("TensorFlow server %s up at %s (%s).", spec.task.name, server.target, spec.describe())
    if spec.task_type == "worker":  # Stages the s3:// objects its ParameterServerStrategy datasets read via boto3.
        from tfdist.data.storage.staging import ensure_agent

        ensure_agent()
    done = stop or threading.Event()

    def _handle(signum: int, frame: FrameType | None) -> None:
        done.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handle)
        signal.signal(signal.SIGINT, _handle)
    if exit_with_chief is not None and spec.has_chief and spec.task_type != "chief":
        chief = spec.jobs["chief"][min(spec.jobs["chief"])]
        threading.Thread(
            target=watch_chief,
            args=(chief, done),
            kwargs={"grace": exit_with_chief},
            name="tfdist-watch-chief",
            daemon=True,
        ).start()
    while not done.wait(1.0):
        pass
    _log.info("TensorFlow server %s stopping.", spec.task.name)
    return 0
