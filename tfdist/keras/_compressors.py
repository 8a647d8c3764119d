"""PowerSGD and top-k inside a tf-keras optimizer (:func:`tfdist.keras.with_communication`): state and step.

Each compressed variable gets state variables on the optimizer, created at its first step:

* its **error** (what this worker did not send), one value per replica (``ON_READ``, ``SUM``). A checkpoint
  saves every replica's own error (gathered at save time, a collective every worker's save joins) and a
  restore gives each its own, so a resumed run continues as the uninterrupted one would. Restored on a
  different number of replicas, each gets an equal share of their sum (no gradient is lost; one warning);
* PowerSGD's warm-start **Q** factor, the same on every replica (``ON_READ``, ``ONLY_FIRST_REPLICA``),
  started from a fixed seed.

They are tracked as an attribute of the optimizer, so ``tf.train.Checkpoint``, ``BackupAndRestore`` and
tfdist's backups carry them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from tfdist import _compat
from tfdist.comm.collective import CollectiveConfig, all_reduce_sum
from tfdist.comm.powersgd import matrix_shape, powersgd_sum
from tfdist.comm.topk import topk_sum

__all__: list[str] = []

_log = logging.getLogger("tfdist.keras")

_Q_SEED = 0x5EED  # The first seed of every initial Q; the second is the variable's place in the state.


def log_sparse(config: CollectiveConfig, variables: Sequence[Any]) -> None:
    """Logs (at trace time) which variables' sparse gradients are summed by TF, uncompressed."""
    if variables:
        _log.warning(
            "compression=%r compresses dense gradients only: %s get sparse (IndexedSlices) gradients (embedding "
            "lookups), which TF sums as they are (only the rows a batch touched travel).",
            config.compression,
            ", ".join(sorted({v.name for v in variables})),
        )


def aggregate(optimizer: Any, grads: Sequence[Any], variables: Sequence[Any], config: CollectiveConfig) -> list[Any]:
    """The sums over the replicas of the dense ``grads`` of ``variables``, compressed; updates the state."""
    return _STEPS[config.compression](optimizer, list(grads), list(variables), config)


def _state(optimizer: Any, variable: Any, kind: str, shape: Sequence[int], config: CollectiveConfig) -> Any:
    """The state variable ``kind`` ('error' or 'q') of ``variable``, created at its first use."""
    import tensorflow as tf

    states: dict[tuple[str, str], Any] = optimizer._tfdist.setdefault("states", {})
    key = (variable.name, kind)
    if key not in states:
        tracked = optimizer.tfdist_compression_state  # Tracked by the optimizer: checkpoints carry it.
        seed = len(tracked)
        if kind == "q":  # The same on every replica.
            initial: Callable[[], Any] = lambda: tf.random.stateless_normal(shape, seed=[_Q_SEED, seed])  # noqa: E731
            aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA
        else:
            initial = lambda: tf.zeros(shape)  # noqa: E731
            aggregation = tf.VariableAggregation.SUM
        name = f"{variable.name.split(':')[0]}/{config.compression}_{kind}"
        strategy = tf.distribute.get_strategy()
        with tf.init_scope():  # Eager: a checkpoint read before this first step restores it as it is tracked.
            states[key] = tf.Variable(
                initial,
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=aggregation,
            )
            # Each replica's own error, not their sum: a resume continues as if never stopped.
            tracked[str(seed)] = (
                states[key] if kind == "q" else _compat.per_replica_checkpoint(states[key], strategy, _log_resize)
            )
    return states[key]


def _log_resize(saved: int, now: int) -> None:
    _log.warning(
        "The compression errors were saved by %d replicas and restored on %d: each replica starts from an equal "
        "share of their sum (no gradient is lost, but the run no longer repeats an uninterrupted one exactly).",
        saved,
        now,
    )


def _sum_whole(config: CollectiveConfig) -> Callable[[Sequence[Any]], list[Any]]:
    """Sums tensors over the replicas as they are (float32), with the config's packing and splitting."""
    plain = dataclasses.replace(config, compression="none")
    return lambda tensors: all_reduce_sum(list(tensors), plain)


def _powersgd(optimizer: Any, grads: list[Any], variables: list[Any], config: CollectiveConfig) -> list[Any]:
    import tensorflow as tf

    errors: list[Any] = []
    qs: list[Any] = []
    states: list[tuple[Any, Any] | None] = []
    for grad, variable in zip(grads, variables):
        view = matrix_shape(grad.shape.as_list(), rank=config.rank)
        if view is None:
            states.append(None)
            errors.append(None)
            qs.append(None)
            continue
        error = _state(optimizer, variable, "error", view, config)
        q = _state(optimizer, variable, "q", (view[1], config.rank), config)
        states.append((error, q))
        errors.append(tf.identity(error))
        qs.append(tf.identity(q))
    summed, new_errors, new_qs = powersgd_sum(grads, errors, qs, rank=config.rank, all_reduce=_sum_whole(config))
    for state, error, q in zip(states, new_errors, new_qs):
        if state is not None:
            state[0].assign(error)
            state[1].assign(q)
    return summed


def _topk(optimizer: Any, grads: list[Any], variables: list[Any], config: CollectiveConfig) -> list[Any]:
    import tensorflow as tf

    states = [_state(optimizer, v, "error", g.shape.as_list(), config) for g, v in zip(grads, variables)]
    context = tf.distribute.get_replica_context()
    summed, new_errors = topk_sum(
        grads,
        [tf.identity(s) for s in states],
        density=config.density,
        all_gather=lambda tensors: context.all_gather(list(tensors), axis=0),
    )
    for state, error in zip(states, new_errors):
        state.assign(error)
    return summed


_STEPS: dict[str, Callable[[Any, list[Any], list[Any], CollectiveConfig], list[Any]]] = {
    "powersgd": _powersgd,
    "topk": _topk,
}
