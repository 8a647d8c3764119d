"""Keras 3 backups that carry where ``fit`` goes on, and save on SIGTERM: a resume starts at the next step.

Keras 3's ``BackupAndRestore`` restores the epoch of a backup and ignores its batch, so the steps of the
interrupted epoch before the backup would train again. :func:`resuming_backup` makes one that

- records in each backup the step ``fit`` goes on at, and commits a backup with one rename: the weights go to a
  file of their own, then the metadata naming them replaces the last (Keras 3 overwrites its weights and its
  metadata in place, so a crash between the two writes paired one backup's weights with another's epoch);
- after a restore, once every callback started, asks ``on_restore`` to put the input at that step and, if it
  did, starts ``fit``'s interrupted epoch there (:func:`start_epoch_at`: Keras 3's epoch iterator numbers and
  counts the steps from it, so ``steps_per_epoch`` and the next backups stay right);
- under MultiWorkerMirroredStrategy saves on SIGTERM: TF's ``PreemptionCheckpointHandler`` agrees on a step with
  every worker, each saves the backup there (the chief where it was told, the others aside) and exits.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from tfdist._compat.keras3 import fit_epoch_iterator, install
from tfdist._compat.keras3_callbacks import restore_then_write_aside
from tfdist._compat.keras3_names import BACKUP_NAMES, ITERATOR_NAMES
from tfdist._compat.keras3_step import moved

_log = logging.getLogger("tfdist.keras")
WEIGHTS = "backup-{number}.weights.h5"  # One file per save; the committed metadata names the current one.
# (epoch, step, steps per epoch or None) -> whether the input goes on at that step.
OnRestore = Callable[[int, int, Any], bool]


def resuming_backup(
    model: Any, backup_dir: str, *, save_freq: Any, on_restore: OnRestore | None, exit_fn: Callable[[], None]
) -> Any:
    """A Keras 3 ``BackupAndRestore`` for ``model`` that resumes at the step it saved (see the module).

    ``save_freq``: 'epoch', a number of steps, or False (saves on SIGTERM only). ``on_restore`` puts the input
    at the restored step (None: the input restarts at the interrupted epoch's start, and so does ``fit``).
    ``exit_fn`` ends the process after a SIGTERM's save. A worker that is not the chief saves aside.
    """
    keras = sys.modules["keras"]
    install(keras)  # Once per process: fit then tells start_epoch_at its epoch iterator.
    plain = keras.callbacks.BackupAndRestore(backup_dir)
    for name in BACKUP_NAMES:
        if not hasattr(plain, name):
            raise moved(f"BackupAndRestore.{name}", "PreemptionSafeBackup")
    backup = _backup_class(keras.callbacks.BackupAndRestore)(
        backup_dir, save_freq=save_freq, on_restore=on_restore, exit_fn=exit_fn
    )
    backup.set_model(model)
    if not model.distribute_strategy.extended.should_checkpoint:
        restore_then_write_aside(backup, str(keras.__version__))
    return backup


@functools.cache
def _backup_class(base: Any) -> Any:
    return type("ResumingBackup", (_Resuming, base), {"__module__": __name__})


class _Resuming:
    """What :func:`resuming_backup` adds to Keras 3's ``BackupAndRestore`` (the class after it in the MRO)."""

    # Keras 3's BackupAndRestore sets these (the paths pointed aside on a worker that is not the chief).
    backup_dir: str
    save_freq: Any
    model: Any
    params: Any
    _weights_path: str
    _training_metadata_path: str
    _last_batch_seen: int

    def __init__(self, backup_dir: str, *, save_freq: Any, on_restore: Any, exit_fn: Any) -> None:
        super().__init__(backup_dir, save_freq=save_freq)  # type: ignore[call-arg]
        self._on_restore, self._exit_fn = on_restore, exit_fn
        self._epoch, self._position = 0, (0, 0)  # The epoch running; where fit goes on after the last step.
        self._restored: tuple[int, int] | None = None  # (epoch, step) of the backup restored.
        self._number = 0  # Saves so far: the next weights file's number.
        self._linked = False
        self._handler: Any = None  # TF's PreemptionCheckpointHandler, under MultiWorkerMirroredStrategy.
        self._unused_dir: str | None = None

    def _metadata(self) -> dict[str, Any] | None:
        import tensorflow as tf

        if not tf.io.gfile.exists(self._training_metadata_path):
            return None
        with tf.io.gfile.GFile(self._training_metadata_path) as f:
            return dict(json.load(f))

    def _load_model(self) -> None:
        metadata = self._metadata()
        told = self._weights_path
        if metadata is not None and "tfdist_weights" in metadata:
            self._weights_path = os.path.join(self.backup_dir, metadata["tfdist_weights"])
        try:
            super()._load_model()  # type: ignore[misc]  # The weights, and the model's initial epoch.
        finally:
            self._weights_path = told
        if metadata is not None:  # A backup of Keras 3's own holds no step: its epoch from the start.
            self._restored = (int(metadata["epoch"]), int(metadata.get("tfdist_step", 0)))
            self._number = int(metadata.get("tfdist_number", -1)) + 1
            self._position = self._restored

    def _save_model(self) -> None:
        import tensorflow as tf

        (epoch, step), name = self._position, WEIGHTS.format(number=self._number)
        tf.io.gfile.makedirs(self.backup_dir)
        self.model.save_weights(os.path.join(self.backup_dir, name), overwrite=True)
        metadata = {"epoch": epoch, "batch": step - 1, "tfdist_step": step, "tfdist_weights": name}
        path = self._training_metadata_path
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            json.dump({**metadata, "tfdist_number": self._number}, f)
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)  # The commit: the backup is this one now.
        for old in tf.io.gfile.glob(os.path.join(self.backup_dir, WEIGHTS.format(number="*"))):
            if os.path.basename(old) != name:
                tf.io.gfile.remove(old)
        self._number += 1

    def _should_save_on_batch(self, batch: int) -> bool:
        return self.save_freq is not False and bool(super()._should_save_on_batch(batch))  # type: ignore[misc]

    def on_train_begin(self, logs: Any = None) -> None:
        self._restored, self._linked = None, False
        super().on_train_begin(logs)  # type: ignore[misc]
        self._watch_preemption()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch = epoch
        if not self._linked:  # The first epoch: every callback has started, no batch is read yet.
            self._linked = True
            self._resume(epoch)

    def _resume(self, epoch: int) -> None:
        restored_epoch, step = self._restored or (epoch, 0)
        step = step if restored_epoch == epoch else 0
        self._position = (epoch, step)
        steps = (self.params or {}).get("steps")
        if self._on_restore is not None and self._on_restore(epoch, step, steps):
            if step:
                start_epoch_at(self.model, step)
                self._last_batch_seen = step - 1  # Keras 3's save cadence goes on from there.
            return
        if step:
            self._position = (epoch, 0)
            _log.warning(
                "The backup in %s was saved at step %d of epoch %d, and the input restarts at the epoch's "
                "start: fit trains the epoch from its first step, so its first %d steps train twice. "
                "PreemptionSafeBackup(..., data=pipeline) resumes a TFRecordPipeline at the next record.",
                self.backup_dir,
                step,
                epoch,
                step,
            )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._position = (self._epoch, batch + 1)
        super().on_train_batch_end(batch, logs)  # type: ignore[misc]
        if self._handler is not None:
            self._handler.save_checkpoint_if_preempted()  # Saves and exits at the step every worker agreed on.

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._position = (epoch + 1, 0)
        super().on_epoch_end(epoch, logs)  # type: ignore[misc]

    def on_train_end(self, logs: Any = None) -> None:
        try:
            super().on_train_end(logs)  # type: ignore[misc]
        finally:
            if self._unused_dir is not None:
                shutil.rmtree(self._unused_dir, ignore_errors=True)

    def _watch_preemption(self) -> None:
        import tensorflow as tf

        strategy = self.model.distribute_strategy
        resolver = getattr(strategy, "cluster_resolver", None)
        if (
            self._handler is not None
            or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            or resolver is None
            or not resolver.cluster_spec().as_dict()
        ):
            return
        # TF's handler restores from and counts in a checkpoint manager of its own; save_fn saves this backup.
        self._unused_dir = tempfile.mkdtemp(prefix="tfdist-keras3-preemption-")
        unused = tf.train.CheckpointManager(tf.train.Checkpoint(), self._unused_dir, max_to_keep=1)
        config = tf.distribute.experimental.TerminationConfig(exit_fn=self._exit_fn, save_fn=self._save_model)
        self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver, unused, termination_config=config
        )
        _log.info("Saving before preemption is on: SIGTERM makes every worker save the backup and exit.")


