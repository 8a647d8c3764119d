"""Cluster specs: parse, validate and generate TF_CONFIG. Pure Python, no TensorFlow.

Example:
    >>> from tfdist import ClusterSpec
    >>> spec = ClusterSpec.from_tf_config(
    ...     '{"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}')
    >>> spec.num_workers, spec.is_chief
    (2, False)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.cluster import _parse as _cluster_parse
from tfdist.cluster import address as _address
from tfdist.cluster import jobset as _jobset
from tfdist.cluster import slurm as _slurm
from tfdist.errors import ClusterSpecError, invalid, require_bool, require_int, require_type

__all__ = [
    "JOB_NAMES",
    "ClusterLike",
    "ClusterSpec",
    "Task",
    "current_cluster",
    "resolve_cluster",
    "split_task_name",
    "task_counts",
]

JOB_NAMES = _cluster_parse.JOB_NAMES
TF_CONFIG_VAR = "TF_CONFIG"
# Tasks per job that tfdist builds or launches (a sanity bound; ports run out long before it on one machine).
MAX_TASKS_PER_JOB = 10_000


def task_counts(*, workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False) -> dict[str, int]:
    """Tasks per job of a topology, in launch order (chief, worker, ps, evaluator), empty jobs left out.

    The one rule for local clusters, the launcher's task list and the emitted manifests.

    Example:
        >>> task_counts(workers=2, ps=1, chief=True)
        {'chief': 1, 'worker': 2, 'ps': 1}
    """
    counts = {"chief": int(bool(chief)), "worker": workers, "ps": ps, "evaluator": int(bool(evaluator))}
    return {job: count for job, count in counts.items() if count}


def split_task_name(name: str) -> tuple[str, int]:
    """``'worker:1'`` -> ``('worker', 1)``; ClusterSpecError for anything else.

    Example:
        >>> split_task_name("ps:0")
        ('ps', 0)
    """
    job, _, index = name.partition(":") if isinstance(name, str) else ("", "", "")
    if job not in JOB_NAMES or not (index.isascii() and index.isdigit()):
        raise invalid(ClusterSpecError, "task", name, "'type:index' with a known job, e.g. 'worker:1'")
    return job, int(index)


def resolve_cluster(cluster: ClusterLike = None) -> ClusterSpec | None:
    """An explicit cluster first, the environment second: the spec itself, parsed TF_CONFIG, or :func:`current_cluster`.

    Example:
        >>> resolve_cluster({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}).task.name
        'worker:1'
    """
    if isinstance(cluster, ClusterSpec):
        return cluster
    if cluster is not None:
        return ClusterSpec.from_tf_config(cluster)
    return current_cluster()


def current_cluster(env: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """This process's cluster from ``TF_CONFIG``, or None when it is unset (the process runs alone).

    Example:
        >>> current_cluster(env={}) is None
        True
    """
    env = os.environ if env is None else env
    if not isinstance(env, Mapping):
        raise invalid(ClusterSpecError, "env", env, "a mapping of environment variables, e.g. os.environ")
    return ClusterSpec.from_tf_config(env=env) if env.get(TF_CONFIG_VAR) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One task of a cluster.

    Example:
        >>> Task(type="worker", index=0, address="localhost:2222").name
        'worker:0'
    """

    type: str
    index: int
    address: str

    @property
    def name(self) -> str:
        """``type:index``, the label used in logs and by ``tfdist-launch``."""
        return f"{self.type}:{self.index}"


