"""Engines place tasks and report their exits: local processes, Ray; a registry picks one by name.

Modules: ``base`` (the :class:`Engine` interface), ``local`` (the local engine), ``registry``, ``ray``
(which imports Ray itself only when it places tasks). Users import these names from :mod:`tfdist.launch`.
"""

from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.engines.ray import RayEngine, RayOptions
from tfdist.launch.engines.registry import register_engine

__all__ = ["Engine", "LocalEngine", "RayEngine", "RayOptions", "TaskProcess", "register_engine"]
