"""The Ray engine: each task is an actor of one placement group.

Modules: ``engine`` (:class:`RayEngine`, :class:`RayOptions`) and ``_task`` (one attempt seen from the
driver). Ray itself is imported only when the engine places tasks. Users import these names from
:mod:`tfdist.launch`.
"""

from tfdist.launch.engines.ray.engine import RayEngine, RayOptions

__all__ = ["RayEngine", "RayOptions"]
