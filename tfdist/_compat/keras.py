"""tf-keras internals: its callback and backup classes, training state and fit counters.

Where tf-keras does not import (TensorFlow 2.22), the callback and backup bases are :mod:`.keras_optional`'s
:class:`~tfdist._compat.keras_optional.KerasCallback`: Keras 3 models keep the callbacks that work with them,
and any other model is refused naming the install.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tfdist._compat._common import _attr
from tfdist._compat.keras3 import fixed_keras3_model
from tfdist._compat.keras_optional import KerasCallback, installed_tf_keras
from tfdist.runtime.versions import keras3_loaded, tf_keras_pin

# ---- tf-keras callbacks ------------------------------------------------------------------------------------


def callback_base() -> type:
    """``tf_keras.callbacks.Callback`` with tf-keras' private batch-hook switch as a public method.

    Subclasses override ``wants_train_batch_hooks()`` instead of
    ``_implements_train_batch_hooks`` (which tf-keras asks to decide whether to
    call ``on_train_batch_*``; they are forbidden under ParameterServerStrategy).
    Where tf-keras does not import, a :class:`KerasCallback` that wants every batch hook.
    """
    tf_keras = installed_tf_keras()
    if tf_keras is None:
        return _CallbackWithoutTfKeras
    base = tf_keras.callbacks.Callback
    hook = _attr(base, "_implements_train_batch_hooks", "ThroughputLogger's per-batch timing")

    class Callback(_TfKerasModelsOnly, base):  # type: ignore[misc, valid-type]
        def wants_train_batch_hooks(self) -> bool:
            """Whether tf-keras should call ``on_train_batch_begin/end`` (default: if they are overridden)."""
            return bool(hook(self))

        def _implements_train_batch_hooks(self) -> bool:
            return self.wants_train_batch_hooks()

    return Callback


def require_tf_keras_model(model: Any, callback: str, keras3_hint: str = "") -> None:
    """Raises StrategyError when a tfdist callback is given a model that is not tf-keras' (Keras 3's ``tf.keras``).

    Keras 3 hands its model to every callback's ``set_model``; a tf-keras
    callback then fails deep inside with ``AttributeError: 'Sequential' object
    has no attribute '_distribution_strategy'``. ``keras3_hint`` ends the message: what works with Keras 3.
    Where tf-keras does not import, every model is refused, and the message and the fix name the install.
    """
    tf_keras = installed_tf_keras()
    if model is None or (tf_keras is not None and isinstance(model, tf_keras.Model)):
        return
    from tfdist.errors import StrategyError

    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    keras3 = keras3_loaded()
    pip = f"pip install '{tf_keras_pin()}'"
    install = "" if tf_keras is not None else f"{pip} (tf-keras is not importable here), "
    raise StrategyError(
        f"tfdist's {callback} is a tf-keras callback, and the model is a {kind}"
        + (f" (Keras 3, keras {keras3})" if keras3 and type(model).__module__.startswith("keras") else "")
        + f", not a tf_keras.Model. Build the model with tf-keras: {install}`from tfdist import keras` (or "
        "`import tf_keras as keras`), or set TF_USE_LEGACY_KERAS=1 before importing TensorFlow and use tf.keras."
        + (f" {keras3_hint}" if keras3_hint else ""),
        field="model",
        value=kind,
        expected="a tf_keras.Model",
        fix="from tfdist import keras" if tf_keras is not None else f"{pip}, then from tfdist import keras",
    )


class _TfKerasModelsOnly:
    """Mixin for tfdist's tf-keras callbacks: ``set_model`` refuses a Keras 3 model (require_tf_keras_model), unless
    the class works with one (``keras3_models``) and it is a Keras 3 that tfdist fixed (3.10 and later)."""

    keras3_models = False  # True: the callback uses only what both Kerases have (logs, the strategy, the optimizer).
    keras3_hint = ""  # What to use instead with a Keras 3 model, for the refusal.
    refused_as = ""  # The callback's name in the refusal; default its class's.

    def set_model(self, model: Any) -> None:
        if not (self.keras3_models and fixed_keras3_model(model)):
            require_tf_keras_model(model, self.refused_as or type(self).__name__, self.keras3_hint)
        super().set_model(model)  # type: ignore[misc]


@functools.cache
def tf_keras_models_only(base: type, refused_as: str, keras3_hint: str) -> type:
    """The tf-keras callback class ``base`` (``tf_keras.callbacks.ModelCheckpoint``, ...) whose ``set_model``
    refuses a model that is not tf-keras' (a Keras 3 model, which Keras 3's ``fit`` hands it) with a
    StrategyError naming it ``refused_as`` and ending with ``keras3_hint``, instead of tf-keras' AttributeError."""
    attributes = {"refused_as": refused_as, "keras3_hint": keras3_hint, "__module__": __name__}
    return type(base.__name__, (_TfKerasModelsOnly, base), attributes)


