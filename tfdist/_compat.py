"""The one module that touches private TensorFlow and tf-keras internals.

tfdist supports TensorFlow 2.17 to 2.21, each with the tf-keras of the same
minor version. Everything tfdist needs beyond their public APIs (private
attributes, ``tensorflow.python`` classes, overridable private hooks) is
reached through the accessors below, so an upgrade has one file to check.
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

import inspect
import sys
from collections.abc import Callable
from typing import Any

from tfdist.errors import StackError
from tfdist.runtime.versions import keras3_loaded, stack_problem, stack_text


def _missing(what: str, needed_by: str) -> StackError:
    return StackError(
        f"tfdist needs {what} for {needed_by}, which {stack_text()} does not have. tfdist supports "
        "TensorFlow 2.17-2.21 with the tf-keras of the same minor version; install one of those, or "
        "report the version at tfdist's issue tracker.",
        field="stack",
        value=stack_text(),
        expected=what,
        fix="pip install 'tensorflow>=2.17,<2.22' and the matching tf-keras",
    )


def _attr(obj: Any, name: str, needed_by: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(f"{type(obj).__name__}.{name}", needed_by) from None


def forbid_keras3_fit(strategy_name: str) -> bool:
    """Makes Keras 3's ``Model.fit`` raise a tfdist error naming the fix, if this process imported Keras 3.

    Keras 3 fails ``fit`` under MultiWorkerMirroredStrategy with TF's
    ``ValueError: Attempt to convert a value (PerReplica...)`` and has no
    ParameterServerStrategy ``fit``; ``build_strategy`` calls this for those
    strategies. Returns whether the guard is in place. Keras 3 imported later is
    not guarded (``tfdist doctor`` warns about it).
    """
    version = keras3_loaded()
    if version is None:
        return False
    model = sys.modules["keras"].Model
    if getattr(model.fit, "_tfdist_guard", False):
        return True

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        from tfdist.errors import StrategyError

        raise StrategyError(
            f"Keras 3 (keras {version}) cannot fit under {strategy_name}: under MultiWorkerMirroredStrategy TF "
            "raises 'Attempt to convert a value (PerReplica...)', and Keras 3 has no ParameterServerStrategy fit. "
            "Build the model with tf-keras: `from tfdist import keras` (or `import tf_keras as keras`), or set "
            "TF_USE_LEGACY_KERAS=1 before importing TensorFlow and use tf.keras.",
            field="keras",
            value=f"keras {version}",
            expected="tf-keras (Keras 2)",
            fix="from tfdist import keras",
        )

    fit._tfdist_guard = True  # type: ignore[attr-defined]
    model.fit = fit
    return True


# ---- tf-keras callbacks ------------------------------------------------------------------------------------


def callback_base() -> type:
    """``tf_keras.callbacks.Callback`` with tf-keras' private batch-hook switch as a public method.

    Subclasses override ``wants_train_batch_hooks()`` instead of
    ``_implements_train_batch_hooks`` (which tf-keras asks to decide whether to
    call ``on_train_batch_*``; they are forbidden under ParameterServerStrategy).
    """
    import tf_keras

    base = tf_keras.callbacks.Callback
    hook = _attr(base, "_implements_train_batch_hooks", "ThroughputLogger's per-batch timing")

    class Callback(_TfKerasModelsOnly, base):  # type: ignore[misc, valid-type]
        def wants_train_batch_hooks(self) -> bool:
            """Whether tf-keras should call ``on_train_batch_begin/end`` (default: if they are overridden)."""
            return bool(hook(self))

        def _implements_train_batch_hooks(self) -> bool:
            return self.wants_train_batch_hooks()

    return Callback


def require_tf_keras_model(model: Any, callback: str) -> None:
    """Raises StrategyError when a tfdist callback is given a model that is not tf-keras' (Keras 3's ``tf.keras``).

    Keras 3 hands its model to every callback's ``set_model``; a tf-keras
    callback then fails deep inside with ``AttributeError: 'Sequential' object
    has no attribute '_distribution_strategy'``.
    """
    import tf_keras

    if model is None or isinstance(model, tf_keras.Model):
        return
    from tfdist.errors import StrategyError

    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    keras3 = keras3_loaded()
    raise StrategyError(
        f"tfdist's {callback} is a tf-keras callback, and the model is a {kind}"
        + (f" (Keras 3, keras {keras3})" if keras3 and type(model).__module__.startswith("keras") else "")
        + ", not a tf_keras.Model. Build the model with tf-keras: `from tfdist import keras` (or "
        "`import tf_keras as keras`), or set TF_USE_LEGACY_KERAS=1 before importing TensorFlow and use tf.keras.",
        field="model",
        value=kind,
        expected="a tf_keras.Model",
        fix="from tfdist import keras",
    )


class _TfKerasModelsOnly:
    """Mixin for tfdist's tf-keras callbacks: ``set_model`` refuses a Keras 3 model (require_tf_keras_model)."""

    def set_model(self, model: Any) -> None:
        require_tf_keras_model(model, type(self).__name__)
        super().set_model(model)  # type: ignore[misc]


