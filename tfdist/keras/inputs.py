"""The right ``model.fit`` input for the strategy in use, and a determinism switch.

In a training script (not run here: it needs a pipeline and a strategy)::

    from tfdist.keras.inputs import fit_input
    model.fit(fit_input(pipeline, strategy=strategy, steps_per_epoch=100), steps_per_epoch=100)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from tfdist import _compat
from tfdist.errors import StrategyError, invalid

__all__ = ["enable_determinism", "fit_input"]

_log = logging.getLogger("tfdist.keras")
DatasetFn = Callable[[Any], Any]


def fit_input(
    source: Any | DatasetFn,
    *,
    strategy: Any | None = None,
    steps_per_epoch: int | None = None,
    mesh: Any | None = None,
) -> Any:
    """Turns a ``TFRecordPipeline``, a dataset function or a dataset into ``fit``'s ``x``.

    - A DTensor ``mesh`` (from ``tfdist.parallel.build_mesh``): a ``DTensorDataset``
      whose processes read disjoint shares along the batch axis and the same share
      across the model axis (:func:`tfdist.keras.parallel.mesh_input.mesh_dataset`).

    - ParameterServerStrategy: a ``DatasetCreator`` over the dataset function;
      ``steps_per_epoch`` is required, as PS ``fit`` cannot know an epoch's end.
      A ``TFRecordPipeline`` there reads one pass per data epoch: each worker
      claims the next global step from a counter on a parameter server when
      it runs one (``TFRecordPipeline.claimed_dataset_fn``), so every record is
      trained once per data epoch whichever worker runs each step; with
      ``class_weights``, step ``g`` trains the draws of step ``g`` of one
      stream of stratified draws. Options that cannot be claimed raise a
      ``DataError`` naming the fix; ``order="buffer"`` reads the whole data
      on every worker.
    - Mirrored / MultiWorkerMirrored with a ``TFRecordPipeline``: its
      ``dataset()`` (this worker's shard from TF_CONFIG, global batches that
      Keras splits over replicas); no step count needed.
    - Mirrored / MultiWorkerMirrored with a dataset function:
      ``distribute_datasets_from_function`` (per-replica batches); Keras then
      needs ``steps_per_epoch``.
    - No distribution: the dataset itself.

    Args:
      source: A ``TFRecordPipeline``, ``fn(input_context) -> Dataset``, or a
        ``tf.data.Dataset`` (used as is except under parameter servers).
      strategy: The strategy; default the one in scope.
      steps_per_epoch: Steps per epoch; pass the same value to ``fit``.
      mesh: A DTensor mesh; the strategy is then not used.
    """
    import tensorflow as tf

    if mesh is not None:
        from tfdist.keras.parallel.mesh_input import mesh_dataset

        return mesh_dataset(source, mesh)

    strategy = strategy or tf.distribute.get_strategy()
    dataset_fn = getattr(source, "dataset_fn", None) or (source if callable(source) else None)
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        if dataset_fn is None:
            raise invalid(
                StrategyError,
                "source",
                type(source).__name__,
                "a TFRecordPipeline or a dataset function under ParameterServerStrategy",
                "Each worker builds its own input: pass `lambda ctx: make_dataset(ctx)`.",
            )
        if steps_per_epoch is None:
            raise invalid(
                StrategyError,
                "steps_per_epoch",
                None,
                "a number of steps under ParameterServerStrategy",
                "PS fit cannot detect the end of an epoch: pass steps_per_epoch=... here and to fit().",
            )
        tf_keras = _compat.tf_keras_module("fit_input under ParameterServerStrategy")
        claimed = getattr(source, "claimed_dataset_fn", None)
        claimed_fn = claimed(strategy) if claimed is not None else None
        if claimed_fn is not None:
            from tfdist.data.order.claims import claim_input_options

            _log_epochs(source, steps_per_epoch)
            return tf_keras.utils.experimental.DatasetCreator(claimed_fn, input_options=claim_input_options())
        return tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    if dataset_fn is None:
        return source
    if hasattr(source, "dataset_fn"):
        return cast(Any, source).dataset()  # A TFRecordPipeline, or anything shaped like one.
    if not tf.distribute.has_strategy() and strategy is tf.distribute.get_strategy():  # TF's default strategy.
        return dataset_fn(tf.distribute.InputContext())
    if steps_per_epoch is None:
        raise invalid(
            StrategyError,
            "steps_per_epoch",
            None,
            f"a number of steps with a dataset function under {type(strategy).__name__}",
            "Keras cannot size an epoch of a distributed dataset: pass "
            "steps_per_epoch=... here and to fit(), or give a TFRecordPipeline.",
        )
    return strategy.distribute_datasets_from_function(dataset_fn)


def _log_epochs(pipeline: Any, steps_per_epoch: int) -> None:
    """Says how fit's epochs line up with the data epochs of claimed steps, and where a finite input ends
    (a restarted task's pipeline says what its claims need, as it makes them)."""
    steps = pipeline.steps_per_epoch()
    passes = getattr(pipeline, "num_epochs", None)
    if steps is not None and passes is not None:
        _log.warning(
            "The input ends after %d steps (num_epochs=%d data epochs of %d steps): under parameter servers "
            "fit fails with a CancelledError when a step finds no more (after %d of fit's epochs of %d steps). "
            "Pass num_epochs=None to the pipeline and let fit's epochs decide how long it trains.",
            passes * steps,
            passes,
            steps,
            passes * steps // steps_per_epoch,
            steps_per_epoch,
        )
    if steps is not None and steps != steps_per_epoch:
        _log.info(
            "fit's epochs are %d steps, a data epoch is %d steps: each data epoch trains every record once, "
            "and fit's epochs cut the steps where they fall (steps_per_epoch=%d makes them the same).",
            steps_per_epoch,
            steps,
            steps,
        )


def enable_determinism(seed: int) -> None:
    """Seeds Python, NumPy and TF and turns on deterministic TF ops, for reproducible runs.

    Call it before building the model. Deterministic ops can be slower, and ops
    without a deterministic kernel then raise instead of running. Keras' own generators are seeded too:
    tf-keras's, or Keras 3's where tf-keras is not installed.
    """
    import tensorflow as tf

    tf_keras = _compat.installed_tf_keras()
    if tf_keras is not None:
        tf_keras.utils.set_random_seed(seed)
    else:
        import keras  # Keras 3: the one Keras there.

        keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    _log.info("Determinism on: seed %d, deterministic TF ops.", seed)
