"""Elastic training semantics for Keras: batch rules across world-size changes, epoch boundaries, LR scaling.

Under ``tfdist-launch --min-workers`` the group restarts with a new world size when a worker leaves or
returns, and ``BackupAndRestore`` resumes at its last backup. With :class:`~tfdist.keras.resume.ResumeInput`
(the resumable input order) the new group goes on at the next step of the same global order, whatever
its size; with epoch backups alone the interrupted epoch is redone from its start with the new sharding.
Either way every record is seen once per completed epoch. Two batch rules:

- **Keep the global batch** (the default): batch the dataset with the global batch ``B``; each of the ``N``
  replicas gets ``B / N`` (:func:`per_replica_batch` checks that ``N`` divides ``B``), so every step
  averages the gradient over the same ``B`` records and steps per epoch stay ``records // B`` whatever ``N``.
- **Keep the per-replica batch** ``b``: the global batch is ``b * N``; :class:`LinearScaling` scales the
  learning rate by ``N / reference`` (Goyal et al.'s linear rule), and steps per epoch change with ``N``.

Example:
    >>> from tfdist.keras import membership, per_replica_batch, world_size
    >>> per_replica_batch(12, 3), per_replica_batch(12, 2)
    (4, 6)
    >>> world_size(env={"TFDIST_WORLD_SIZE": "2"}), membership(env={})
    (2, 0)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from tfdist._compat import callback_base
from tfdist.cluster import elastic as cluster_elastic
from tfdist.cluster.spec import ClusterLike, resolve_cluster
from tfdist.errors import StrategyError, invalid, require_int, require_number

__all__ = ["ElasticEpochs", "LinearScaling", "membership", "per_replica_batch", "world_size"]

_log = logging.getLogger("tfdist.keras")


def world_size(*, env: Mapping[str, str] | None = None) -> int:
    """Training tasks in the current group (``TFDIST_WORLD_SIZE`` from tfdist-launch); 1 when unset."""
    value = cluster_elastic.optional_int(os.environ if env is None else env, cluster_elastic.WORLD_SIZE_VAR)
    return value if value is not None and value > 0 else 1


def membership(*, env: Mapping[str, str] | None = None) -> int:
    """The membership generation (``TFDIST_MEMBERSHIP``): 0 at launch, +1 at every change; 0 when unset."""
    value = cluster_elastic.optional_int(os.environ if env is None else env, cluster_elastic.MEMBERSHIP_VAR)
    return value if value is not None and value >= 0 else 0


def per_replica_batch(global_batch_size: int, num_replicas: int) -> int:
    """The per-replica batch that keeps ``global_batch_size`` on ``num_replicas`` replicas.

    Raises:
      StrategyError: ``num_replicas`` does not divide ``global_batch_size`` (no silent rounding: a rounded
        batch would change the update and the epoch's step count).

    Example:
        >>> per_replica_batch(10, 3)
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyError: Invalid value for `global_batch_size`. Received: 10. Expected a multiple \
of the 3 replicas. Pick a global batch every world size between `min_workers` and `max_workers` divides \
(e.g. a multiple of their least common multiple), or keep the per-replica batch with LinearScaling.
    """
    require_int(StrategyError, "global_batch_size", global_batch_size, minimum=1)
    require_int(StrategyError, "num_replicas", num_replicas, minimum=1)
    if global_batch_size % num_replicas:
        raise invalid(
            StrategyError,
            "global_batch_size",
            global_batch_size,
            f"a multiple of the {num_replicas} replicas",
            "Pick a global batch every world size between `min_workers` and `max_workers` divides "
            "(e.g. a multiple of their least common multiple), or keep the per-replica batch with "
            "LinearScaling.",
        )
    return global_batch_size // num_replicas


class ElasticEpochs(callback_base()):  # type: ignore[misc]
    """Tells the launcher where epochs end, and puts the world size into the epoch logs.

    The leader (chief, else worker 0) says as its fit begins that it records epoch boundaries, and records
    each one in ``TFDIST_ELASTIC_DIR`` once *every* callback of the epoch has run: at the next epoch's start
    (the last epoch's as fit ends). A returned worker joins the group there, and the launcher's restart cuts
    nothing of the epoch: ``BackupAndRestore`` has written its backup, ``TensorBoard``, ``ModelCheckpoint``
    and your own ``on_epoch_end`` have run, wherever they are in the list. Place it before ``TensorBoard``
    (which then plots ``world_size`` next to the loss, so a membership change shows on the curves). Without
    tfdist-launch's elastic mode it only adds ``world_size`` to the logs.

    Works with tf-keras and Keras 3 (3.10 and later) models alike.

    Args:
      cluster: This task's cluster (a spec or TF_CONFIG); default TF_CONFIG from the environment.
      env: Where to read the TFDIST_* variables; default ``os.environ``.
    """

    keras3_models = True  # It reads and writes the epoch logs only.

    def __init__(self, *, cluster: ClusterLike = None, env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        env = os.environ if env is None else env
        spec = resolve_cluster(cluster)
        self._is_leader = spec is None or spec.is_chief
        self._directory = env.get(cluster_elastic.ELASTIC_DIR_VAR) if self._is_leader else None
        self._world_size, self._generation = world_size(env=env), membership(env=env)
        self._ended: int | None = None  # the epoch that ended and whose boundary is not recorded yet

    def on_train_begin(self, logs: Any = None) -> None:
        _log.info("Elastic membership %d: world size %d.", self._generation, self._world_size)
        self._ended = None
        if self._directory:
            cluster_elastic.announce(self._directory, generation=self._generation, world_size=self._world_size)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["world_size"] = float(self._world_size)
        self._ended = epoch  # recorded once the callbacks after this one have run too

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._record(last=False)

    def on_train_end(self, logs: Any = None) -> None:
        # The last epoch, or the one an early stop ended with: nobody joins there (BackupAndRestore deletes its
        # backup as fit ends, so a group restarted to grow would train from the start).
        self._record(last=True)

    def _record(self, *, last: bool) -> None:
        if self._ended is not None and self._directory:
            cluster_elastic.write_boundary(
                self._directory,
                generation=self._generation,
                epoch=self._ended,
                world_size=self._world_size,
                last=last,
            )
        self._ended = None


class LinearScaling(callback_base()):  # type: ignore[misc]
    """Keeps the per-replica batch: sets the learning rate to ``base_learning_rate * N / reference_world_size``.

    Works with tf-keras and Keras 3 (3.10 and later) models alike; the learning rate must be a number (a
    variable), not a schedule.

    Args:
      base_learning_rate: The rate tuned for ``reference_world_size`` replicas.
      reference_world_size: The world size the rate was tuned for.
      num_replicas: The current replica count; default the strategy's, at the start of training.
    """

    keras3_models = True  # The strategy's replicas and the optimizer's learning-rate variable: both Kerases have them.

    def __init__(
        self, base_learning_rate: float, *, reference_world_size: int, num_replicas: int | None = None
    ) -> None:
        super().__init__()
        require_number(StrategyError, "base_learning_rate", base_learning_rate, above=0)
        require_int(StrategyError, "reference_world_size", reference_world_size, minimum=1)
        if num_replicas is not None:
            require_int(StrategyError, "num_replicas", num_replicas, minimum=1)
        self.base_learning_rate, self.reference_world_size = float(base_learning_rate), reference_world_size
        self.num_replicas = num_replicas
        self.learning_rate: float | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        replicas = self.num_replicas or self.model.distribute_strategy.num_replicas_in_sync
        self.learning_rate = self.base_learning_rate * replicas / self.reference_world_size
        self.model.optimizer.learning_rate.assign(self.learning_rate)
        _log.info(
            "LinearScaling: learning rate %g for %d replicas (%g for %d).",
            self.learning_rate,
            replicas,
            self.base_learning_rate,
            self.reference_world_size,
        )
