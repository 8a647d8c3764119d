"""Local SGD for ``model.fit``: each worker applies its own gradients; every ``period`` steps the weights are averaged.

Synchronous training all-reduces every gradient of every step. With :func:`local_sgd` each worker updates
its own copy of the weights from its own batches, and every ``period`` optimizer steps the workers'
weights (and the optimizer's slots, such as momentum) are replaced by their mean: one all-reduce of the
weights per ``period`` steps instead of one of the gradients per step (Stich, 2019; Lin et al., 2020).
This is not gradient accumulation (:func:`tfdist.keras.accumulate_gradients`), which still applies one
common update per batch.

Each worker's gradient is scaled back to its own batch's mean (Keras divides every replica's loss by the
*global* batch, so that the all-reduced sum is the global mean), so ``period=1`` takes the same steps as
synchronous SGD.

The averaging runs between steps, from ``fit``'s loop, as a function of its own: tf.distribute rejects a
collective under a condition inside the step on CPU workers. After a step that ends a period, every worker
holds the same weights; in between they differ, and a checkpoint written then keeps the chief's.

Example:
    >>> import tf_keras
    >>> from tfdist.keras import local_sgd
    >>> model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
    >>> model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
    >>> local_sgd(model, period=4).local_sgd_period
    4
"""

from __future__ import annotations

import functools
import types
from typing import Any

from tfdist import _compat
from tfdist.comm.local_sgd import LocalSGD
from tfdist.errors import StrategyError, invalid
from tfdist.keras._builders import refuse_mesh

__all__ = ["local_sgd"]


def local_sgd(model: Any, *, period: int, average_slots: bool = True) -> Any:
    """Makes ``model.fit`` train with local SGD: local updates, weights averaged every ``period`` steps.

    Args:
      model: A compiled tf-keras model (its optimizer a tf-keras ``Optimizer``, possibly inside a
        ``LossScaleOptimizer``).
      period: Optimizer steps between two averagings; a multiple of the model's ``steps_per_execution``.
      average_slots: Average the optimizer's slot variables (momentum, Adam's moments) too; False keeps
        each worker's own.

    Returns:
      The same model object; fit it as usual.

    Raises:
      StrategyError: ``period`` is not an integer >= 1 or not a multiple of ``steps_per_execution``, the
        model is not compiled, or it runs under ParameterServerStrategy (no replicas to average) or on a
        DTensor mesh.
    """
    import tensorflow as tf

    tf_keras = _compat.tf_keras_module("local_sgd")
    LocalSGD(period=period)  # Validates it (an integer >= 1), as the planner's local SGD.
    optimizer = getattr(model, "optimizer", None)
    refuse_mesh("model", type(model).__name__, "local SGD", optimizer=optimizer)
    if not isinstance(optimizer, tf_keras.optimizers.Optimizer):
        raise invalid(
            StrategyError,
            "model",
            type(model).__name__,
            "a compiled model whose optimizer is a tf_keras.optimizers.Optimizer",
            "Call model.compile(optimizer=...) first, then local_sgd(model, period=...).",
        )
    per_call = _compat.steps_per_execution(model)
    if per_call > 1 and period % per_call:
        raise invalid(
            StrategyError,
            "period",
            period,
            f"a multiple of the model's steps_per_execution ({per_call})",
            "The weights are averaged between calls of the train function.",
        )
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise invalid(
            StrategyError,
            "model",
            type(model).__name__,
            "a model under MultiWorkerMirroredStrategy or MirroredStrategy for local SGD",
            "Parameter servers hold one copy of the weights: there is nothing to average.",
        )
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # A LossScaleOptimizer's: the one that applies.
    object.__setattr__(inner, "apply_gradients", types.MethodType(_local_apply, inner))
    averaging = _Averaging(model, strategy, average_slots)
    original = type(model).make_train_function
    object.__setattr__(
        model, "make_train_function", functools.partial(_make_train_function, model, original, averaging, period)
    )
    object.__setattr__(model, "local_sgd_period", period)
    return model


def _local_apply(self: Any, grads_and_vars: Any, name: Any = None, **kwargs: Any) -> Any:
    """The optimizer's ``apply_gradients`` with no all-reduce: each replica's gradient, scaled to its own batch."""
    import tensorflow as tf

    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    pairs = [(g if g is None else g * replicas, v) for g, v in grads_and_vars]
    kwargs["skip_gradients_aggregation"] = True
    return type(self).apply_gradients(self, pairs, name=name, **kwargs)


def _make_train_function(model: Any, original: Any, averaging: _Averaging, period: int, force: bool = False) -> Any:
    """Keras' train function, followed by the averaging whenever the optimizer's step count crosses a period."""
    step = original(model, force=force)
    if getattr(step, "_tfdist_local_sgd", False):
        return step

    def train_function(iterator: Any) -> Any:
        before = int(model.optimizer.iterations.numpy())
        logs = step(iterator)
        after = int(model.optimizer.iterations.numpy())
        if after // period != before // period:
            averaging()
        return logs

    train_function._tfdist_local_sgd = True  # type: ignore[attr-defined]
    model.train_function = train_function
    return train_function


class _Averaging:
    """One all-reduce of the mean of the model's weights (and the optimizer's slots), assigned on every replica."""

    def __init__(self, model: Any, strategy: Any, slots: bool) -> None:
        self._model, self._strategy, self._slots = model, strategy, slots
        self._function: Any = None

    def _targets(self) -> list[Any]:
        optimizer = self._model.optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        targets = [v for v in self._model.weights if v.dtype.is_floating]
        if self._slots:
            skip = {id(inner.iterations)}
            targets += [v for v in inner.variables if v.dtype.is_floating and id(v) not in skip]
        return targets

    def __call__(self) -> None:
        import tensorflow as tf

        if self._function is None:  # The slots exist after the first step.
            targets = self._targets()

            def assign(strategy: Any, means: Any) -> None:
                for variable, mean in zip(targets, means):
                    strategy.extended.update(variable, lambda v, m: v.assign(m), args=(mean,), group=False)

            def replica() -> None:
                context = tf.distribute.get_replica_context()
                means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(v) for v in targets])
                context.merge_call(assign, args=(means,))

            self._function = tf.function(lambda: self._strategy.run(replica))
        self._function()