def backup_base() -> type:
    """``tf_keras.callbacks.BackupAndRestore``, refusing a model that is not tf-keras' (Keras 3's).

    Where tf-keras does not import, a :class:`KerasCallback` that keeps ``backup_dir`` and ``save_freq``.
    """
    tf_keras = installed_tf_keras()
    if tf_keras is None:
        return _BackupWithoutTfKeras

    base = tf_keras.callbacks.BackupAndRestore

    class BackupAndRestore(_TfKerasModelsOnly, base):  # type: ignore[misc, valid-type]
        pass

    return BackupAndRestore


class _CallbackWithoutTfKeras(_TfKerasModelsOnly, KerasCallback):
    """:func:`callback_base` where tf-keras does not import."""

    def wants_train_batch_hooks(self) -> bool:
        return True


class _BackupWithoutTfKeras(_TfKerasModelsOnly, KerasCallback):
    """:func:`backup_base` where tf-keras does not import: what tfdist's backup reads of tf-keras' arguments."""

    def __init__(self, backup_dir: str, save_freq: Any = "epoch", save_before_preemption: bool = False) -> None:
        super().__init__()
        self.backup_dir, self.save_freq = backup_dir, save_freq


def training_state(backup: Any) -> Any:
    """The ``WorkerTrainingState`` a ``BackupAndRestore`` made in ``on_train_begin``."""
    return _attr(backup, "_training_state", "PreemptionSafeBackup")


def saving_before_preemption(state: Any) -> bool:
    """Whether tf-keras itself enabled saving on SIGTERM (it does so only on GCP)."""
    return bool(_attr(state, "_enable_save_before_preemption", "PreemptionSafeBackup"))


def attach_preemption_handler(state: Any, model: Any, handler: Any) -> None:
    """Wires TF's ``PreemptionCheckpointHandler`` into tf-keras as tf-keras does on GCP.

    The same four assignments as ``WorkerTrainingState.__init__`` when
    ``save_before_preemption`` holds (identical in tf-keras 2.17 to 2.21), then,
    on a non-chief worker, the chief's backup restored again (see below).
    """
    for obj, name in (
        (state, "_enable_save_before_preemption"),
        (state, "read_checkpoint_manager"),
        (handler, "_read_checkpoint_manager"),
    ):
        _attr(obj, name, "PreemptionSafeBackup")
    handler._read_checkpoint_manager = state.read_checkpoint_manager
    state.preemption_handler = handler
    state._enable_save_before_preemption = True
    model._preemption_handler = handler
    if state.write_checkpoint_manager is not state.read_checkpoint_manager:
        # The handler restored, as it was made, from the manager it was given: on a non-chief worker that is
        # its temporary write directory, which holds a stale backup when the worker was killed between a save
        # and that directory's removal. It overwrote what BackupAndRestore had restored from the chief's
        # backup (the worker then resumed at another step than its peers). Restore the chief's again.
        state.read_checkpoint_manager.restore_or_initialize()


def steps_per_execution(model: Any) -> int:
    """The steps one call of a compiled tf-keras model's train function runs (``compile(steps_per_execution=)``)."""
    value = _attr(model, "_steps_per_execution", "local_sgd")
    return 1 if value is None else int(value.numpy())


def validate_target_and_loss(model: Any, y: Any, loss: Any) -> None:
    """tf-keras' own check in ``train_step`` that targets and a loss were given."""
    _attr(model, "_validate_target_and_loss", "accumulate_gradients")(y, loss)


