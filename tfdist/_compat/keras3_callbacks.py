"""Keras 3's file-writing callbacks across workers: the chief writes where it was told, the others aside.

Keras 3's ``ModelCheckpoint``, ``BackupAndRestore`` and ``TensorBoard`` know nothing of workers: under
MultiWorkerMirroredStrategy every worker wrote the same files (an h5py lock error on one, and the collective
aborted). :func:`chief_only` does what tf-keras does for its own callbacks: every worker still saves (a save
may read variables through a collective), the chief where the callback says, the others into a scratch
directory removed at the end of ``fit``; and every worker's ``BackupAndRestore`` restores the chief's backup.
Keras 3 restores the epoch of a backup only and ignores a saved batch, so its ``BackupAndRestore`` saving within
an epoch (``save_freq`` a number) is refused: the batches before it would train twice. tfdist's backup for
Keras 3 (:mod:`.keras3_resume`) resumes at the step it saved.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from tfdist.errors import StackError, StrategyError

# BackupAndRestore's paths (Keras 3.10-3.15), all under its backup_dir.
BACKUP_PATHS = ("_weights_path", "_training_metadata_path", "_prev_weights_path", "_prev_training_metadata_path")
# Where ModelCheckpoint and TensorBoard write (their attribute, a string): pointed aside on the other workers.
WRITE_PATHS = {"ModelCheckpoint": "filepath", "TensorBoard": "log_dir"}


def chief_only(callbacks: Any, strategy: Any, keras: Any, version: str) -> StrategyError | None:
    """Sends the non-chief workers' writes of Keras 3 callbacks aside; the reason when one cannot be."""
    chief = bool(strategy.extended.should_checkpoint)
    for callback in callbacks or ():
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            if callback.save_freq != "epoch":
                return _batch_backup(callback.save_freq, version)
            if not chief:
                restore_then_write_aside(callback, version)
        elif isinstance(callback, keras.callbacks.ModelCheckpoint) and not chief:
            _write_aside(
                callback,
                "ModelCheckpoint",
                version,
                lambda scratch, path: os.path.join(scratch, os.path.basename(path)),
            )
        elif isinstance(callback, keras.callbacks.TensorBoard) and not chief:
            _write_aside(callback, "TensorBoard", version, lambda scratch, path: scratch)
    return None


def _batch_backup(save_freq: Any, version: str) -> StrategyError:
    return StrategyError(
        f"Keras 3 (keras {version}) cannot back up within an epoch across workers: BackupAndRestore("
        f"save_freq={save_freq!r}) saves a batch that Keras 3 ignores on restore, so the batches before it would "
        "train twice.",
        field="save_freq",
        value=save_freq,
        expected="save_freq='epoch' with Keras 3",
        fix="BackupAndRestore(backup_dir, save_freq='epoch'), or tfdist.keras.PreemptionSafeBackup(backup_dir, "
        f"save_freq={save_freq!r}, data=pipeline), which resumes at the next record",
    )


def _write_aside(callback: Any, kind: str, version: str, aside: Callable[[str, str], str]) -> None:
    """Points where ``callback`` (a ``kind``) writes into a scratch directory for one fit, removed (with what it
    holds) at its end; ``aside(scratch, path told)`` is the path there."""
    name = WRITE_PATHS[kind]
    if not isinstance(getattr(callback, name, None), str):
        raise _moved(f"{kind}.{name}", version)
    told = callback.__dict__.setdefault("_tfdist_told", getattr(callback, name))
    scratch = tempfile.mkdtemp(prefix="tfdist-keras3-")
    setattr(callback, name, aside(scratch, told))
    end = type(callback).on_train_end

    def on_train_end(logs: Any = None) -> None:
        try:
            end(callback, logs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            callback.__dict__.pop("on_train_end", None)

    callback.on_train_end = on_train_end


def restore_then_write_aside(callback: Any, version: str) -> None:
    """A non-chief ``BackupAndRestore``: restores from the chief's backup, then saves into a scratch directory."""
    for name in BACKUP_PATHS:
        if not isinstance(getattr(callback, name, None), str):
            raise _moved(f"BackupAndRestore.{name}", version)
    told = callback.__dict__.setdefault(
        "_tfdist_told", {n: getattr(callback, n) for n in ("backup_dir", *BACKUP_PATHS)}
    )
    begin, end = type(callback).on_train_begin, type(callback).on_train_end
    scratch = tempfile.mkdtemp(prefix="tfdist-keras3-backup-")

    def on_train_begin(logs: Any = None) -> None:
        for name, path in told.items():
            setattr(callback, name, path)
        begin(callback, logs)  # Restores what the chief saved.
        for name, path in told.items():
            setattr(callback, name, scratch + path[len(told["backup_dir"]) :])

    def on_train_end(logs: Any = None) -> None:
        try:
            end(callback, logs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            for name in ("on_train_begin", "on_train_end"):
                callback.__dict__.pop(name, None)

    callback.on_train_begin, callback.on_train_end = on_train_begin, on_train_end


def _moved(what: str, version: str) -> StackError:
    return StackError(
        f"tfdist needs keras.callbacks.{what} to save from the chief only, and keras {version} does not have it as "
        "tfdist knows it (Keras 3.10 to 3.15).",
        field="keras",
        value=f"keras {version}",
        expected=what,
        fix="pip install 'keras>=3.10,<=3.15.1', or `from tfdist import keras` (tf-keras)",
    )
