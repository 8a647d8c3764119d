"""The supervisor: runs one launch on an engine, applies fail-fast, restarts and elastic membership.

Modules: ``runner`` (:func:`run`, :func:`run_config` and the supervisor), ``_group`` (its state: the task
records, the group, how a run ends), ``_elastic`` (the elastic rules), ``_faults`` (fault injection),
``membership`` (the elastic group). Network isolation is the local engine's (``engines._netns``).
"""

from tfdist.launch.supervisor.runner import run, run_config

__all__ = ["run", "run_config"]
