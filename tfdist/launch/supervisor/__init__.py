"""The supervisor: runs one launch on an engine, applies fail-fast, restarts and elastic membership.

Modules: ``runner`` (:func:`run` and :func:`run_config`: builds the supervisor and runs it to the end),
``_supervisor`` (the :class:`Supervisor`, the only one to change the run's state), ``_group`` (that state:
the task records, the group, how a run ends), ``_elastic`` (the elastic rules), ``_faults`` (fault
injection), ``_stall`` (the stall inspector), ``membership`` (the elastic group). Network isolation is the local engine's (``engines._netns``).
"""

from tfdist.launch.supervisor.runner import run, run_config

__all__ = ["run", "run_config"]
