"""tf-keras as an optional install: its module where it imports, and what stands for it where it does not.

TensorFlow 2.22 installs Keras 3 only (no tf-keras 2.22 exists), and a Keras 3 user needs no tf-keras for
``fit_input``, ``PreemptionSafeBackup``, ``ElasticEpochs``, ``LinearScaling``, ``with_communication`` and
``accumulate_gradients``. So ``tfdist.keras`` imports without tf-keras: :func:`installed_tf_keras` tells
whether it imports, :func:`tf_keras_module` is the module or the :class:`~tfdist.errors.StackError` naming
the install (``pip install 'tf-keras==X.Y.*'``, TensorFlow's minor), :class:`TfKerasMissing` stands for a
tf_keras name (``tfdist.keras.Sequential``) and raises that error when used, and :class:`KerasCallback` is
what tfdist's callbacks derive from there: the calls Keras 3's ``fit`` makes on any callback.

Example:
    >>> from tfdist._compat import keras_optional
    >>> layers = keras_optional.TfKerasMissing("layers")
    >>> layers
    <tf_keras.layers: tf-keras is not importable here>
    >>> layers.Dense(1)
    Traceback (most recent call last):
    ...
    tfdist.errors.StackError: tfdist.keras.layers needs tf-keras, which is not importable here (...). Install it: \
pip install 'tf-keras==2...'. With Keras 3 models ...
"""

from __future__ import annotations

from typing import Any, NoReturn

from tfdist.errors import StackError
from tfdist.runtime.versions import installed_version, tf_keras_pin

KERAS3_HELPERS = (
    "fit_input, PreemptionSafeBackup, ElasticEpochs, LinearScaling, with_communication and accumulate_gradients"
)


def installed_tf_keras() -> Any:
    """The ``tf_keras`` module, or None where it cannot be imported (not installed, as with TensorFlow 2.22)."""
    try:
        import tf_keras
    except ImportError:
        return None
    return tf_keras


def tf_keras_module(needed_by: str) -> Any:
    """The ``tf_keras`` module; where it cannot be imported, the StackError that names ``needed_by`` (the name of
    ``tfdist.keras`` in use, e.g. ``"cluster_callbacks"``) and the install."""
    module = installed_tf_keras()
    if module is None:
        raise tf_keras_missing(needed_by)
    return module


def tf_keras_missing(needed_by: str) -> StackError:
    """The StackError of ``needed_by`` (the name of ``tfdist.keras`` in use, built on tf-keras) where tf-keras
    does not import."""
    try:
        import tf_keras  # noqa: F401 - only why it fails is wanted.

        reason = "it imports now"
    except ImportError as err:
        reason = str(err)
    pin = tf_keras_pin()
    return StackError(
        f"tfdist.keras.{needed_by} needs tf-keras, which is not importable here ({reason}; TensorFlow "
        f"{installed_version('tensorflow')}). Install it: pip install '{pin}'. With Keras 3 models (`import keras`) "
        f"tfdist.keras's {KERAS3_HELPERS} need no tf-keras.",
        field="tf_keras",
        value=None,
        expected=pin,
        fix=f"pip install '{pin}'",
    )


class TfKerasMissing:
    """Stands for the tf_keras name ``name`` where tf-keras does not import: calling it, reading its attributes,
    subclassing it or checking an instance against it raises :func:`tf_keras_missing`'s error."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise tf_keras_missing(vars(self).get("name", ""))

    __call__ = _fail
    __instancecheck__ = _fail
    __subclasscheck__ = _fail
    __mro_entries__ = _fail

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)  # What Python's own protocols (copy, pickle, inspect) look for.
        self._fail()

    def __repr__(self) -> str:
        return f"<tf_keras.{self.name}: tf-keras is not importable here>"


class KerasCallback:
    """What Keras' ``fit`` calls on a callback: ``set_model``, ``set_params`` and the ``on_*`` hooks (none do
    anything here). tfdist's callbacks derive from it where tf-keras does not import, and from
    ``tf_keras.callbacks.Callback`` where it does; Keras 3's ``fit`` calls either alike."""

    def __init__(self) -> None:
        self.model: Any = None
        self.params: Any = None

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: Any) -> None:
        self.params = params

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.on_batch_end(batch, logs=logs)

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        """A hook this class does nothing in (a subclass overrides the ones it needs)."""

    on_batch_begin = on_batch_end = on_epoch_begin = on_epoch_end = _nothing
    on_train_begin = on_train_end = on_test_begin = on_test_end = on_predict_begin = on_predict_end = _nothing
    on_test_batch_begin = on_test_batch_end = on_predict_batch_begin = on_predict_batch_end = _nothing
