"""Cluster specs and TF_CONFIG in every form cluster managers write (pure Python, never imports TensorFlow).

Modules: ``spec`` (:class:`ClusterSpec`, TF_CONFIG), ``_parse`` (reading every form), ``address`` (host:port
rules, free ports), ``slurm`` and ``jobset`` (what those managers put in the environment), ``probe`` (TCP
reachability, and why a task does not answer), ``trainable`` (whether a cluster can train: the one rule of
``build_strategy`` and ``tfdist doctor``), ``mesh_shape`` (a DTensor mesh's shape and each process's
``DTENSOR_*``), ``elastic`` (what a task of an elastic group is told, and the epoch boundaries it reports).

Example:
    >>> from tfdist.cluster import ClusterSpec
    >>> ClusterSpec.local(workers=2).num_workers
    2
"""

from tfdist.cluster.address import free_ports
from tfdist.cluster.mesh_shape import DTENSOR_SETTINGS, MeshShape, dtensor_variables
from tfdist.cluster.probe import (
    Reachability,
    can_connect,
    probe_address,
    probe_reachability,
    probe_tasks,
    wait_until_reachable,
)
from tfdist.cluster.spec import (
    JOB_NAMES,
    ClusterLike,
    ClusterSpec,
    Task,
    current_cluster,
    resolve_cluster,
    split_task_name,
    task_counts,
)
from tfdist.cluster.trainable import Trainability, check_trainable, cluster_kind

__all__ = [
    "DTENSOR_SETTINGS",
    "JOB_NAMES",
    "ClusterLike",
    "ClusterSpec",
    "MeshShape",
    "Reachability",
    "Task",
    "Trainability",
    "can_connect",
    "check_trainable",
    "cluster_kind",
    "current_cluster",
    "dtensor_variables",
    "free_ports",
    "probe_address",
    "probe_reachability",
    "probe_tasks",
    "resolve_cluster",
    "split_task_name",
    "task_counts",
    "wait_until_reachable",
]
