"""Cluster specs and TF_CONFIG in every form cluster managers write (pure Python, never imports TensorFlow).

Modules: ``spec`` (:class:`ClusterSpec`, TF_CONFIG), ``_parse`` (reading every form), ``address`` (host:port
rules, free ports), ``slurm`` and ``jobset`` (what those managers put in the environment), ``probe`` (TCP
reachability), ``elastic`` (what a task of an elastic group is told, and the epoch boundaries it reports).

Example:
    >>> from tfdist.cluster import ClusterSpec
    >>> ClusterSpec.local(workers=2).num_workers
    2
"""

from tfdist.cluster.address import free_ports
from tfdist.cluster.probe import can_connect, probe_tasks, wait_until_reachable
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

__all__ = [
    "JOB_NAMES",
    "ClusterLike",
    "ClusterSpec",
    "Task",
    "can_connect",
    "current_cluster",
    "free_ports",
    "probe_tasks",
    "resolve_cluster",
    "split_task_name",
    "task_counts",
    "wait_until_reachable",
]
