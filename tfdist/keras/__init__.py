"""The Keras tfdist supports: tf-keras (legacy Keras 2, the same minor as TensorFlow), whatever ``tf.keras`` is, plus tfdist's helpers.

Keras 3 fails ``fit`` under MultiWorkerMirroredStrategy and does not support
ParameterServerStrategy ``fit``. ``tfdist.keras`` is the ``tf_keras`` module,
so ``from tfdist import keras`` gives the right Keras without setting
``TF_USE_LEGACY_KERAS=1`` (which only works when set before TensorFlow is
imported; ``tfdist-launch`` sets it for every task). tfdist's own names
(``fit_input``, ``cluster_callbacks``, ``ThroughputLogger``,
``sidecar_evaluate``, ``enable_determinism``, ``with_communication``,
``accumulate_gradients``, ``embedding_layout``, ``local_weights``, ``AdaptiveClassWeights``) are added on top, loaded lazily.

Example:
    >>> from tfdist import keras
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> import tensorflow as tf
    >>> keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2]
    True
"""

import importlib
from typing import Any

_TFDIST_NAMES = {
    "fit_input": "tfdist.keras.inputs",
    "cluster_callbacks": "tfdist.keras.cluster_callbacks",
    "ThroughputLogger": "tfdist.keras.cluster_callbacks",
    "PreemptionSafeBackup": "tfdist.keras.cluster_callbacks",
    "sidecar_evaluate": "tfdist.keras.sidecar",
    "enable_determinism": "tfdist.keras.inputs",
    "with_communication": "tfdist.keras.communication",
    "accumulate_gradients": "tfdist.keras.accumulation",
    "embedding_layout": "tfdist.keras.embeddings",
    "local_weights": "tfdist.keras.embeddings",
    "AdaptiveClassWeights": "tfdist.keras.adaptive",
}


def __getattr__(name: str) -> Any:  # Lazy re-exports: no import-time side effects.
    if name in _TFDIST_NAMES:
        return getattr(importlib.import_module(_TFDIST_NAMES[name]), name)
    import tf_keras

    return getattr(tf_keras, name)
