"""Gradient accumulation for ``model.fit``: one all-reduce and one update per k micro-batches.

:func:`accumulate_gradients` gives a model a ``train_step`` that cuts each
per-replica batch into ``steps`` micro-batches, runs forward and backward on
them one after the other (activation memory of one micro-batch), sums their
gradients locally and hands the mean to the optimizer once: one all-reduce and
one update per batch, so communication per example drops by ``steps``. With
SGD the update equals that of one batch ``steps`` times larger (tested under
2-worker MultiWorkerMirroredStrategy).

Feed it batches ``steps`` times larger than fit in memory at once: the input
pipeline holds raw examples only, while activations exist for one micro-batch.

Why inside the step and not across ``fit`` steps: applying on every k-th step
needs a collective inside ``tf.cond``, which tf.distribute rejects on CPU
workers ("merge_call called while defining a new graph"). Inside one step
there is no condition around the collective.

Example:
    >>> import tf_keras
    >>> from tfdist.keras import accumulate_gradients
    >>> model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
    >>> model = accumulate_gradients(model, steps=4)
    >>> model.accumulation_steps
    4
"""

from __future__ import annotations

import sys
import types
from typing import Any

from tfdist import _compat
from tfdist.errors import StrategyError, invalid, require_int

__all__ = ["accumulate_gradients"]


def accumulate_gradients(model: Any, *, steps: int) -> Any:
    """Makes ``model.fit`` accumulate gradients over ``steps`` micro-batches per batch.

    Args:
      model: A tf-keras or Keras 3 model that uses the standard ``train_step`` (a
        subclass with its own ``train_step`` is rejected: accumulate there).
      steps: Micro-batches per batch; 1 restores the standard step.

    Returns:
      The same model object; compile and fit it as usual.

    Raises:
      StrategyError: ``steps`` is not an integer >= 1, or the model overrides
        ``train_step``.
    """
    require_int(StrategyError, "steps", steps, minimum=1, fix="Use 1 for no accumulation.")
    keras3 = _compat.is_keras3_model(model)
    if keras3:
        standard = sys.modules["keras"].Model.train_step
    else:
        standard = _compat.tf_keras_module("accumulate_gradients with a tf-keras model").Model.train_step
    overridden = type(model).train_step is not standard
    if overridden:
        raise invalid(
            StrategyError,
            "model",
            type(model).__name__,
            "a model with Keras' standard train_step",
            "Your class overrides train_step: sum the gradients of micro-batches there.",
        )
    if steps == 1:
        model.__dict__.pop("train_step", None)
    elif keras3:  # Keras 3's own step on micro-batches (its optimizer's gradient_accumulation_steps applies
        # every k-th step under a cond, where the all-reduce fails across CPU workers as described below).
        object.__setattr__(model, "train_step", _compat.accumulating_train_step(model, steps, _micro_batches))
    else:
        object.__setattr__(model, "train_step", types.MethodType(_accumulating_train_step, model))
    object.__setattr__(model, "accumulation_steps", steps)
    return model


def _micro_batches(data: Any, steps: int) -> list[tuple[Any, Any]]:
    """Splits a batch into ``steps`` contiguous slices (sizes differ by at most one), with each one's share."""
    import tensorflow as tf

    n = tf.shape(tf.nest.flatten(data)[0])[0]
    out = []
    for i in range(steps):
        start, end = (i * n) // steps, ((i + 1) * n) // steps
        piece = tf.nest.map_structure(lambda t, a=start, b=end: t[a:b], data)
        out.append((piece, tf.cast(end - start, tf.float32) / tf.cast(tf.maximum(n, 1), tf.float32)))
    return out


def _accumulating_train_step(self: Any, data: Any) -> dict[str, Any]:
    import tensorflow as tf
    import tf_keras

    from tfdist._compat import validate_target_and_loss

    total, variables = None, []
    for piece, share in _micro_batches(data, self.accumulation_steps):
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(piece)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            # Keras' mean over an empty slice is 0 (divide_no_nan), so a short last batch is harmless.
            loss = self.compute_loss(x, y, y_pred, sample_weight)
        validate_target_and_loss(self, y, loss)
        variables = self.trainable_variables  # Built by the first call.
        # The optimizer's compute_gradients: a LossScaleOptimizer scales the loss and unscales the gradients.
        pairs = self.optimizer.compute_gradients(loss, variables, tape=tape)
        grads = [None if g is None else tf.convert_to_tensor(g) * share for g, _ in pairs]
        total = (
            grads if total is None else [a if g is None else (g if a is None else a + g) for a, g in zip(total, grads)]
        )
        self.compute_metrics(x, y, y_pred, sample_weight)
    assert total is not None  # _micro_batches yields accumulation_steps >= 1 pieces.
    self.optimizer.apply_gradients(zip(total, variables))
    return self.get_metrics_result()
