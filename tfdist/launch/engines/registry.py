"""The engine registry: engine names (``tfdist-launch --engine NAME``) to factories.

Kept apart from :mod:`tfdist.launch.engines.base` (the interface), so an engine module
imports the interface and the registry imports the engines: the arrows point
one way. The Ray and Spark engines load on first use.

Example:
    >>> engine_for("local").name
    'local'
"""

from __future__ import annotations

from collections.abc import Callable

from tfdist._names import describe_choices
from tfdist.errors import LaunchError, invalid
from tfdist.launch.engines.base import Engine
from tfdist.launch.engines.local import LocalEngine

__all__ = ["register_engine"]


def _ray_engine() -> Engine:
    from tfdist.launch.engines.ray.engine import RayEngine  # Ray itself is imported only when the engine places tasks.

    return RayEngine()


def _spark_engine() -> Engine:
    from tfdist.launch.engines.spark.engine import SparkEngine  # pyspark itself is imported only when tasks are placed.

    return SparkEngine()


ENGINES: dict[str, Callable[[], Engine]] = {"local": LocalEngine, "ray": _ray_engine, "spark": _spark_engine}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    """Makes ``factory`` available as engine ``name`` (e.g. ``tfdist-launch --engine NAME``)."""
    ENGINES[name] = factory


def engine_for(name: str) -> Engine:
    """A new engine registered as ``name``."""
    if not isinstance(name, str) or name not in ENGINES:
        raise invalid(LaunchError, "engine", name, describe_choices(str(name), sorted(ENGINES)))
    return ENGINES[name]()
