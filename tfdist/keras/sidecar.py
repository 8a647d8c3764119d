"""The evaluator side-car: evaluate each new checkpoint, log metrics for TensorBoard, stop with training.

Run it on the evaluator task (``tfdist-launch --evaluator``). Training must save
``checkpoint_dir/ckpt-{epoch}`` (``cluster_callbacks(checkpoint_dir=...)`` does);
the evaluator stops after evaluating the checkpoint of the last epoch.

In the training script, on the evaluator task (not run here: it needs a cluster and checkpoints)::

    if spec.task_type == "evaluator":
        sidecar_evaluate(model, val_dataset, checkpoint_dir=ckpt, epochs=10, log_dir=tb + "/eval")
"""

from __future__ import annotations

import logging
from typing import Any

from tfdist import _compat

__all__ = ["sidecar_evaluate"]

_log = logging.getLogger("tfdist.keras")


def sidecar_evaluate(
    model: Any, data: Any, *, checkpoint_dir: str, epochs: int, steps: int | None = None, log_dir: str | None = None
) -> None:
    """Evaluates every new checkpoint in ``checkpoint_dir`` until the one of epoch ``epochs``.

    Args:
      model: A compiled tf-keras model of the same architecture as training's.
      data: Evaluation dataset.
      checkpoint_dir: Where training writes ``ckpt-{epoch}``.
      epochs: Training's epoch count; the evaluator stops after ``ckpt-<epochs>``.
      steps: Evaluation steps per checkpoint; None: the whole dataset.
      log_dir: TensorBoard directory for the evaluation metrics.
    """
    tf_keras = _compat.tf_keras_module("sidecar_evaluate")
    callbacks = [tf_keras.callbacks.TensorBoard(log_dir)] if log_dir else []
    evaluator = tf_keras.utils.SidecarEvaluator(
        model, data, checkpoint_dir, steps=steps, max_evaluations=epochs, callbacks=callbacks
    )
    _log.info("Side-car evaluator watching %s until ckpt-%d.", checkpoint_dir, epochs)
    evaluator.start()
