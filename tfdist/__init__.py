"""tfdist: TensorFlow distributed training made real.

Cluster specs and TF_CONFIG (pure Python), strategy builders, the error
hierarchy, and the public subpackages ``tfdist.cluster``, ``tfdist.strategy``,
``tfdist.comm``, ``tfdist.data``, ``tfdist.launch``, ``tfdist.keras``,
``tfdist.parallel``, ``tfdist.plan``, ``tfdist.runtime`` and ``tfdist.testing``, loaded on first
use: ``import tfdist`` does not import TensorFlow. Each re-exports its public
names; the modules inside them are tfdist's own.

Example:
    >>> import tfdist
    >>> tfdist.ClusterSpec.local(workers=2).num_workers
    2
    >>> tfdist.keras.__name__
    'tfdist.keras'
    >>> tfdist.build_mesh is tfdist.parallel.build_mesh
    True
"""

import importlib
from typing import Any

from tfdist.cluster.spec import ClusterSpec, Task, current_cluster, resolve_cluster
from tfdist.errors import (
    ClusterSpecError,
    DataError,
    EngineError,
    Error,
    LaunchError,
    LaunchFailure,
    PlanError,
    RuntimeFailure,
    ServiceError,
    StackError,
    StorageError,
    StrategyError,
)
from tfdist.runtime import logs as _logs  # noqa: F401  (importing it installs the TFDIST_LOG_LEVEL default)
from tfdist.runtime.clean_exit import exit_cleanly
from tfdist.strategy.builders import (
    StrategyOptions,
    build_strategy,
    cluster_coordinator,
    register_strategy,
    strategy_names,
)

__version__ = "0.1.0"

# Subpackages loaded on first attribute access (each may import TensorFlow when used).
_LAZY_MODULES = ("cluster", "comm", "data", "keras", "launch", "parallel", "plan", "runtime", "strategy", "testing")
# Entry points whose modules import TensorFlow, served from their subpackage on first access: the mesh beside
# the strategy (``tfdist.build_mesh`` is ``tfdist.parallel.build_mesh``).
_LAZY_NAMES = {"build_mesh": "tfdist.parallel"}

__all__ = [
    "ClusterSpec",
    "ClusterSpecError",
    "DataError",
    "EngineError",
    "Error",
    "LaunchError",
    "LaunchFailure",
    "PlanError",
    "RuntimeFailure",
    "ServiceError",
    "StackError",
    "StorageError",
    "StrategyError",
    "StrategyOptions",
    "Task",
    "build_mesh",
    "build_strategy",
    "cluster_coordinator",
    "current_cluster",
    "exit_cleanly",
    "register_strategy",
    "resolve_cluster",
    "strategy_names",
    *_LAZY_MODULES,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"tfdist.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
