"""Keras 3's training step as tfdist's helpers change it: the gradient all-reduce, and micro-batches.

- :func:`reducing_optimizer`: a copy of a Keras 3 optimizer whose gradient all-reduce (``TFOptimizer.
  _all_reduce_sum_gradients``, which ``apply_gradients`` calls in each replica) sums the dense gradients with a
  function of the caller's (``tfdist.keras.with_communication``: packs, pieces, fp16 or bf16 on the wire);
  sparse gradients keep Keras 3's own sum.
- :func:`accumulating_train_step`: the ``train_step`` of Keras 3's TensorFlow trainer, run on micro-batches whose
  gradients are summed and applied once (``tfdist.keras.accumulate_gradients``).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import StackError

REDUCE = "_all_reduce_sum_gradients"  # TFOptimizer's, Keras 3.10 to 3.15.
STEP_NAMES = ("_call_has_training_arg", "_compute_loss", "_loss_tracker")  # What the accumulating step uses.
UNSCALE = "keras.src.losses.loss"  # Its unscale_loss_for_distribution: what Keras 3's step hands its loss tracker.
Grads = Sequence[Any]


def moved(what: str, needed_by: str, version: str | None = None) -> StackError:
    """The StackError of a Keras 3 internal that ``needed_by`` uses and Keras 3 ``version`` (by default the one
    imported) lacks."""
    version = version or str(getattr(sys.modules.get("keras"), "__version__", "?"))
    return StackError(
        f"tfdist needs Keras 3's {what} for {needed_by}, and keras {version} does not have it as tfdist knows it "
        "(Keras 3.10 to 3.15).",
        field="keras",
        value=f"keras {version}",
        expected=what,
        fix="pip install 'keras>=3.10,<=3.15.1', or `from tfdist import keras` (tf-keras)",
    )


def is_keras3_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a Keras 3 optimizer (``keras.optimizers.SGD(...)``...)."""
    keras = sys.modules.get("keras")
    base = getattr(getattr(keras, "optimizers", None), "Optimizer", None)
    return isinstance(base, type) and isinstance(optimizer, base)


def reducing_optimizer(
    optimizer: Any,
    *,
    config: Any,
    reduce: Callable[[Grads], list[Any]],
    measure: Callable[[Grads], int],
    reporting: type,
) -> Any:
    """A copy of the Keras 3 ``optimizer`` whose dense gradients ``reduce`` sums over the replicas.

    ``reporting`` is the caller's mixin that reads ``_tfdist`` (a dict: ``config``, and ``bytes``, which
    ``measure(grads)`` sets at each step's trace).
    """
    if not callable(getattr(type(optimizer), REDUCE, None)):
        raise moved(f"{type(optimizer).__name__}.{REDUCE}", "with_communication")
    base: Any = type(optimizer)
    new = _reducing_class(reporting, base).from_config(optimizer.get_config())
    # object.__setattr__: a plain dict, out of Keras' tracking (and so out of its saved weights).
    object.__setattr__(new, "_tfdist", {"config": config, "reduce": reduce, "measure": measure, "bytes": None})
    return new


@functools.cache
def _reducing_class(reporting: Any, base: Any) -> Any:
    return type(f"Communicating{base.__name__}", (reporting, _Reducing, base), {"__module__": base.__module__})


class _Reducing:
    """Keras 3's ``_all_reduce_sum_gradients`` through ``_tfdist["reduce"]`` for the dense gradients."""

    _tfdist: dict[str, Any]

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
        import tensorflow as tf

        if not tf.distribute.get_replica_context():
            return grads_and_vars
        pairs = list(grads_and_vars)
        dense = [i for i, (g, _) in enumerate(pairs) if g is not None and not isinstance(g, tf.IndexedSlices)]
        sparse = [i for i, (g, _) in enumerate(pairs) if isinstance(g, tf.IndexedSlices)]
        grads = [pairs[i][0] for i in dense]
        self._tfdist["bytes"] = self._tfdist["measure"](grads)
        for i, grad in zip(dense, self._tfdist["reduce"](grads) if grads else []):
            pairs[i] = (grad, pairs[i][1])
        if sparse:  # IndexedSlices (embedding rows) keep Keras 3's own all-reduce.
            merged = super()._all_reduce_sum_gradients([pairs[i] for i in sparse])  # type: ignore[misc]
            for i, pair in zip(sparse, merged):
                pairs[i] = pair
        return pairs


def accumulating_train_step(
    model: Any, steps: int, micro_batches: Callable[[Any, int], list[tuple[Any, Any]]]
) -> Callable[[Any], Any]:
    """``model``'s ``train_step`` on ``steps`` micro-batches (``micro_batches(data, steps)``: each slice and its
    share of the batch), their gradients summed and applied once; the loss and metrics see every micro-batch."""
    import importlib

    for name in STEP_NAMES:
        if not hasattr(model, name):
            raise moved(f"Model.{name}", "accumulate_gradients")
    unscale = getattr(importlib.import_module(UNSCALE), "unscale_loss_for_distribution", None)
    if unscale is None:
        raise moved(f"{UNSCALE}.unscale_loss_for_distribution", "accumulate_gradients")
    keras = sys.modules["keras"]

    def train_step(self: Any, data: Any) -> Any:
        import tensorflow as tf

        total: list[Any] | None = None
        weights, metrics = self.trainable_weights, None
        for piece, share in micro_batches(data, steps):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(piece)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True) if self._call_has_training_arg else self(x)
                loss = self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
                size = tf.shape(next(i for i in keras.tree.flatten(x) if i is not None))[0]
                self._loss_tracker.update_state(unscale(loss), sample_weight=size)
                # The micro-batch's mean, weighted by its share: the sum over micro-batches is the batch's mean.
                loss = self.optimizer.scale_loss(loss) * tf.cast(share, loss.dtype)
            grads = tape.gradient(loss, weights)
            total = (
                list(grads)
                if total is None
                else [a if g is None else (g if a is None else a + g) for a, g in zip(total, grads)]
            )
            metrics = self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        assert total is not None  # micro_batches gives steps >= 1 pieces.
        self.optimizer.apply_gradients(zip(total, weights))
        return metrics

    return types.MethodType(train_step, model)
