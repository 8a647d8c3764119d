"""The check every stack runs: each internal tfdist uses, resolved (``tfdist doctor --stack``)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from tfdist._compat._common import _attr, _missing
from tfdist._compat.data import (
    cached_interleave,
    marked_single_device,
    rebatch_dense,
    single_device_functions,
    tfrecord_reader,
    unbatch_dense,
)
from tfdist._compat.distribute import (
    _dtensor_input,
    _exporting_saved_model,
    _save_spec,
    _sharded_variable_class,
    _trackable_base,
    check_closure_hooks,
    dtensor_initialized,
)
from tfdist._compat.frames import check_py_function_file
from tfdist._compat.keras import (
    backup_base,
    backup_checkpoint,
    callback_base,
    is_dtensor_optimizer,
    is_functional,
    lazy_variables,
    saving_before_preemption,
    steps_per_execution,
    training_state,
)
from tfdist._compat.keras3 import check_keras3
from tfdist.errors import StackError
from tfdist.runtime.versions import stack_problem, stack_text, tf_keras_installed


def _check_preemption_wiring() -> None:
    import tensorflow as tf

    source = inspect.getsource(tf.distribute.experimental.PreemptionCheckpointHandler)
    if "self._read_checkpoint_manager" not in source:
        raise _missing("PreemptionCheckpointHandler._read_checkpoint_manager", "PreemptionSafeBackup")


def _check_backup_state() -> None:
    import tempfile

    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((1,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with tempfile.TemporaryDirectory() as tmp:
        backup = backup_base()(tmp)
        backup.set_model(model)
        backup.on_train_begin()
        state = training_state(backup)
        saving_before_preemption(state)
        for name in ("read_checkpoint_manager", "write_checkpoint_manager"):
            _attr(state, name, "PreemptionSafeBackup")
        _attr(state, "delete_backup", "mesh backups")  # follow_leader_checkpoints: the leader deletes, last.
        _attr(_attr(state.write_checkpoint_manager, "_checkpoint", "mesh backups"), "_write", "mesh backups")
        _attr(model, "_validate_target_and_loss", "accumulate_gradients")
        steps_per_execution(model)
        if backup_checkpoint(model) is None:
            raise _missing("Model._training_state", "ResumeInput's claims ledger")


def _check_model_kinds() -> None:
    import tf_keras

    class Subclassed(tf_keras.Model):
        def call(self, inputs: Any) -> Any:
            return inputs

    functional = tf_keras.Sequential([tf_keras.Input((1,)), tf_keras.layers.Dense(1)])
    if not is_functional(functional) or is_functional(Subclassed()):
        raise _missing("Model._is_graph_network telling functional from subclassed models", "shard_model")
    optimizer = tf_keras.optimizers.SGD()
    _attr(optimizer, "_mesh", "with_communication and local_sgd on a mesh")
    if is_dtensor_optimizer(optimizer):
        raise _missing("Optimizer._mesh None for an optimizer without a mesh", "with_communication and local_sgd")


def _check_deferred_merge() -> None:
    """A real checkpoint write inside deferred_merge leaves a scratch merge; merge_shards makes it whole."""
    import os
    import tempfile

    import tensorflow as tf

    from tfdist._compat.saving import deferred_merge, merge_shards

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "ckpt")
        checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
        with deferred_merge(prefix):
            checkpoint.write(prefix)
        if tf.io.gfile.exists(prefix + ".index") or not merge_shards(prefix):
            raise _missing("functional_saver's merge through gen_io_ops.merge_v2_checkpoints", "mesh backups")
        restored = tf.train.Checkpoint(v=tf.Variable([0.0, 0.0]))
        restored.read(prefix).assert_consumed()
        if restored.v.numpy().tolist() != [1.0, 2.0]:
            raise _missing("a checkpoint merged by merge_shards that restores", "mesh backups")


def _check_coordination_barrier() -> None:
    from tensorflow.python.eager import context

    for name in ("coordination_service", "wait_at_barrier"):
        _attr(context.Context, name, "exit_cleanly's wait for collective peers")


def _check_trackable_hooks() -> None:
    base = _trackable_base()
    for name in ("_serialize_to_tensors", "_restore_from_tensors"):
        _attr(base, name, "per-replica checkpoints of compression errors")
    _save_spec(lambda: None, "float32", "/cpu:0")
    _exporting_saved_model()


def _check_data_service() -> None:
    import tensorflow as tf

    for cls in (tf.data.experimental.service.DispatchServer, tf.data.experimental.service.WorkerServer):
        _attr(cls, "_stop", "LocalDataService.stop")


def _check_communication_options() -> None:
    import tensorflow as tf

    module = sys.modules[tf.distribute.MultiWorkerMirroredStrategy.__module__]
    extended = getattr(module, "CollectiveAllReduceExtended", None)
    if extended is None or "self._communication_options =" not in inspect.getsource(extended):
        raise _missing("CollectiveAllReduceExtended._communication_options", "communication_options")


def _check_data_readers() -> None:
    import os
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, name) for name in ("a", "b")]
        for path, records in zip(paths, ([b"1", b"2"], [b"3"])):
            with tf.io.TFRecordWriter(path) as writer:
                for record in records:
                    writer.write(record)
        # Without autotuning: its optimization thread, cancelled as the iterator goes, may log
        # "Optimization loop failed: CANCELLED" on a busy machine, noise in `tfdist doctor --stack`.
        quiet = tf.data.Options()
        quiet.autotune.enabled = False
        read = tfrecord_reader(tf.constant(paths), "", 1 << 16).with_options(quiet)
        if [r.numpy() for r in read] != [b"1", b"2", b"3"]:
            raise _missing("_TFRecordDataset reading files one after the other", "reading local files")
        if [r.numpy() for r in unbatch_dense(read.batch(2))] != [b"1", b"2", b"3"]:
            raise _missing("_UnbatchDataset splitting batches", "stratified sampling")
        rebatched = rebatch_dense(read.batch(2), 2, drop_remainder=True)
        if [r.numpy().tolist() for r in rebatched] != [[b"1", b"2"]] or rebatched.element_spec.shape != [2]:
            raise _missing("RebatchDatasetV2 joining and cutting batches", "resumable input")


def _check_single_device() -> None:
    import tensorflow as tf

    with single_device_functions():
        inner = tf.data.Dataset.range(4).flat_map(lambda x: tf.data.Dataset.range(x).map(lambda y: y + 1))
    if set(marked_single_device(inner).values()) != {True} or [int(x) for x in inner] != [1, 1, 2, 1, 2, 3]:
        raise _missing("StructuredFunctionWrapper(defun_kwargs=) marking functions", "resumable input")


def _check_cached_interleave() -> None:
    import tensorflow as tf

    def repeat(x: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensors(x).repeat(2)

    key = ("tfdist.checks", id(_check_cached_interleave))
    built = [
        cached_interleave(tf.data.Dataset.range(n), repeat, key=key, cycle_length=2, parallel=p)
        for n, p in ((2, False), (3, True))
    ]
    names = {dataset._map_func.function.name for dataset in built}
    if len(names) != 1 or [[int(x) for x in d] for d in built] != [[0, 1, 0, 1], [0, 1, 0, 1, 2, 2]]:
        raise _missing("StructuredFunctionWrapper reused by (Parallel)InterleaveDataset ops", "resumable input")


# The checks that need tf-keras: skipped where it is not installed (Keras 3 models need none of them).
_TF_KERAS_CHECKS: dict[str, Callable[[], object]] = {
    "Callback._implements_train_batch_hooks": callback_base,
    "BackupAndRestore._training_state and WorkerTrainingState": _check_backup_state,
    "tf_keras lazy_variable.lazy_init_scope": lazy_variables,
    "Model._is_graph_network and Optimizer._mesh": _check_model_kinds,
}
_CHECKS: dict[str, Callable[[], object]] = {  # Each raises StackError when its internal is missing.
    **_TF_KERAS_CHECKS,
    "PreemptionCheckpointHandler._read_checkpoint_manager": _check_preemption_wiring,
    "ShardedVariable": _sharded_variable_class,
    "dtensor accelerator_util.is_initialized": dtensor_initialized,
    "dtensor input_util._DTensorIterator and _pack_iterator_resource_dtensor": _dtensor_input,
    "tf.data service servers' _stop": _check_data_service,
    "Trackable._serialize_to_tensors, _restore_from_tensors and SaveSpec": _check_trackable_hooks,
    "Context.wait_at_barrier and coordination_service": _check_coordination_barrier,
    "MultiWorkerMirroredStrategy extended._communication_options": _check_communication_options,
    "tf.data's _TFRecordDataset, _UnbatchDataset and RebatchDatasetV2": _check_data_readers,
    "StructuredFunctionWrapper(defun_kwargs=) for single-device dataset functions": _check_single_device,
    "StructuredFunctionWrapper traced once for many interleave datasets": _check_cached_interleave,
    "functional_saver.gen_io_ops.merge_v2_checkpoints (mesh backups merged after a barrier)": _check_deferred_merge,
    "ClusterCoordinator's Worker._process_closure and closure_queue.put_back": check_closure_hooks,
    "Keras 3's TensorFlowTrainer._maybe_symbolic_build and reduce_per_replica (its multi-worker fit), and its "
    "callbacks', epoch iterator's, optimizer's and model's names tfdist's Keras 3 features use": check_keras3,
    "tf.py_function's Python called from tensorflow/python/ops/script_ops.py (the stall inspector)": (
        check_py_function_file
    ),
}
SKIPPED = "skipped: tf-keras is not installed"


def check_internals() -> dict[str, str]:
    """Resolves every internal tfdist uses; returns name -> 'ok' (or :data:`SKIPPED` for those of tf-keras where
    it is not installed). Raises StackError on the first that fails."""
    problem = stack_problem()
    if problem is not None:
        raise StackError(
            problem,
            field="stack",
            value=stack_text(),
            expected="TF 2.17-2.21 with the tf-keras of its minor, or without tf-keras a Keras 3 from 3.10",
            fix="pip install 'tensorflow>=2.17,<2.22' and the matching tf-keras (or keras>=3.10)",
        )
    tf_keras = tf_keras_installed()
    checked = {}
    for name, check in _CHECKS.items():
        skip = not tf_keras and name in _TF_KERAS_CHECKS
        if not skip:
            check()
        checked[name] = SKIPPED if skip else "ok"
    return checked
