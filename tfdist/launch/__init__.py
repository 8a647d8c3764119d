"""Run a whole cluster as local processes (or on Ray), or emit it for Kubernetes (TFJob, JobSet) and Slurm.

Example:
    >>> from tfdist.launch import LaunchConfig, tf_configs
    >>> config = LaunchConfig(command=("python", "train.py"), workers=2)
    >>> sorted(tf_configs(config, hosts=["a", "b"]))
    ['worker:0', 'worker:1']
"""

from tfdist.launch.config import Elastic, Faults, LaunchConfig, Supervision, Topology
from tfdist.launch.emit import jobset_manifest, slurm_script, tf_configs, tfjob_manifest, to_yaml, validate_tfjob
from tfdist.launch.engines import (
    Engine,
    LocalEngine,
    RayEngine,
    RayOptions,
    SparkEngine,
    SparkOptions,
    TaskProcess,
    register_engine,
)
from tfdist.launch.events import KillAt, LoseAt, ReturnAt
from tfdist.launch.functions import FunctionRun, run_function
from tfdist.launch.inspection import Inspection
from tfdist.launch.network import Link, Network
from tfdist.launch.results import LaunchResult, Outcome, TaskResult
from tfdist.launch.server import run_server
from tfdist.launch.supervisor import run, run_config

__all__ = [
    "Elastic",
    "Engine",
    "Faults",
    "FunctionRun",
    "Inspection",
    "KillAt",
    "LaunchConfig",
    "LaunchResult",
    "Link",
    "LocalEngine",
    "LoseAt",
    "Network",
    "Outcome",
    "RayEngine",
    "RayOptions",
    "ReturnAt",
    "SparkEngine",
    "SparkOptions",
    "Supervision",
    "TaskProcess",
    "TaskResult",
    "Topology",
    "jobset_manifest",
    "register_engine",
    "run",
    "run_config",
    "run_function",
    "run_server",
    "slurm_script",
    "tf_configs",
    "tfjob_manifest",
    "to_yaml",
    "validate_tfjob",
]
