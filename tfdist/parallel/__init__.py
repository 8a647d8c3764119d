"""Model parallelism on a DTensor mesh: build this process's mesh, and choose which weights to split.

Modules: ``mesh`` (:func:`build_mesh`, from the launcher's ``--mesh`` environment or alone on one machine),
``layouts`` (the Megatron-style rules ``tfdist.keras.shard_model`` applies, pure Python) and ``stages``
(pipeline stages: :func:`connect_stages` to the workers, :func:`split_layers` by balanced cost). The mesh's
shape and each process's ``DTENSOR_*`` variables are :mod:`tfdist.cluster.mesh_shape`.
"""

from tfdist.parallel.layouts import POLICIES, Weight, choose_layouts
from tfdist.parallel.mesh import build_mesh, mesh_processes
from tfdist.parallel.stages import connect_stages, split_layers

__all__ = ["POLICIES", "Weight", "build_mesh", "choose_layouts", "connect_stages", "mesh_processes", "split_layers"]
