"""Run a whole cluster as local processes, or emit it for Kubernetes (TFJob, JobSet) and Slurm."""

from tfdist.launch.config import KillAt, LaunchConfig
from tfdist.launch.emit.formats import jobset_manifest, slurm_script, tf_configs, tfjob_manifest
from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.engines.registry import register_engine
from tfdist.launch.results import LaunchResult, Outcome, TaskResult
from tfdist.launch.supervisor.runner import run, run_config
from tfdist.launch.server import run_server

__all__ = ["Engine", "KillAt", "LaunchConfig", "LaunchResult", "LocalEngine", "Outcome", "TaskProcess",
           "TaskResult", "jobset_manifest", "register_engine", "run", "run_config", "run_server", "slurm_script",
           "tf_configs", "tfjob_manifest"]
