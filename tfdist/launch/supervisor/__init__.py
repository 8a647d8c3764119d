"""The supervisor: runs one launch on an engine, applies fail-fast, restarts and elastic membership.

Modules: ``runner`` (:func:`run`, :func:`run_config`), ``_elastic`` (the elastic rules), ``membership`` (the
elastic group), ``_netns`` (network isolation).
"""

from tfdist.launch.supervisor.runner import run, run_config

__all__ = ["run", "run_config"]
