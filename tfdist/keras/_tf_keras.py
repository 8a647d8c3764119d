"""The tf_keras names ``tfdist.keras`` passes through: tf_keras's own objects where tf-keras imports, else stand-ins.

Where tf-keras does not import (TensorFlow 2.22 installs Keras 3 only), each name is a
:class:`~tfdist._compat.TfKerasMissing`: ``tfdist.keras`` still imports, with the helpers that work with Keras 3
models, and using a tf-keras name (``keras.Sequential(...)``, ``keras.layers.Dense``) raises the StackError
that names the install.

Example:
    >>> import tf_keras
    >>> from tfdist.keras import _tf_keras
    >>> _tf_keras.Sequential is tf_keras.Sequential and _tf_keras.__version__ == tf_keras.__version__
    True
"""

from __future__ import annotations

from typing import Any

from tfdist import _compat

_MODULE = _compat.installed_tf_keras()


def _name(name: str) -> Any:
    return getattr(_MODULE, name) if _MODULE is not None else _compat.TfKerasMissing(name)


Input = _name("Input")
Model = _name("Model")
Sequential = _name("Sequential")
activations = _name("activations")
applications = _name("applications")
backend = _name("backend")
callbacks = _name("callbacks")
constraints = _name("constraints")
datasets = _name("datasets")
dtensor = _name("dtensor")
experimental = _name("experimental")
export = _name("export")
initializers = _name("initializers")
layers = _name("layers")
losses = _name("losses")
metrics = _name("metrics")
mixed_precision = _name("mixed_precision")
models = _name("models")
optimizers = _name("optimizers")
preprocessing = _name("preprocessing")
regularizers = _name("regularizers")
saving = _name("saving")
utils = _name("utils")
__version__ = _name("__version__")
