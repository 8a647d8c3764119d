"""Engines place tasks and report their exits: local processes, Ray, Spark; a registry picks one by name.

Modules: ``base`` (the :class:`Engine` interface), ``local`` (the local engine, with ``_process``, ``_reaper``,
``_netns`` and ``_ports``), ``registry``, and what the engines that run tasks elsewhere share: ``_host`` (the
:class:`~tfdist.launch.engines._host.TaskHost` that runs one task's program where it was placed) and
``_polled`` (an attempt seen from the driver). The packages ``ray`` and ``spark`` import Ray and pyspark only
when they place tasks. Users import these names from :mod:`tfdist.launch`.
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
