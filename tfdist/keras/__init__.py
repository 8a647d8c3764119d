"""The Keras tfdist supports: the tf-keras 2 API (``tf_keras``), plus tfdist's helpers for cluster training.

tfdist's helpers are built on tf-keras (Keras 3 fits under MultiWorkerMirroredStrategy once
``tfdist.build_strategy`` fixed it, but has no ParameterServerStrategy ``fit``; docs/keras.md has what
works with each). ``tfdist.keras`` offers the
``tf_keras`` API (``Sequential``, ``layers``, ``callbacks``, ...), so
``from tfdist import keras`` gives the right Keras without setting
``TF_USE_LEGACY_KERAS=1`` (which only works when set before TensorFlow is
imported; ``tfdist-launch`` sets it for every task), and tfdist's own names.

Both sets are imported here by name; for anything else import ``tf_keras``
itself. Importing this module imports tf-keras (and TensorFlow); ``import
tfdist`` does not, since ``tfdist.keras`` loads on first use. Where tf-keras
is not installed (TensorFlow 2.22 has none), this module imports all the same:
the helpers that work with Keras 3 models work, and a tf-keras name or helper
raises an error naming ``pip install 'tf-keras==X.Y.*'`` when used.

Modules: the tf_keras names passed through (``_tf_keras``), callbacks that know the cluster (``cluster_aware``), resuming the input
where a backup left off (``resume``), ``fit`` inputs (``inputs``), elastic epochs
(``elastic``), adaptive class weights (``adaptive``), the evaluator side-car
(``sidecar``), gradient compression (``communication``, ``_compressors``),
gradient accumulation (``accumulation``), local SGD (``averaging``), embedding
layout (``embeddings``), and model parallelism (the ``parallel`` package).

Example:
    >>> from tfdist import keras
    >>> model = keras.Sequential([keras.layers.Dense(1)])
    >>> import tensorflow as tf
    >>> keras.__version__.split(".")[:2] == tf.__version__.split(".")[:2]
    True
    >>> "fit_input" in dir(keras) and "layers" in keras.__all__
    True
"""

from tfdist.keras._tf_keras import (
    Input,
    Model,
    Sequential,
    activations,
    applications,
    backend,
    callbacks,
    constraints,
    datasets,
    dtensor,
    experimental,
    export,
    initializers,
    layers,
    losses,
    metrics,
    mixed_precision,
    models,
    optimizers,
    preprocessing,
    regularizers,
    saving,
    utils,
)
from tfdist.keras._tf_keras import __version__ as __version__
from tfdist.keras.accumulation import accumulate_gradients
from tfdist.keras.adaptive import AdaptiveClassWeights
from tfdist.keras.averaging import local_sgd
from tfdist.keras.cluster_aware import PreemptionSafeBackup, ThroughputLogger, cluster_callbacks
from tfdist.keras.communication import with_communication
from tfdist.keras.elastic import ElasticEpochs, LinearScaling, membership, per_replica_batch, world_size
from tfdist.keras.embeddings import EmbeddingShard, EmbeddingTable, embedding_layout, local_weights
from tfdist.keras.inputs import enable_determinism, fit_input
from tfdist.keras.parallel import (
    ShardingReport,
    mesh_dataset,
    mesh_optimizer,
    pipeline_model,
    replica_batches,
    shard_model,
    sharding_report,
    stage_model,
)
from tfdist.keras.resume import ResumeInput, input_position
from tfdist.keras.sidecar import sidecar_evaluate

__all__ = [
    "AdaptiveClassWeights",
    "ElasticEpochs",
    "EmbeddingShard",
    "EmbeddingTable",
    "Input",
    "LinearScaling",
    "Model",
    "PreemptionSafeBackup",
    "ResumeInput",
    "Sequential",
    "ShardingReport",
    "ThroughputLogger",
    "accumulate_gradients",
    "activations",
    "applications",
    "backend",
    "callbacks",
    "cluster_callbacks",
    "constraints",
    "datasets",
    "dtensor",
    "embedding_layout",
    "enable_determinism",
    "experimental",
    "export",
    "fit_input",
    "initializers",
    "input_position",
    "layers",
    "local_sgd",
    "local_weights",
    "losses",
    "membership",
    "mesh_dataset",
    "mesh_optimizer",
    "metrics",
    "mixed_precision",
    "models",
    "optimizers",
    "per_replica_batch",
    "pipeline_model",
    "preprocessing",
    "regularizers",
    "replica_batches",
    "saving",
    "shard_model",
    "sharding_report",
    "sidecar_evaluate",
    "stage_model",
    "utils",
    "with_communication",
    "world_size",
]