def backup_base() -> type:
    """``tf_keras.callbacks.BackupAndRestore``, refusing a model that is not tf-keras' (Keras 3's)."""
    import tf_keras

    class BackupAndRestore(_TfKerasModelsOnly, tf_keras.callbacks.BackupAndRestore):
        pass

    return BackupAndRestore


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


def validate_target_and_loss(model: Any, y: Any, loss: Any) -> None:
    """tf-keras' own check in ``train_step`` that targets and a loss were given."""
    _attr(model, "_validate_target_and_loss", "accumulate_gradients")(y, loss)


# ---- TensorFlow ---------------------------------------------------------------------------------------------


def stop_data_server(server: Any) -> None:
    """Stops an in-process tf.data service dispatcher or worker (TF has no public stop)."""
    _attr(server, "_stop", "LocalDataService.stop")()


def communication_options(strategy: Any) -> Any:
    """The ``CommunicationOptions`` a MultiWorkerMirroredStrategy merges into every all-reduce."""
    return _attr(
        _attr(strategy, "extended", "communication_options"), "_communication_options", "communication_options"
    )


def _sharded_variable_class() -> type:
    try:
        from tensorflow.python.distribute.sharded_variable import ShardedVariable
    except ImportError:
        raise _missing(
            "tensorflow.python.distribute.sharded_variable.ShardedVariable", "embedding_layout/local_weights"
        ) from None
    return ShardedVariable


def is_sharded_variable(value: Any) -> bool:
    """Whether ``value`` is a ParameterServerStrategy ``ShardedVariable`` (no public class exists)."""
    return isinstance(value, _sharded_variable_class())


