"""Keras 3's TensorFlow trainer under tf.distribute: two fixes that make its multi-worker fit right, and refusals.

Keras 3 (``import keras``; ``tf.keras`` too unless ``TF_USE_LEGACY_KERAS=1``) fails ``fit`` under
MultiWorkerMirroredStrategy with two bugs of ``keras/src/backend/tensorflow/trainer.py`` (keras-team/keras#20585):

- ``TensorFlowTrainer._maybe_symbolic_build`` reduces the first batch's nested ``(x, y)`` of ``PerReplica``
  values with ``strategy.reduce("MEAN", ..., axis=None)`` outside a ``tf.function``, only to learn the shapes;
  MultiWorkerMirroredStrategy does not map a reduce over a nested structure (``ValueError: Attempt to convert a
  value (PerReplica...)``). The fix builds from the input's element spec: the same shapes, no collective and
  no extra iterator (which an input that counts its epochs, as ``TFRecordPipeline`` does, took for one).
- ``reduce_per_replica``, on its MultiWorkerMirroredStrategy branch only, means scalar metrics with
  ``strategy.reduce("MEAN", v, axis=0)`` (``Invalid reduction dimension 0 for input with 0 dimensions``). The
  fix means them over the replicas with ``axis=None``, as its one-worker branch does.

:func:`prepare_keras3` installs both (once Keras 3 is imported: at once, or when it is imported later), gated to
Keras 3.10 and later: on 2 and 3 workers the per-step losses then equal a one-process run of the same global
batches to 1e-5 (tests/keras/test_keras3.py; up to 9.5e-7 measured). Older Keras 3 trains wrong on several replicas
even on one host (3.4-3.7 miss the per-replica loss scaling: weights up to 1.0 away from a one-process run; 3.8-3.9
train right and log a wrong loss), so its ``fit``, ``evaluate`` and ``predict`` are refused there. So are parameter
servers (Keras 3 has no ``fit`` that drives a ``ClusterCoordinator``) and ``steps_per_execution > 1`` across
workers; Keras 3's callbacks that write files save from the chief only (:mod:`.keras3_callbacks`). When a replaced
name moved, or a private name tfdist's Keras 3 features use (:mod:`.keras3_names`), installing raises a
:class:`tfdist.errors.StackError` naming the Keras version and the name; :func:`check_keras3` is what ``tfdist
doctor --stack`` runs.

Example:
    >>> from tfdist._compat import keras3
    >>> keras3.keras3_right("3.15.1"), keras3.keras3_right("3.9.2"), keras3.keras3_right("2.17.0")
    (True, False, False)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tfdist._compat.keras3_callbacks import chief_only
from tfdist._compat.keras3_names import check_features
from tfdist.errors import StackError, StrategyError
from tfdist.runtime.versions import KERAS3_MEASURED, keras3_loaded, keras_version, parse_version

_PUBLIC_NAMES = {"CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}  # TF's class, by its public name.

FIRST_RIGHT = KERAS3_MEASURED[0]  # The first Keras 3 whose multi-replica fit equals a one-process run.
TRAINER = "keras.src.backend.tensorflow.trainer"
# The trainer class of that module: TensorFlowTrainer to 3.15, Trainer in 3.16 (keras-nightly, TF 2.22.0rc0).
TRAINER_CLASSES = ("TensorFlowTrainer", "Trainer")
# What the fixes replace or use, with the parameters they are called with (checked by check_keras3).
REPLACED = {
    "TensorFlowTrainer._maybe_symbolic_build": ("self", "iterator", "data_batch"),  # Trainer.* in 3.16
    "TensorFlowTrainer._symbolic_build": None,
    "reduce_per_replica": ("values", "strategy", "reduction"),
    "_collective_all_reduce_multi_worker": ("strategy",),
    "TFEpochIterator._enumerate_iterator": ("self",),  # Started at a backup's step (keras3_resume).
}
GUARDED = ("fit", "evaluate", "predict")
OLD_KERAS = (
    "Keras 3 older than 3.10 trains wrong on several replicas, even on one host: 3.4-3.7 miss the per-replica "
    "loss scaling (weights up to 1.0 away from a one-process run of the same global batches), 3.8-3.9 train "
    "right but log a wrong loss"
)
_log = logging.getLogger("tfdist._compat.keras3")


class _Fits(threading.local):
    """The fits running in this thread, innermost last: [model, its training epoch iterator (None until built)]."""

    def __init__(self) -> None:
        self.running: list[list[Any]] = []


_FITS = _Fits()


def fit_epoch_iterator(model: Any) -> Any:
    """The epoch iterator of the ``fit`` of ``model`` running in this thread (Keras 3's ``TFEpochIterator``);
    None outside such a fit (or before Keras 3's ``fit`` made it)."""
    for fit in reversed(_FITS.running):
        if fit[0] is model:
            return fit[1]
    return None


def is_keras3_model(model: Any) -> bool:
    """Whether ``model`` is a Keras 3 model (``import keras``), not a tf-keras one."""
    model_class = getattr(sys.modules.get("keras"), "Model", None) if keras3_loaded() else None
    return model_class is not None and isinstance(model, model_class)


def fixed_keras3_model(model: Any) -> bool:
    """Whether ``model`` is a model of a Keras 3 whose multi-replica fit tfdist fixed (3.10 and later)."""
    version = keras3_loaded()
    return version is not None and keras3_right(version) and is_keras3_model(model)


def keras3_right(version: str) -> bool:
    """Whether ``version`` is a Keras 3 measured right under a multi-replica strategy (3.10 and later)."""
    return parse_version(version) >= FIRST_RIGHT


def _moved(what: str, version: str) -> StackError:
    return StackError(
        f"tfdist needs {TRAINER}.{what} to fix Keras 3's fit under MultiWorkerMirroredStrategy, and keras "
        f"{version} does not have it as tfdist knows it (tfdist knows Keras 3.10 to 3.15). Install a Keras tfdist "
        "knows, or build the model with tf-keras (`from tfdist import keras`), and report the version at tfdist's "
        "issue tracker.",
        field="keras",
        value=f"keras {version}",
        expected=f"{TRAINER}.{what}",
        fix="pip install 'keras>=3.10,<=3.15.1', or `from tfdist import keras` (tf-keras)",
    )


def _trainer_class(module: Any, version: str) -> Any:
    for name in TRAINER_CLASSES:
        found = getattr(module, name, None)
        if found is not None:
            return found
    raise _moved(" or ".join(TRAINER_CLASSES), version)


def _resolve(module: Any, dotted: str, version: str) -> Any:
    first, _, rest = dotted.partition(".")
    value = _trainer_class(module, version) if first == TRAINER_CLASSES[0] else getattr(module, first, None)
    for name in rest.split(".") if rest else ():
        if value is None:
            break
        value = getattr(value, name, None)
    if value is None:
        raise _moved(dotted, version)
    return value


def check_keras3(module: Any = None, version: str | None = None, keras: Any = None) -> str:
    """Resolves what the fixes replace in the installed (or given) trainer module, and the private names tfdist's
    features for Keras 3 models use (:func:`tfdist._compat.keras3_names.check_features`, on objects of the
    installed or given ``keras`` module); says what fit does with it.

    Raises StackError naming the Keras version and the name when one is missing or takes other parameters.
    Imports Keras 3 (and so TensorFlow) when it is installed and right.
    """
    version = version or keras_version()
    if version is None or parse_version(version) < (3, 0):
        return "no Keras 3 installed"
    if not keras3_right(version):
        return f"keras {version}: refused under multi-replica strategies (older than 3.10)"
    if module is None:
        try:
            module = importlib.import_module(TRAINER)
        except ImportError:
            raise _moved("(the module)", version) from None
    for dotted, parameters in REPLACED.items():
        value = _resolve(module, dotted, version)
        if parameters is not None and tuple(inspect.signature(value).parameters) != parameters:
            raise _moved(f"{dotted}{parameters}", version)
    for name in GUARDED:
        _resolve(module, f"TensorFlowTrainer.{name}", version)
    check_features(keras if keras is not None else importlib.import_module("keras"), module, version)
    return f"keras {version}: fit fixed for MultiWorkerMirroredStrategy"


def prepare_keras3() -> str:
    """Installs the fixes and refusals into Keras 3 now if it is imported, else when it is (once).

    ``tfdist.build_strategy`` calls it for mirrored, multi-worker mirrored and parameter-server strategies.
    Returns what it did, for the log. Does nothing without Keras 3 installed.
    """
    version = keras_version()
    if version is None or parse_version(version) < (3, 0):
        return "no Keras 3 installed"
    keras = sys.modules.get("keras")
    if keras is not None and hasattr(keras, "__version__"):
        return install(keras)
    if not any(isinstance(finder, _AfterKerasImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AfterKerasImport())
    return f"keras {version} installed, not imported: fixed when imported"


class _AfterKerasImport(importlib.abc.MetaPathFinder):
    """Finds ``keras`` through the other finders once, and runs :func:`install` right after it is executed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name != "keras":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_install(module: Any) -> None:
            exec_module(module)
            install(module)

        spec.loader.exec_module = exec_then_install  # type: ignore[method-assign]
        return spec


def install(keras: Any) -> str:
    """Fixes (Keras >= 3.10) and guards Keras 3's TensorFlow trainer, once; returns what it did."""
    version = str(keras.__version__)
    backend = keras.backend.backend()
    if backend != "tensorflow":
        _log.warning("Keras 3 runs on %s here, not on TensorFlow: tf.distribute strategies do not apply.", backend)
        return f"keras {version} on {backend}: nothing to fix"
    module: Any = importlib.import_module(TRAINER)
    trainer = _trainer_class(module, version)
    if getattr(trainer, "_tfdist_keras3", None) is not None:
        return str(trainer._tfdist_keras3)
    if keras3_right(version):
        check_keras3(module, version, keras)
        trainer._maybe_symbolic_build = _symbolic_build_fix(trainer._maybe_symbolic_build, keras.tree)
        fixed = _reduce_fix(module.reduce_per_replica, module._collective_all_reduce_multi_worker, keras.tree)
        module.reduce_per_replica = fixed  # Looked up as a global by _make_function at each build.
        done = f"keras {version}: fit fixed for MultiWorkerMirroredStrategy"
    else:
        done = f"keras {version}: refused under multi-replica strategies (older than 3.10)"
    multi_worker = getattr(module, "_collective_all_reduce_multi_worker", _multi_worker)
    for name in GUARDED:
        setattr(trainer, name, _guarded(getattr(trainer, name), keras, version, multi_worker))
    trainer._tfdist_keras3 = done
    _log.info("Keras 3: %s.", done)
    return done


def _multi_worker(strategy: Any) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and strategy.num_replicas_in_sync > len(
        strategy.extended.worker_devices
    )


def _symbolic_build_fix(original: Callable[..., Any], tree: Any) -> Callable[..., Any]:
    """``_maybe_symbolic_build`` that learns the shapes from the input's element spec, not a reduce of a batch.

    Keras 3's own draws a batch from an extra iterator and reduces it across replicas only for its shapes: the
    reduce fails across workers, and the extra iterator counts as an epoch to inputs that count them (a
    ``TFRecordPipeline`` then trained fit's epoch 0 on its data epoch 1). Where the spec does not give plain
    shapes (a dataset already distributed over several devices), the first replica's local batch does.
    """
    import tensorflow as tf

    def spec_of(iterator: Any) -> Any:
        adapter = getattr(iterator, "data_adapter", None)
        spec = getattr(adapter.get_tf_dataset(), "element_spec", None) if adapter is not None else None
        leaves = tree.flatten(spec) if spec is not None else []
        plain = all(isinstance(v, tf.TypeSpec) and hasattr(v, "shape") and hasattr(v, "dtype") for v in leaves)
        return spec if leaves and plain else None

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if _FITS.running and _FITS.running[-1][0] is self and _FITS.running[-1][1] is None:
            _FITS.running[-1][1] = iterator  # fit builds right after it made its epoch iterator, before evaluating.
        if iterator is not None and getattr(self, "_distribute_strategy", None) is not None:
            strategy = self.distribute_strategy
            data_batch = spec_of(iterator)
            for item in iterator if data_batch is None else ():  # (step, it) in 3.10-3.11, (begin, end, it) after.
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(item[-1]),
                )
                break
        return original(self, iterator=None, data_batch=data_batch)

    return _maybe_symbolic_build


def _reduce_fix(original: Callable[..., Any], multi_worker: Callable[[Any], bool], tree: Any) -> Callable[..., Any]:
    """``reduce_per_replica`` whose mean across workers keeps each value's shape (``axis=None``)."""

    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction in ("auto", "mean") and multi_worker(strategy):  # "auto" is "mean" but on TPUs.
            return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _guarded(method: Callable[..., Any], keras: Any, version: str, multi_worker: Callable[[Any], bool]) -> Any:
    """``fit``, ``evaluate`` or ``predict``, raising :func:`refusal`'s error first when there is one."""
    import functools

    signature = inspect.signature(method)

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        callbacks = signature.bind_partial(self, *args, **kwargs).arguments.get("callbacks")
        problem = refusal(self, method.__name__, keras, version, multi_worker, callbacks)
        if problem is not None:
            raise problem
        if method.__name__ != "fit":
            return method(self, *args, **kwargs)
        _FITS.running.append([self, None])  # fit_epoch_iterator(self) finds the epoch iterator this fit makes.
        try:
            return method(self, *args, **kwargs)
        finally:
            _FITS.running.pop()

    return guarded


def refusal(
    model: Any, call: str, keras: Any, version: str, multi_worker: Callable[[Any], bool], callbacks: Any = None
) -> StrategyError | None:
    """Why Keras 3 cannot run ``model.<call>`` under the model's strategy as it is, or None when it can.

    Across workers, the file-writing callbacks given to ``fit`` are first made to write from the chief only
    (:func:`tfdist._compat.keras3_callbacks.chief_only`).
    """
    import tensorflow as tf

    strategy = model.distribute_strategy
    kind = _PUBLIC_NAMES.get(type(strategy).__name__, type(strategy).__name__)
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return _refused(
            call,
            version,
            kind,
            "Keras 3 has no fit that drives a ClusterCoordinator (nothing in keras/src uses one): its steps would "
            "run on the coordinator, not on the workers",
        )
    if not keras3_right(version) and strategy.num_replicas_in_sync > 1:
        return _refused(call, version, f"{kind} with {strategy.num_replicas_in_sync} replicas", OLD_KERAS)
    if not multi_worker(strategy):
        return None
    steps = int(getattr(model, "steps_per_execution", 1) or 1)
    if steps > 1:
        return _refused(
            call,
            version,
            f"{kind} with steps_per_execution={steps}",
            "Keras 3 runs several steps per call as a tf.while_loop with each step inside a tf.cond, and the "
            "step's collectives fail there across workers (TF: 'You must feed a value for placeholder tensor "
            "...while/cond/Placeholder')",
            fix="compile(steps_per_execution=1), or `from tfdist import keras` (tf-keras)",
        )
    if call != "fit":  # fit's own evaluate gets fit's CallbackList, already made chief-only.
        return None
    accumulation = getattr(getattr(model, "optimizer", None), "gradient_accumulation_steps", None)
    if accumulation:
        return _accumulation_refused(accumulation, version, kind)
    return chief_only(getattr(callbacks, "callbacks", callbacks), strategy, keras, version)


def _accumulation_refused(steps: Any, version: str, kind: str) -> StrategyError:
    fix = (
        f"an optimizer without gradient_accumulation_steps, and tfdist.keras.accumulate_gradients(model, "
        f"steps={steps}), which runs the micro-batches inside one step"
    )
    return StrategyError(
        f"Keras 3 (keras {version}) cannot fit under {kind} with an optimizer's gradient_accumulation_steps="
        f"{steps}: it applies the accumulated gradients once every {steps} steps under a tf.cond, and their "
        "all-reduce fails there across workers (TF: '`merge_call` called while defining a new graph or a "
        f"tf.function'). Fix: {fix}.",
        field="gradient_accumulation_steps",
        value=steps,
        expected="no gradient_accumulation_steps across workers",
        fix=fix,
    )


def _refused(call: str, version: str, where: str, why: str, fix: str | None = None) -> StrategyError:
    fix = fix or "build the model with tf-keras: `from tfdist import keras` (or `import tf_keras as keras`)"
    return StrategyError(
        f"Keras 3 (keras {version}) cannot {call} under {where}: {why}. Fix: {fix}.",
        field="keras",
        value=f"keras {version}",
        expected="keras>=3.10 under MultiWorkerMirroredStrategy or MirroredStrategy, or tf-keras",
        fix=fix,
    )
