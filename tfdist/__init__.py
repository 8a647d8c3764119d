"""tfdist: TensorFlow distributed training made real.

Cluster specs and TF_CONFIG (pure Python), strategy builders, a local
launcher, and (lazily) the tf-keras module as ``tfdist.keras``.

Example:
    >>> import tfdist
    >>> tfdist.ClusterSpec.local(workers=2).num_workers
    2
"""

from tfdist.clean_exit import exit_cleanly
from tfdist.cluster import ClusterSpec, Task
from tfdist.errors import (ClusterSpecError, DataError, EngineError, Error, LaunchError, LaunchFailure, PlanError,
                           RuntimeFailure, ServiceError, StackError, StorageError, StrategyError)
from tfdist.strategy import (StrategyOptions, build_strategy, cluster_coordinator, register_strategy,
                             strategy_names)

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec", "ClusterSpecError", "DataError", "EngineError", "Error", "LaunchError", "LaunchFailure",
    "PlanError", "RuntimeFailure", "ServiceError", "StackError", "StorageError", "StrategyError", "StrategyOptions",
    "Task", "build_strategy", "cluster_coordinator", "exit_cleanly", "register_strategy", "strategy_names",
]