def start_epoch_at(model: Any, step: int) -> None:
    """Starts the next epoch of the running ``fit`` of ``model`` at ``step``: its steps are numbered from there,
    and an epoch of known length runs only the steps left. Later epochs start at step 0."""
    iterator = fit_epoch_iterator(model)
    if iterator is None:
        raise moved("fit's epoch iterator (handed to TensorFlowTrainer._maybe_symbolic_build)", "a resume")
    for name in ITERATOR_NAMES:
        if not hasattr(iterator, name):
            raise moved(f"{type(iterator).__name__}.{name}", "a resume")
    original = type(iterator)._enumerate_iterator

    def enumerate_once() -> Iterator[Any]:
        iterator.__dict__.pop("_enumerate_iterator", None)
        yield from _from_step(iterator, original, step)

    iterator._enumerate_iterator = enumerate_once


def _from_step(iterator: Any, original: Callable[[Any], Iterator[Any]], start: int) -> Iterator[Any]:
    """Keras 3's ``_enumerate_iterator`` for one epoch, from step ``start``: it yields ``(step, it)`` in 3.10-3.11
    and ``(begin, end, it)`` later, with the steps renumbered; its count of steps seen (which sizes an epoch of
    unknown length when the input ends) includes the ``start`` steps before them."""
    told = iterator.steps_per_epoch
    known = told or iterator._num_batches
    if known and known <= start:
        return  # Nothing left of this epoch.
    if told:
        iterator.steps_per_epoch = told - start  # Read as the generator starts: it runs the steps left.
    try:
        for count, item in enumerate(original(iterator), 1):
            iterator.steps_per_epoch = told
            iterator._steps_seen = start + count * iterator.steps_per_execution
            yield (item[0] + start, *([item[1] + start] if len(item) == 3 else []), item[-1])
    finally:
        iterator.steps_per_epoch = told
