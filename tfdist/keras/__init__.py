"""The Keras tfdist supports: the tf-keras 2 API (``tf_keras``), plus tfdist's helpers for cluster training.

Keras 3 fails ``fit`` under MultiWorkerMirroredStrategy and does not support
ParameterServerStrategy ``fit``. ``tfdist.keras`` therefore offers the
``tf_keras`` API (``Sequential``, ``layers``, ``callbacks``, ...), so
``from tfdist import keras`` gives the right Keras without setting
``TF_USE_LEGACY_KERAS=1`` (which only works when set before TensorFlow is
imported; ``tfdist-launch`` sets it for every task), and tfdist's own names.

Both sets are listed explicitly (:data:`KERAS_NAMES`, :data:`TFDIST_NAMES`, and
``__all__``/``dir()`` show them) and load on first use, so importing this
module imports neither TensorFlow nor tf-keras.

Example:
    >>> from tfdist import keras
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> import tensorflow as tf
    >>> keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2]
    True
    >>> "fit_input" in dir(keras) and "layers" in keras.__all__
    True
"""

from __future__ import annotations

import importlib
from typing import Any

# tfdist's helpers: name -> the module defining it.
TFDIST_NAMES = {
    "fit_input": "tfdist.keras.inputs",
    "enable_determinism": "tfdist.keras.inputs",
    "cluster_callbacks": "tfdist.keras.cluster_aware",
    "ThroughputLogger": "tfdist.keras.cluster_aware",
    "PreemptionSafeBackup": "tfdist.keras.cluster_aware",
    "ResumeInput": "tfdist.keras.resume",
    "input_position": "tfdist.keras.resume",
    "sidecar_evaluate": "tfdist.keras.sidecar",
    "with_communication": "tfdist.keras.communication",
    "accumulate_gradients": "tfdist.keras.accumulation",
    "local_sgd": "tfdist.keras.averaging",
    "embedding_layout": "tfdist.keras.embeddings",
    "local_weights": "tfdist.keras.embeddings",
    "EmbeddingShard": "tfdist.keras.embeddings",
    "EmbeddingTable": "tfdist.keras.embeddings",
    "AdaptiveClassWeights": "tfdist.keras.adaptive",
    "ElasticEpochs": "tfdist.keras.elastic",
    "LinearScaling": "tfdist.keras.elastic",
    "per_replica_batch": "tfdist.keras.elastic",
    "world_size": "tfdist.keras.elastic",
    "membership": "tfdist.keras.elastic",
    "shard_model": "tfdist.keras.tensor_parallel",
    "mesh_optimizer": "tfdist.keras.tensor_parallel",
    "sharding_report": "tfdist.keras.tensor_parallel",
    "ShardingReport": "tfdist.keras.tensor_parallel",
    "mesh_dataset": "tfdist.keras.mesh_input",
    "replica_batches": "tfdist.keras.mesh_input",
    "pipeline_model": "tfdist.keras.pipeline",
}
# The public tf_keras API, passed through unchanged.
KERAS_NAMES = (
    "Input",
    "Model",
    "Sequential",
    "activations",
    "applications",
    "backend",
    "callbacks",
    "constraints",
    "datasets",
    "dtensor",
    "experimental",
    "export",
    "initializers",
    "layers",
    "losses",
    "metrics",
    "mixed_precision",
    "models",
    "optimizers",
    "preprocessing",
    "regularizers",
    "saving",
    "utils",
    "__version__",
)

__all__ = sorted(TFDIST_NAMES) + [name for name in KERAS_NAMES if not name.startswith("_")]


def __getattr__(name: str) -> Any:
    if name in TFDIST_NAMES:
        value = getattr(importlib.import_module(TFDIST_NAMES[name]), name)
    elif name in KERAS_NAMES:
        value = getattr(importlib.import_module("tf_keras"), name)
    else:
        raise AttributeError(
            f"module 'tfdist.keras' has no attribute {name!r}; it offers tfdist's "
            f"{sorted(TFDIST_NAMES)} and tf_keras's {list(KERAS_NAMES)}. For anything else "
            "import tf_keras itself."
        )
    globals()[name] = value  # Later lookups skip __getattr__.
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "KERAS_NAMES", "TFDIST_NAMES"])
