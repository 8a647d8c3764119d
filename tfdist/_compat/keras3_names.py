"""The private Keras 3 names tfdist's features for Keras 3 models use, resolved up front on Keras 3's own objects.

:mod:`.keras3` checks the trainer names its fixes replace (``REPLACED``) before it installs them. tfdist's
features for Keras 3 models use more private names: its file-writing callbacks made to write from the chief
(:mod:`.keras3_callbacks`: ``ModelCheckpoint.filepath``, ``TensorBoard.log_dir``, ``BackupAndRestore``'s paths),
the backup that resumes at the step it saved (:mod:`.keras3_resume`: ``BackupAndRestore``'s hooks, the epoch
iterator's counters), and the training step as ``with_communication`` and ``accumulate_gradients`` change it
(:mod:`.keras3_step`). :func:`check_features` makes the Keras 3 objects these are read from (nothing is trained,
nothing written) and raises the :class:`~tfdist.errors.StackError` of the first name missing, naming the Keras
version and the name: ``check_keras3`` runs it, so ``build_strategy`` (installing the fixes) and ``tfdist doctor
--stack`` fail there rather than a feature with a bare ``AttributeError`` in the middle of a fit.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from tfdist._compat.keras3_callbacks import BACKUP_PATHS, WRITE_PATHS
from tfdist._compat.keras3_step import REDUCE, STEP_NAMES, UNSCALE, moved

# What the backup overrides or calls on Keras 3's BackupAndRestore, and what start_epoch_at uses of its iterator.
BACKUP_NAMES = ("_load_model", "_save_model", "_should_save_on_batch", "_training_metadata_path", "_weights_path")
ITERATOR_NAMES = ("steps_per_epoch", "steps_per_execution", "_num_batches", "_steps_seen", "_enumerate_iterator")
ITERATOR = "TFEpochIterator"  # Keras 3's epoch iterator, in the trainer module.
_CHIEF_ONLY = "its callbacks to write from the chief only"


class _NoDistribution:
    """What ``TFEpochIterator`` asks of a strategy, without one: the dataset as it is."""

    def experimental_distribute_dataset(self, dataset: Any) -> Any:
        return dataset


def check_features(keras: Any, trainer: Any, version: str) -> None:
    """Resolves every name of this module's tables on objects of ``keras`` and of its ``trainer`` module
    (``keras.src.backend.tensorflow.trainer``); raises StackError naming ``version`` and the first missing."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="tfdist-keras3-check-") as scratch:
        callbacks = {
            "ModelCheckpoint": _made(keras, "callbacks.ModelCheckpoint", version, os.path.join(scratch, "x.keras")),
            "TensorBoard": _made(keras, "callbacks.TensorBoard", version, scratch),
            "BackupAndRestore": _made(keras, "callbacks.BackupAndRestore", version, scratch),
        }
    for kind, name in WRITE_PATHS.items():
        _require(callbacks[kind], kind, (name,), _CHIEF_ONLY, version, text=True)
    backup = callbacks["BackupAndRestore"]
    _require(backup, "BackupAndRestore", BACKUP_PATHS, _CHIEF_ONLY, version, text=True)
    _require(backup, "BackupAndRestore", BACKUP_NAMES, "PreemptionSafeBackup", version)
    data = {"x": np.zeros((2, 1), "float32"), "batch_size": 1}
    iterator = _made(trainer, ITERATOR, version, distribute_strategy=_NoDistribution(), **data)
    _require(iterator, ITERATOR, ITERATOR_NAMES, "PreemptionSafeBackup's resume at a step", version)
    optimizer = _resolved(keras, "optimizers.SGD", version)
    if not callable(getattr(optimizer, REDUCE, None)):
        raise moved(f"optimizers.SGD.{REDUCE}", "with_communication", version)
    _require(_made(keras, "Sequential", version), "Sequential", STEP_NAMES, "accumulate_gradients", version)
    if not callable(getattr(importlib.import_module(UNSCALE), "unscale_loss_for_distribution", None)):
        raise moved(f"{UNSCALE}.unscale_loss_for_distribution", "accumulate_gradients", version)


def _resolved(owner: Any, dotted: str, version: str) -> Any:
    value = owner
    for name in dotted.split("."):
        value = getattr(value, name, None)
        if value is None:
            raise moved(dotted, "tfdist's Keras 3 features", version)
    return value


def _made(owner: Any, dotted: str, version: str, *args: Any, **kwargs: Any) -> Any:
    return _resolved(owner, dotted, version)(*args, **kwargs)


def _require(made: Any, kind: str, names: Sequence[str], needed_by: str, version: str, *, text: bool = False) -> None:
    """Each of ``names`` is an attribute of ``made`` (a string, with ``text``)."""
    for name in names:
        if not hasattr(made, name) or (text and not isinstance(getattr(made, name), str)):
            raise moved(f"{kind}.{name}", needed_by, version)
