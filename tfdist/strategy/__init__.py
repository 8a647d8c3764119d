"""Strategies from a registry: one-device, mirrored, MultiWorkerMirrored, ParameterServer and ``auto``.

Modules: ``builders`` (:class:`StrategyOptions`, the registry and the built-in builders) and ``resolver``
(TensorFlow cluster resolvers from a :class:`tfdist.ClusterSpec` or Slurm).
"""

from tfdist.strategy.builders import (
    StrategyOptions,
    build_strategy,
    choose_kind,
    cluster_coordinator,
    communication_options,
    register_strategy,
    resolve_options,
    strategy_names,
    variable_partitioner,
)
from tfdist.strategy.resolver import cluster_resolver, slurm_cluster_resolver

__all__ = [
    "StrategyOptions",
    "build_strategy",
    "choose_kind",
    "cluster_coordinator",
    "cluster_resolver",
    "communication_options",
    "register_strategy",
    "resolve_options",
    "slurm_cluster_resolver",
    "strategy_names",
    "variable_partitioner",
]