def is_tf_error(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is one of ``tf.errors.<name>`` (without importing TensorFlow if nothing has yet)."""
    tf = sys.modules.get("tensorflow")
    classes = tuple(c for c in (getattr(getattr(tf, "errors", None), n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(exc, classes)


def wait_for_coordinated_peers(barrier_id: str, timeout_seconds: float) -> str | None:
    """Blocks until every task of this process's TF coordination service reached ``barrier_id``.

    Returns None once they all did, else why not (TensorFlow not loaded, no coordination service, a timeout,
    or the leader gone: it hosts the service and may exit as soon as the barrier passes, before its answer
    reaches the others). Never raises. The barrier itself is ``context.wait_at_barrier`` (no public API).
    """
    tf_context = sys.modules.get("tensorflow.python.eager.context")
    if tf_context is None:
        return "TensorFlow is not loaded"
    ctx = tf_context.context()
    if getattr(ctx, "coordination_service", None) is None:
        return "this process configured no coordination service"
    try:
        ctx.wait_at_barrier(barrier_id, int(timeout_seconds * 1000))
    except Exception as exc:  # TF's errors, or a stack without the method: the caller goes on either way
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def is_variable(value: Any) -> bool:
    """A ``tf.Variable`` (mirrored and PS variables included) or a ``ShardedVariable``."""
    import tensorflow as tf

    return isinstance(value, tf.Variable) or is_sharded_variable(value)


def tfrecord_reader(filenames: Any, compression: str, buffer_size: int) -> Any:
    """The records of ``filenames`` (a string tensor: one file, or a 1-D list read one file after the other).

    TF's bare reader, no traced function of its own: ``tf.data.TFRecordDataset``
    wraps it in a ``flat_map`` over a dataset of names, ~7 ms of tracing per
    reader outside a function, and a second nested function per file inside one.
    """
    try:
        from tensorflow.python.data.ops.readers import _TFRecordDataset
    except ImportError:
        raise _missing("tensorflow.python.data.ops.readers._TFRecordDataset", "reading local files") from None
    return _TFRecordDataset(filenames, compression_type=compression, buffer_size=buffer_size)


def tfrecord_reader_at(filename: Any, offset: Any, compression: str, buffer_size: int) -> Any:
    """The records of one file from byte ``offset`` on (a record boundary; 0 for compressed files).

    ``filename`` and ``offset`` may also be 1-D: the files one after the other, each from its offset.
    TF's ``TFRecordDatasetV2`` op takes byte offsets since 2.13; the public
    ``tf.data.TFRecordDataset`` does not pass them (2.17 to 2.21).
    """
    import tensorflow as tf

    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_dataset_ops
    except ImportError:
        raise _missing("tensorflow.python.data.ops.dataset_ops.DatasetSource", "resumable input") from None

    class _At(dataset_ops.DatasetSource):
        def __init__(self) -> None:
            variant = gen_dataset_ops.tf_record_dataset_v2(
                tf.reshape(tf.convert_to_tensor(filename, tf.string), [-1]),
                tf.convert_to_tensor(compression, tf.string),
                tf.convert_to_tensor(buffer_size, tf.int64),
                tf.reshape(tf.convert_to_tensor(offset, tf.int64), [-1]),
            )
            super().__init__(variant)

        @property
        def element_spec(self) -> Any:
            return tf.TensorSpec([], tf.string)

    return _At()


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


def unbatch_dense(dataset: Any) -> Any:
    """``dataset.unbatch()`` for elements of dense tensors only, without its normalizing ``map``.

    The public ``unbatch`` first maps every element through a function that
    turns sparse and ragged parts dense (a no-op for dense tensors, traced,
    ~5 ms, and one more stage per element).
    """
    import tensorflow as tf

    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset.unbatch()
    try:
        from tensorflow.python.data.ops.unbatch_op import _UnbatchDataset
    except ImportError:
        raise _missing("tensorflow.python.data.ops.unbatch_op._UnbatchDataset", "stratified sampling") from None
    return _UnbatchDataset(dataset)


def rebatch_dense(dataset: Any, batch_size: int, *, drop_remainder: bool = False) -> Any:
    """``dataset.rebatch(batch_size)`` for elements of dense tensors only, without its normalizing ``map``.

    As with :func:`unbatch_dense`: the public ``rebatch`` first maps every element through a traced no-op
    for dense tensors (one function to trace and instantiate, and one more stage per element).
    """
    import tensorflow as tf

    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(dataset.element_spec)):
        return dataset.rebatch(batch_size, drop_remainder=drop_remainder)
    try:
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_experimental_dataset_ops
    except ImportError:
        raise _missing("tensorflow.python.data.ops.dataset_ops.UnaryDataset", "resumable input") from None

    class _Rebatched(dataset_ops.UnaryDataset):
        def __init__(self) -> None:
            self._input_dataset = dataset
            size = batch_size if drop_remainder else None
            self._spec = tf.nest.map_structure(
                lambda spec: tf.TensorSpec([size, *spec.shape[1:]], spec.dtype), dataset.element_spec
            )
            variant = gen_experimental_dataset_ops.rebatch_dataset_v2(
                dataset._variant_tensor,
                batch_sizes=tf.constant([batch_size], tf.int64),
                drop_remainder=tf.constant(drop_remainder),
                **self._flat_structure,
            )
            super().__init__(dataset, variant)

        @property
        def element_spec(self) -> Any:
            return self._spec

    return _Rebatched()


# ---- the check every stack runs ------------------------------------------------------------------------------


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
        _attr(model, "_validate_target_and_loss", "accumulate_gradients")


def _check_coordination_barrier() -> None:
    from tensorflow.python.eager import context

    for name in ("coordination_service", "wait_at_barrier"):
        _attr(context.Context, name, "exit_cleanly's wait for collective peers")


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


_CHECKS: dict[str, Callable[[], object]] = {  # Each raises StackError when its internal is missing.
    "Callback._implements_train_batch_hooks": callback_base,
    "BackupAndRestore._training_state and WorkerTrainingState": _check_backup_state,
    "PreemptionCheckpointHandler._read_checkpoint_manager": _check_preemption_wiring,
    "ShardedVariable": _sharded_variable_class,
    "tf.data service servers' _stop": _check_data_service,
    "Context.wait_at_barrier and coordination_service": _check_coordination_barrier,
    "MultiWorkerMirroredStrategy extended._communication_options": _check_communication_options,
    "tf.data's _TFRecordDataset, _UnbatchDataset and RebatchDatasetV2": _check_data_readers,
}


def check_internals() -> dict[str, str]:
    """Resolves every internal tfdist uses; returns name -> 'ok'. Raises StackError on the first that fails."""
    problem = stack_problem()
    if problem is not None:
        raise StackError(
            problem,
            field="stack",
            value=stack_text(),
            expected="TF 2.17-2.21 with matching tf-keras",
            fix="pip install 'tensorflow>=2.17,<2.22' and the matching tf-keras",
        )
    for check in _CHECKS.values():
        check()
    return {name: "ok" for name in _CHECKS}
