"""Error-feedback compressors (PowerSGD, top-k...) inside a tf-keras optimizer: their state, and their step.

:func:`tfdist.keras.with_communication` hands the dense gradients here; the compressor
(:class:`tfdist.comm.ErrorFeedback`) says what state it keeps per gradient (its ``state_slots``) and sums
the gradients (its ``step``). Each compressed variable gets its state as variables on the optimizer,
created at its first step:

* per-replica state such as its **error** (what this worker did not send), one value per replica
  (``ON_READ``, ``SUM``). A checkpoint saves every replica's own error (gathered at save time, a collective
  every worker's save joins) and a restore gives each its own, so a resumed run continues as the
  uninterrupted one would. Restored on a different number of replicas, each gets an equal share of their
  sum (no gradient is lost; one warning);
* shared state such as PowerSGD's warm-start **Q** factor, the same on every replica (``ON_READ``,
  ``ONLY_FIRST_REPLICA``), started from a fixed seed.

They are tracked as an attribute of the optimizer, so ``tf.train.Checkpoint``, ``BackupAndRestore`` and
tfdist's backups carry them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from tfdist import _compat
from tfdist.comm.collective import CollectiveConfig, all_reduce_sum
from tfdist.comm.compressor import Collectives, ErrorFeedback, StateSlot

__all__: list[str] = []

_log = logging.getLogger("tfdist.keras")

_Q_SEED = 0x5EED  # The first seed of every seeded state; the second is the variable's place in the state.


def log_sparse(config: CollectiveConfig, variables: Sequence[Any]) -> None:
    """Logs (at trace time) which variables' sparse gradients are summed by TF, uncompressed."""
    if variables:
        _log.warning(
            "compression=%r compresses dense gradients only: %s get sparse (IndexedSlices) gradients (embedding "
            "lookups), which TF sums as they are (only the rows a batch touched travel).",
            config.compressor.name,
            ", ".join(sorted({v.name for v in variables})),
        )


def aggregate(
    optimizer: Any, grads: Sequence[Any], variables: Sequence[Any], compressor: ErrorFeedback, config: CollectiveConfig
) -> list[Any]:
    """The sums over the replicas of the dense ``grads`` of ``variables`` by ``compressor`` (``config``'s), with
    ``config``'s packing; updates the state."""
    import tensorflow as tf

    states = [
        {
            slot.kind: _state(optimizer, variable, slot, compressor.name)
            for slot in compressor.state_slots(grad.shape.as_list())
        }
        for grad, variable in zip(grads, variables)
    ]
    plain = CollectiveConfig(bytes_per_pack=config.bytes_per_pack, split_bytes=config.split_bytes)
    collectives = Collectives(
        all_reduce=lambda tensors: all_reduce_sum(list(tensors), plain),  # Float32, the config's packing.
        all_gather=lambda tensors: tf.distribute.get_replica_context().all_gather(list(tensors), axis=0),
    )
    values = [{kind: tf.identity(variable) for kind, variable in state.items()} for state in states]
    summed, new_states = compressor.step(list(grads), values, collectives)
    for state, new in zip(states, new_states):
        for kind, variable in state.items():
            variable.assign(new[kind])
    return summed


def _state(optimizer: Any, variable: Any, slot: StateSlot, compression: str) -> Any:
    """The state variable of ``slot`` for ``variable``, created at its first use."""
    import tensorflow as tf

    states: dict[tuple[str, str], Any] = optimizer._tfdist.setdefault("states", {})
    key = (variable.name, slot.kind)
    if key not in states:
        tracked = optimizer.tfdist_compression_state  # Tracked by the optimizer: checkpoints carry it.
        seed = len(tracked)
        shape = slot.shape
        if slot.seeded:
            initial: Callable[[], Any] = lambda: tf.random.stateless_normal(shape, seed=[_Q_SEED, seed])  # noqa: E731
        else:
            initial = lambda: tf.zeros(shape)  # noqa: E731
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA if slot.shared else tf.VariableAggregation.SUM
        name = f"{variable.name.split(':')[0]}/{compression}_{slot.kind}"
        strategy = tf.distribute.get_strategy()
        with tf.init_scope():  # Eager: a checkpoint read before this first step restores it as it is tracked.
            states[key] = tf.Variable(
                initial,
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=aggregation,
            )
            # Each replica's own state (its error), not their sum: a resume continues as if never stopped.
            tracked[str(seed)] = (
                states[key] if slot.shared else _compat.per_replica_checkpoint(states[key], strategy, _log_resize)
            )
    return states[key]


def _log_resize(saved: int, now: int) -> None:
    _log.warning(
        "The compression errors were saved by %d replicas and restored on %d: each replica starts from an equal "
        "share of their sum (no gradient is lost, but the run no longer repeats an uninterrupted one exactly).",
        saved,
        now,
    )