def restored_counters(model: Any) -> tuple[int, int] | None:
    """(epoch, batch) a ``BackupAndRestore`` restored into ``model``; None without a backup callback.

    -1 means none saved: tf-keras saves the last finished epoch and, with
    batch-level saving, the last finished batch of the epoch after it.
    """
    state = getattr(model, "_training_state", None)
    if state is None:
        return None
    epoch = _attr(state, "_ckpt_saved_epoch", "ResumeInput")
    batch = _attr(state, "_ckpt_saved_batch", "ResumeInput")
    return int(epoch.numpy()), int(batch.numpy())


def backup_checkpoint(model: Any) -> tuple[Any, str | None] | None:
    """The ``tf.train.Checkpoint`` a ``BackupAndRestore`` saves for ``model`` and the save it restored from
    (None: none); None without a backup callback. tf-keras 2.17 to 2.21 make it in ``WorkerTrainingState``
    and keep it only in its checkpoint managers (a later attribute of it is saved and restored with it)."""
    state = getattr(model, "_training_state", None)
    if state is None:
        return None
    manager = _attr(state, "read_checkpoint_manager", "ResumeInput")
    return manager.checkpoint, manager.latest_checkpoint


def resume_counters(model: Any, steps_per_epoch: int | None) -> tuple[int, int]:
    """(epoch, step) fit goes on at after the restore, as tf-keras computes it (0, 0 without a backup)."""
    state = getattr(model, "_training_state", None)
    if state is None:
        return 0, 0
    method = _attr(state, "maybe_load_initial_counters_from_ckpt", "ResumeInput")
    epoch, step = method(steps_per_epoch, 0, "train")  # tf-keras' ModeKeys.TRAIN.
    return int(epoch), int(step)


def before_initial_counters(model: Any, hook: Callable[[Any], None]) -> None:
    """Runs ``hook(steps_per_epoch)`` when ``fit`` loads its initial counters, once, then lets it load them.

    tf-keras 2.17 to 2.21 calls ``Model._maybe_load_initial_counters_from_ckpt``
    right after every callback's ``on_train_begin`` (so after any
    ``BackupAndRestore`` restored) and before the first iterator is made.
    """
    _attr(model, "_maybe_load_initial_counters_from_ckpt", "ResumeInput")  # Fails clearly if tf-keras renamed it.

    def hooked(steps_per_epoch: Any, initial_epoch: Any, *args: Any, **kwargs: Any) -> Any:
        model.__dict__.pop("_maybe_load_initial_counters_from_ckpt", None)
        hook(steps_per_epoch)
        return model._maybe_load_initial_counters_from_ckpt(steps_per_epoch, initial_epoch, *args, **kwargs)

    model.__dict__["_maybe_load_initial_counters_from_ckpt"] = hooked


def guard_initial_counters(model: Any, steps_per_epoch: int | None) -> None:
    """Lets tf-keras resume a finite dataset of unknown length from a batch-level backup.

    tf-keras 2.17 to 2.21 compares the saved batch with ``steps_per_epoch - 1``
    and fails with a TypeError when fit knows no step count (a finite dataset
    whose length TensorFlow cannot tell). Given the epoch's step count, the
    comparison gets it; without one, a saved batch resumes at the batch after it.
    """
    state = getattr(model, "_training_state", None)
    if state is None:
        return
    original = _attr(state, "maybe_load_initial_counters_from_ckpt", "ResumeInput")
    if getattr(original, "_tfdist_guarded", False):
        original = original._tfdist_original

    def guarded(steps: Any, initial_epoch: Any, mode: Any) -> Any:
        known = steps if steps is not None else steps_per_epoch
        if known is not None:
            return original(known, initial_epoch, mode)
        return original(-1, initial_epoch, mode)  # batch == -2 never holds: resume at the next batch.

    guarded._tfdist_guarded = True  # type: ignore[attr-defined]
    guarded._tfdist_original = original  # type: ignore[attr-defined]
    state.maybe_load_initial_counters_from_ckpt = guarded


def is_functional(model: Any) -> bool:
    """Whether a tf-keras model is a graph of layers: functional, or a ``Sequential`` that starts with an Input.

    tf-keras keeps it in the private ``Model._is_graph_network`` (False for a subclassed model).
    """
    return bool(_attr(model, "_is_graph_network", "shard_model"))


