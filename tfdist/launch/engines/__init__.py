"""Engines place tasks and report their exits: local processes, Ray, Spark; a registry picks one by name.

Modules: ``base`` (the :class:`Engine` interface), ``local`` (the local engine), ``registry``, ``ray``
and ``spark`` (which import Ray and pyspark only when they place tasks). Users import these names from :mod:`tfdist.launch`.
"""

from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.engines.ray import RayEngine, RayOptions
from tfdist.launch.engines.registry import register_engine
from tfdist.launch.engines.spark import SparkEngine, SparkOptions

__all__ = [
    "Engine",
    "LocalEngine",
    "RayEngine",
    "RayOptions",
    "SparkEngine",
    "SparkOptions",
    "TaskProcess",
    "register_engine",
]
