"""The Keras tfdist supports: tf-keras 2.17 (legacy Keras 2), whatever ``tf.keras`` is.

Keras 3 fails ``fit`` under MultiWorkerMirroredStrategy and does not support
ParameterServerStrategy ``fit``. ``tfdist.keras`` is the ``tf_keras`` module,
so ``from tfdist import keras`` gives the right Keras without setting
``TF_USE_LEGACY_KERAS=1`` (which only works when set before TensorFlow is
imported; ``tfdist-launch`` sets it for every task).

Example:
    >>> from tfdist import keras
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> keras.__version__.startswith("2.17")
    True
"""

from typing import Any


def __getattr__(name: str) -> Any:  # Re-exports tf_keras lazily: no import-time side effects.
    import tf_keras

    return getattr(tf_keras, name)
