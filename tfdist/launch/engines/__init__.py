"""Engines place tasks and report their exits: local processes, Ray; a registry picks one by name.

Modules: ``base`` (the :class:`Engine` interface), ``local`` (the local engine), ``registry``, ``ray``.
"""

from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.engines.registry import ENGINES, engine_for, register_engine

__all__ = ["ENGINES", "Engine", "LocalEngine", "TaskProcess", "engine_for", "register_engine"]
