"""Per-worker sharding decisions: which policy, and which files each worker reads.

Pure Python: the same file list gives the same plan on every worker.

Example:
    >>> from tfdist.data import plan_shards
    >>> plan = plan_shards([("a", 100), ("b", 100), ("c", 90), ("d", 110)], num_workers=2)
    >>> plan.policy, plan.files_for(0), plan.files_for(1)
    ('file', ('c', 'd'), ('a', 'b'))
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from tfdist._names import describe_choices
from tfdist.cluster.spec import MAX_TASKS_PER_JOB
from tfdist.errors import DataError, invalid, require_int

__all__ = ["ShardPlan", "plan_shards"]

SHARD_POLICIES = ("auto", "file", "data", "hash", "off")
# 'auto' shards by file when the per-worker byte load is within this factor of the mean.
_BALANCE_TOLERANCE = 1.10


def _balance_files(files: Sequence[tuple[str, int]], num_workers: int) -> list[list[str]]:
    """Assigns files to workers so bytes are balanced: largest file to the lightest worker.

    Ties break by file name and worker index, so every worker computes the same
    plan. Each worker's files are returned sorted by name.
    """
    heap = [(0, worker) for worker in range(num_workers)]
    assignment: list[list[str]] = [[] for _ in range(num_workers)]
    for name, size in sorted(files, key=lambda item: (-item[1], item[0])):
        load, worker = heapq.heappop(heap)
        assignment[worker].append(name)
        heapq.heappush(heap, (load + size, worker))
    return [sorted(names) for names in assignment]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """How input is split across ``num_workers`` input pipelines.

    Attributes:
      policy: 'file', 'data', 'hash' or 'off' (never 'auto').
      reason: Why, for logs and reports.
      num_workers: Input pipelines (one per worker).
      assignment: For 'file', each worker's files; else every worker reads all.
      worker_bytes: Bytes each worker reads (before data/hash filtering).
    """

    policy: str
    reason: str
    num_workers: int
    assignment: tuple[tuple[str, ...], ...]
    worker_bytes: tuple[int, ...]

    def files_for(self, worker: int) -> tuple[str, ...]:
        """The files worker ``worker`` reads."""
        return self.assignment[worker]


def imbalance(loads: Sequence[float]) -> float:
    """Max over mean of per-worker loads (1.0 is even): the slowest worker sets the step time.

    Example:
        >>> imbalance([100, 100]), imbalance([150, 50]), imbalance([0, 0])
        (1.0, 1.5, 1.0)
    """
    mean = sum(loads) / len(loads) if loads else 0
    return max(loads) / mean if mean else 1.0


def plan_shards(
    files: Sequence[tuple[str, int]], *, num_workers: int, policy: str = "auto", shard_key: str | None = None
) -> ShardPlan:
    """Chooses and lays out a sharding policy.

    'auto' picks 'file' when there are at least as many files as workers and
    the byte-balanced assignment is within 10% of even, else 'data' (every
    worker reads everything and keeps every N-th record: exact, but N times
    the I/O). One worker means 'off'.

    Args:
      files: (path, size in bytes) for every input file.
      num_workers: Input pipelines.
      policy: One of :data:`SHARD_POLICIES`.
      shard_key: Feature hashed by 'hash'.

    Raises:
      DataError: Unknown policy, 'file' with fewer files than workers, 'hash'
        without a key.
    """
    _check_inputs(files, num_workers, policy, shard_key)
    total = sum(size for _, size in files)
    everything = tuple(sorted(name for name, _ in files))
    if policy in ("off", "data", "hash") or (policy == "auto" and num_workers == 1):
        chosen = "off" if policy == "auto" else policy
        reason = {
            "off": "one input pipeline reads everything"
            if num_workers == 1
            else "sharding is off: every worker reads every record",
            "data": f"every worker reads all files and keeps one record in {num_workers}",
            "hash": f"records go to worker hash({shard_key}) % {num_workers}",
        }
        return _everyone_reads_all(chosen, reason[chosen], everything, total, num_workers)
    return _by_file(files, num_workers, policy, everything, total)


def _check_inputs(files: Sequence[tuple[str, int]], num_workers: int, policy: str, shard_key: str | None) -> None:
    """DataError for a :func:`plan_shards` argument no plan can come from."""
    if policy not in SHARD_POLICIES:
        raise invalid(DataError, "shard_policy", policy, describe_choices(policy, SHARD_POLICIES))
    require_int(DataError, "num_workers", num_workers, minimum=1, maximum=MAX_TASKS_PER_JOB)
    if (
        isinstance(files, (str, bytes))
        or not isinstance(files, Sequence)
        or not all(
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
            and item[1] >= 0
            for item in files
        )
    ):
        raise invalid(DataError, "files", files, "a sequence of (path, size in bytes) pairs")
    if not files:
        raise invalid(DataError, "files", [], "at least one input file", "Check the glob pattern or the list.")
    if policy == "hash" and not shard_key:
        raise invalid(
            DataError,
            "shard_key",
            shard_key,
            "the feature to hash with shard_policy='hash'",
            "Pass shard_key='user_id' (for example).",
        )


def _by_file(
    files: Sequence[tuple[str, int]], num_workers: int, policy: str, everything: tuple[str, ...], total: int
) -> ShardPlan:
    """The 'file' plan when the files split evenly enough over the workers, else 'data' (or a DataError for 'file')."""
    if len(files) < num_workers:
        if policy == "file":
            raise invalid(
                DataError,
                "shard_policy",
                "file",
                f"at least as many files as workers ({num_workers})",
                f"Only {len(files)} file(s): use shard_policy='data' or 'auto', or write more shards.",
            )
        return _everyone_reads_all(
            "data",
            f"{len(files)} file(s) for {num_workers} workers: too few to shard by file",
            everything,
            total,
            num_workers,
        )
    sizes = dict(files)
    assignment = _balance_files(files, num_workers)
    loads = tuple(sum(sizes[name] for name in names) for names in assignment)
    skew = imbalance(loads)
    if policy == "auto" and skew > _BALANCE_TOLERANCE:
        return _everyone_reads_all(
            "data",
            f"file sizes do not split evenly (the busiest worker would read {skew:.2f}x the mean)",
            everything,
            total,
            num_workers,
        )
    return ShardPlan(
        policy="file",
        reason=f"{len(files)} files over {num_workers} workers, byte-balanced within {(skew - 1) * 100:.1f}%",
        num_workers=num_workers,
        assignment=tuple(tuple(a) for a in assignment),
        worker_bytes=loads,
    )


def _everyone_reads_all(
    policy: str, reason: str, everything: tuple[str, ...], total: int, num_workers: int
) -> ShardPlan:
    return ShardPlan(
        policy=policy,
        reason=reason,
        num_workers=num_workers,
        assignment=(everything,) * num_workers,
        worker_bytes=(total,) * num_workers,
    )