def is_dtensor_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` was made for a DTensor mesh (``mesh=``, kept as the private ``_mesh``).

    Also True for a class of tf-keras's own DTensor package (``tf_keras.src.dtensor``). An optimizer
    without a ``_mesh`` (tf-keras's legacy ones) is not made for a mesh.
    """
    if type(optimizer).__module__.startswith("tf_keras.src.dtensor"):
        return True
    return getattr(optimizer, "_mesh", None) is not None


def lazy_variables() -> Any:
    """A scope in which tf-keras creates variables without allocating them (what a LayoutMap scope uses).

    ``shard_model`` builds a model once inside it to read the layers and weight shapes, then builds it
    again under the chosen layouts; nothing of the first build is allocated.
    """
    try:
        from tf_keras.src.dtensor import lazy_variable
    except ImportError:
        from tfdist._compat._common import _missing

        raise _missing("tf_keras.src.dtensor.lazy_variable", "shard_model") from None
    return _attr(lazy_variable, "lazy_init_scope", "shard_model")()


def follow_leader_checkpoints(backup: Any, *, leader: bool, barrier: Callable[[], None]) -> None:
    """Makes a ``BackupAndRestore`` on a DTensor mesh record only complete checkpoints, from one process.

    On a mesh every process is its own "chief" to tf-keras. Each one's ``CheckpointManager`` names the new
    checkpoint in the ``checkpoint`` file and deletes the old ones as soon as its own part of the save is
    queued, while the shards may still be merging (they sit in ``ckpt-N_temp``): a process killed then
    leaves a ``checkpoint`` file naming a checkpoint that never completed, the previous one deleted, and a
    restart that cannot restore. After this, every process waits at ``barrier`` (the whole save done on
    every process, or an error if one stopped) before the ``leader`` alone records and deletes.

    At the end of a fit every process deleted the backup directory as soon as it was done, while the leader
    could still be recording the last checkpoint there (``NotFoundError`` on ``checkpoint.tmp...``): now all
    wait at ``barrier`` and the leader alone deletes it.

    Each save's shards are merged by the leader once every process has written its own (:mod:`.saving`):
    DTensor's merge inside the save waits for nobody and deleted ``ckpt-N_temp`` under another process's
    write.
    """
    import logging

    import tensorflow as tf

    from tfdist._compat.saving import deferred_merge, merge_round

    original = _attr(backup, "on_train_begin", "mesh backups")

    def on_train_begin(logs: Any = None) -> None:
        original(logs)
        state = training_state(backup)
        manager = _attr(state, "write_checkpoint_manager", "mesh backups")
        record, sweep = _attr(manager, "_record_state", "mesh backups"), _attr(manager, "_sweep", "mesh backups")
        delete = _attr(state, "delete_backup", "mesh backups")
        checkpoint = _attr(manager, "_checkpoint", "mesh backups")
        write = _attr(checkpoint, "_write", "mesh backups")

        def deferred_write(file_prefix: Any, options: Any = None) -> Any:
            with deferred_merge(str(file_prefix)):  # complete() merges the shards after a barrier.
                return write(file_prefix, options=options)

        def delete_backup() -> None:
            barrier()  # Every process is done with the backup, the leader's last record included.
            if leader:
                delete()

        completed: list[str] = []  # The checkpoint last merged and checked (tf-keras records each save twice).

        def complete() -> bool:
            path = manager.latest_checkpoint
            if path and completed == [path]:
                return True  # The same save's second record: merged and checked, every process knows.
            if path:
                merge_round(path, leader=leader, barrier=barrier)
            else:
                barrier()
            if path and not tf.io.gfile.exists(path + ".index"):
                logging.getLogger("tfdist.keras").warning(
                    "Backup %s is incomplete after every process saved; the previous backup stays the one to restore.",
                    path,
                )
                return False
            completed[:] = [path] if path else []
            return True

        def record_state() -> None:
            if complete() and leader:
                record()

        checkpoint._write = deferred_write
        manager._record_state = record_state
        manager._sweep = sweep if leader else (lambda: None)
        state.delete_backup = delete_backup

    backup.on_train_begin = on_train_begin
