"""The one place that touches private TensorFlow, tf-keras and Keras 3 internals.

tfdist supports TensorFlow 2.17 to 2.21, each with the tf-keras of the same
minor version. Everything tfdist needs beyond their public APIs (private
attributes, ``tensorflow.python`` classes, overridable private hooks) is
reached through this package's accessors, so an upgrade has one place to check: ``keras``
(tf-keras), ``keras3`` (Keras 3's TensorFlow trainer, fixed for multi-worker fit), ``keras3_callbacks`` (its
file-writing callbacks from the chief), ``keras3_resume`` (its backups, resumed at the step they saved),
``keras3_step`` (its gradient all-reduce and micro-batches), ``keras_optional`` (tf-keras where it
imports, what stands for it where it does not), ``distribute`` (the TF runtime), ``data`` (tf.data),
``saving`` (checkpoint writes), ``frames`` (which Python frames are TensorFlow's), and ``checks``, which
resolves them all.
Each accessor either resolves or raises :class:`tfdist.errors.StackError`
naming the installed versions; :func:`check_internals` resolves all of them
(``tests/test_compat.py`` runs it on both CI stacks, ``tfdist doctor`` reports it).

Which versions are installed, and whether tfdist supports them, is :mod:`tfdist.runtime.versions`.

Example:
    >>> from tfdist import _compat
    >>> _compat.is_tf_error(RuntimeError("gone"), ("UnavailableError",))
    False
"""

from __future__ import annotations

from tfdist._compat.checks import check_internals
from tfdist._compat.data import (
    cached_interleave,
    marked_single_device,
    rebatch_dense,
    single_device_functions,
    tfrecord_reader,
    tfrecord_reader_at,
    unbatch_dense,
)
from tfdist._compat.distribute import (
    ClosureHooks,
    communication_options,
    dtensor_initialized,
    is_sharded_variable,
    is_tf_error,
    is_variable,
    per_replica_checkpoint,
    replica_dtensor_dataset,
    stop_data_server,
    wait_for_coordinated_peers,
    watch_closures,
    worker_count,
)
from tfdist._compat.keras import (
    attach_preemption_handler,
    backup_base,
    backup_checkpoint,
    before_initial_counters,
    callback_base,
    follow_leader_checkpoints,
    guard_initial_counters,
    is_dtensor_optimizer,
    is_functional,
    lazy_variables,
    require_tf_keras_model,
    restored_counters,
    resume_counters,
    saving_before_preemption,
    steps_per_execution,
    tf_keras_models_only,
    training_state,
    validate_target_and_loss,
)
from tfdist._compat.keras3 import check_keras3, fixed_keras3_model, is_keras3_model, prepare_keras3
from tfdist._compat.keras3_resume import resuming_backup
from tfdist._compat.keras3_step import accumulating_train_step, is_keras3_optimizer, reducing_optimizer
from tfdist._compat.keras_optional import TfKerasMissing, installed_tf_keras, tf_keras_module
from tfdist._compat.saving import merged_after_barrier

__all__ = [
    "ClosureHooks",
    "TfKerasMissing",
    "accumulating_train_step",
    "attach_preemption_handler",
    "backup_base",
    "backup_checkpoint",
    "before_initial_counters",
    "cached_interleave",
    "callback_base",
    "check_internals",
    "check_keras3",
    "communication_options",
    "dtensor_initialized",
    "fixed_keras3_model",
    "follow_leader_checkpoints",
    "guard_initial_counters",
    "installed_tf_keras",
    "is_dtensor_optimizer",
    "is_functional",
    "is_keras3_model",
    "is_keras3_optimizer",
    "is_sharded_variable",
    "is_tf_error",
    "is_variable",
    "lazy_variables",
    "marked_single_device",
    "merged_after_barrier",
    "per_replica_checkpoint",
    "prepare_keras3",
    "rebatch_dense",
    "reducing_optimizer",
    "replica_dtensor_dataset",
    "require_tf_keras_model",
    "restored_counters",
    "resume_counters",
    "resuming_backup",
    "saving_before_preemption",
    "single_device_functions",
    "steps_per_execution",
    "stop_data_server",
    "tf_keras_models_only",
    "tf_keras_module",
    "tfrecord_reader",
    "tfrecord_reader_at",
    "training_state",
    "unbatch_dense",
    "validate_target_and_loss",
    "wait_for_coordinated_peers",
    "watch_closures",
    "worker_count",
]
