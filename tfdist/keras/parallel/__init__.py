"""Model parallelism for tf-keras: tensor parallelism on a DTensor mesh, and pipeline stages on worker tasks.

Modules: ``tensor`` (:func:`shard_model`, :func:`mesh_optimizer`, :func:`sharding_report`), ``mesh_input``
(``fit``'s input on a mesh: :func:`mesh_dataset`, :func:`replica_batches`) and ``stages`` (:func:`stage_model`,
consecutive layers on worker tasks with micro-batches). The meshes and stages themselves are
:mod:`tfdist.parallel`'s. Users import these names from :mod:`tfdist.keras`.
"""

from tfdist.keras.parallel.mesh_input import mesh_dataset, replica_batches
from tfdist.keras.parallel.stages import pipeline_model, stage_model
from tfdist.keras.parallel.tensor import ShardingReport, mesh_optimizer, shard_model, sharding_report

__all__ = [
    "ShardingReport",
    "mesh_dataset",
    "mesh_optimizer",
    "pipeline_model",
    "replica_batches",
    "shard_model",
    "sharding_report",
    "stage_model",
]