@dataclasses.dataclass(frozen=True, kw_only=True, repr=False)
class ClusterSpec:
    """A validated TensorFlow cluster and, optionally, the task this process is.

    Args:
      jobs: Job name ('chief', 'worker', 'ps', 'evaluator') -> task addresses,
        as a list (dense) or a mapping of index to address (sparse).
      task_type: The current task's job, or None when the spec describes a
        cluster rather than one of its tasks.
      task_id: The current task's index within its job.
      rpc_layer: Protocol between tasks; None means TensorFlow's default, grpc.
      environment: TF_CONFIG's 'environment' field ('cloud' on Kubeflow/Vertex).

    Example:
        >>> spec = ClusterSpec(jobs={"chief": ["h0:2222"], "worker": ["h1:2222"]},
        ...                    task_type="chief")
        >>> spec.num_workers, spec.is_chief
        (2, True)
    """

    jobs: Mapping[str, Mapping[int, str]]
    task_type: str | None = None
    task_id: int = 0
    rpc_layer: str | None = None
    environment: str | None = None

    def __post_init__(self) -> None:
        jobs = _cluster_parse.parse_cluster(self.jobs)
        frozen = types.MappingProxyType({k: types.MappingProxyType(v) for k, v in jobs.items()})
        object.__setattr__(self, "jobs", frozen)
        if self.task_type is not None:
            task_type = _cluster_parse.normalize_job_name("task_type", self.task_type)
            task_id = _cluster_parse.parse_index("task_id", self.task_id)
            _cluster_parse.check_task(task_type, task_id, jobs)
            object.__setattr__(self, "task_type", task_type)
            object.__setattr__(self, "task_id", task_id)
        for name in ("rpc_layer", "environment"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise invalid(ClusterSpecError, name, value, "a non-empty string or None")

    def __repr__(self) -> str:
        task = f", task_type={self.task_type!r}, task_id={self.task_id}" if self.task_type else ""
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("rpc_layer", "environment") if getattr(self, k))
        return f"ClusterSpec(jobs={self.cluster_dict(dense=False)!r}{task}{extra})"

    def __hash__(self) -> int:
        return hash((self.fingerprint, self.task_type, self.task_id, self.environment))

    # ----------------------------------------------------------------- builders
    @classmethod
    def from_tf_config(
        cls, tf_config: str | Mapping[str, Any] | None = None, *, env: Mapping[str, str] | None = None
    ) -> ClusterSpec:
        """Parses TF_CONFIG as written by TFJob, Vertex AI, Slurm scripts or by hand.

        Args:
          tf_config: JSON text, an already-parsed mapping, or None to read the
            ``TF_CONFIG`` variable of ``env``.
          env: Environment to read when ``tf_config`` is None; default
            ``os.environ``.

        Returns:
          The validated spec, current task included when TF_CONFIG names one.

        Raises:
          ClusterSpecError: For any malformed or inconsistent input.
        """
        if tf_config is None:
            env = os.environ if env is None else env
            if TF_CONFIG_VAR not in env:
                raise invalid(
                    ClusterSpecError,
                    TF_CONFIG_VAR,
                    None,
                    "the environment variable to be set",
                    "Run under a cluster manager or tfdist-launch, or build one with ClusterSpec.local().",
                )
            tf_config = env[TF_CONFIG_VAR]
        return cls(**_cluster_parse.parse_tf_config(tf_config))

    @classmethod
    def local(
        cls, *, workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False, host: str = "127.0.0.1"
    ) -> ClusterSpec:
        """A cluster on one machine, every task on its own free port of ``host``.

        Example:
            >>> ClusterSpec.local(workers=2, ps=1, chief=True).num_workers
            3
        """
        for name, value in (("workers", workers), ("ps", ps)):
            require_int(
                ClusterSpecError,
                name,
                value,
                minimum=0,
                maximum=MAX_TASKS_PER_JOB,
                fix="A local cluster runs every task on this machine.",
            )
        for name, flag in (("chief", chief), ("evaluator", evaluator)):
            require_bool(ClusterSpecError, name, flag)
        require_type(ClusterSpecError, "host", host, str, "a host name or address of this machine")
        if workers == 0 and not chief:
            raise invalid(
                ClusterSpecError, "workers", workers, "at least one training task", "Pass workers >= 1, or chief=True."
            )
        counts = task_counts(workers=workers, ps=ps, chief=chief, evaluator=evaluator)
        ports = iter(_address.free_ports(sum(counts.values()), host))
        jobs = {job: {i: _address.join_address(host, next(ports)) for i in range(n)} for job, n in counts.items()}
        return cls(jobs=jobs)

    @classmethod
    def from_slurm(
        cls, env: Mapping[str, str] | None = None, *, jobs: Mapping[str, int] | None = None, port_base: int = 8888
    ) -> ClusterSpec:
        """The cluster of a Slurm job step, from its ``SLURM_*`` variables.

        Lays tasks out like TensorFlow's ``SlurmClusterResolver`` (sorted hosts,
        ``port_base + i`` per task on a host, job names sorted, filled in
        ``SLURM_PROCID`` order) but needs no GPUs and never changes the
        environment.

        Args:
          env: Variables to read; default ``os.environ``.
          jobs: Job name -> task count; default every task a worker.
          port_base: Port of the first task on each host.
        """
        cluster, task_type, task_id = _slurm.slurm_layout(
            os.environ if env is None else env, jobs=jobs, port_base=port_base
        )
        return cls(jobs=_indexed(cluster), task_type=task_type, task_id=task_id)

    @classmethod
    def from_jobset(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        jobs: Mapping[str, int],
        port: int = 2222,
        subdomain: str | None = None,
    ) -> ClusterSpec:
        """The cluster of a JobSet pod (Kubeflow Trainer v2 / ``tfdist-launch --emit jobset``).

        Reads ``JOBSET_NAME``, ``REPLICATED_JOB_NAME``, ``JOB_INDEX`` (the JobSet
        labels, passed in by the downward API) and ``JOB_COMPLETION_INDEX``;
        task ``i`` of job ``t`` is at ``{jobset}-{t}-0-{i}.{subdomain}:{port}``.

        Args:
          env: Variables to read; default ``os.environ``.
          jobs: Job name -> task count, e.g. ``{"chief": 1, "worker": 2, "ps": 1}``.
          port: The port every task listens on.
          subdomain: The JobSet's ``spec.network.subdomain``; default its name.

        Example:
            >>> env = {"JOBSET_NAME": "rec", "REPLICATED_JOB_NAME": "ps", "JOB_INDEX": "0", "JOB_COMPLETION_INDEX": "0"}
            >>> ClusterSpec.from_jobset(env, jobs={"chief": 1, "worker": 2, "ps": 1}).task.address
            'rec-ps-0-0.rec:2222'
        """
        if not isinstance(jobs, Mapping) or not jobs:
            raise invalid(ClusterSpecError, "jobs", jobs, "a mapping of job name to task count, e.g. {'worker': 2}")
        for job, count in jobs.items():
            require_int(ClusterSpecError, f"jobs[{job!r}]", count, minimum=1)
        require_int(ClusterSpecError, "port", port, minimum=1, maximum=65535)
        cluster, task_type, task_id = _jobset.jobset_layout(
            os.environ if env is None else env, jobs=jobs, port=port, subdomain=subdomain
        )
        return cls(jobs=_indexed(cluster), task_type=task_type, task_id=task_id)

    def with_task(self, task_type: str, task_id: int = 0) -> ClusterSpec:
        """The same cluster seen from another task."""
        return dataclasses.replace(self, task_type=task_type, task_id=task_id)

    # -------------------------------------------------------------- properties
    @property
    def num_workers(self) -> int:
        """Tasks that train: the chief plus the workers."""
        return len(self.jobs.get("chief", ())) + len(self.jobs.get("worker", ()))

    @property
    def num_ps(self) -> int:
        """Parameter-server tasks."""
        return len(self.jobs.get("ps", ()))

    @property
    def has_chief(self) -> bool:
        """True when the cluster has a 'chief' job."""
        return bool(self.jobs.get("chief"))

    @property
    def leader(self) -> Task | None:
        """The task that leads training: the chief, else the lowest-index worker; None without either.

        TensorFlow's coordination service and Keras's "chief" (who writes checkpoints and summaries) both
        pick this task.

        Example:
            >>> ClusterSpec(jobs={"worker": {3: "a:1", 1: "b:1"}}).leader.name
            'worker:1'
        """
        job = "chief" if self.has_chief else "worker"
        if not self.jobs.get(job):
            return None
        index = min(self.jobs[job])
        return Task(type=job, index=index, address=self.jobs[job][index])

    def training_tasks(self) -> list[Task]:
        """The tasks that train, in TensorFlow's multi-worker order: the chief first, then workers by index."""
        return [task for task in self.tasks() if task.type in ("chief", "worker")]

    @property
    def is_chief(self) -> bool:
        """True for the chief, or for the lowest worker of a cluster without a chief (see :attr:`leader`)."""
        leader = self.leader
        return leader is not None and (self.task_type, self.task_id) == (leader.type, leader.index)

    @property
    def task(self) -> Task | None:
        """The current task, or None when the spec names none."""
        if self.task_type is None:
            return None
        address = self.jobs.get(self.task_type, {}).get(self.task_id, "")
        return Task(type=self.task_type, index=self.task_id, address=address)

    @property
    def fingerprint(self) -> str:
        """12 hex digits, equal on every task of one cluster.

        Covers the training cluster and rpc_layer, not the current task nor
        the evaluator (which managers leave out of TF_CONFIG). Log it on every
        task: a differing value means mismatched TF_CONFIGs.
        """
        canonical = json.dumps(
            [self.cluster_dict(include_evaluator=False, dense=False), self.rpc_layer or "grpc"], sort_keys=True
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def tasks(self) -> list[Task]:
        """Every task, chief first, then workers, ps, evaluator, by index."""
        return [
            Task(type=job, index=index, address=address)
            for job, tasks in self.jobs.items()
            for index, address in tasks.items()
        ]

    def cluster_dict(self, *, include_evaluator: bool = True, dense: bool = True) -> dict[str, Any]:
        """The ``cluster`` part of TF_CONFIG (lists where indices are 0..n-1)."""
        result: dict[str, Any] = {}
        for job, tasks in self.jobs.items():
            if job == "evaluator" and not include_evaluator:
                continue
            is_dense = dense and list(tasks) == list(range(len(tasks)))
            result[job] = list(tasks.values()) if is_dense else {str(i): a for i, a in tasks.items()}
        return result

    def to_tf_config(
        self, task_type: str | None = None, task_id: int | None = None, *, include_evaluator: bool = False
    ) -> dict[str, Any]:
        """TF_CONFIG for one task, as a dict (``json.dumps`` it for the variable).

        Args:
          task_type: The task's job; default the spec's current task.
          task_id: The task's index; default the spec's current index.
          include_evaluator: Keep the evaluator in ``cluster``. Off by default,
            as TFJob and Vertex AI write it.
        """
        if task_type is None:
            if self.task_type is None:
                raise invalid(
                    ClusterSpecError,
                    "task_type",
                    None,
                    "a job name of this cluster",
                    "Pass task_type=..., task_id=... or use spec.with_task(...) first.",
                )
            task_type = self.task_type
            task_id = self.task_id if task_id is None else task_id
        spec = self.with_task(task_type, 0 if task_id is None else task_id)
        config: dict[str, Any] = {
            "cluster": spec.cluster_dict(include_evaluator=include_evaluator),
            "task": {"type": spec.task_type, "index": spec.task_id},
        }
        if self.rpc_layer is not None:
            config["rpc_layer"] = self.rpc_layer
        if self.environment is not None:
            config["environment"] = self.environment
        return config

    def describe(self) -> str:
        """One line for logs: role, jobs and fingerprint."""
        jobs = ", ".join(f"{job}={len(tasks)}" for job, tasks in self.jobs.items())
        role = self.task.name if self.task else "no task"
        chief = " (chief)" if self.is_chief else ""
        return f"{role}{chief}; cluster {jobs}; fingerprint {self.fingerprint}"


def _indexed(jobs: Mapping[str, Sequence[str]]) -> dict[str, dict[int, str]]:
    """Job -> task addresses in index order, as ``{index: address}`` (what a ClusterSpec holds)."""
    return {job: dict(enumerate(addresses)) for job, addresses in jobs.items()}


# What functions taking a cluster accept: a spec, TF_CONFIG text or mapping, or None for the environment's.
ClusterLike = ClusterSpec | str | Mapping[str, Any] | None
