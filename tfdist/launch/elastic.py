"""Elastic membership: which launcher workers form the training group now, and the TF_CONFIG they get.

The launcher keeps stable task names ('worker:2' stays 'worker:2' in logs, fault injection and
``TFDIST_TASK``); each generation of the group gets a dense TF_CONFIG in which the present workers are
renumbered in order and keep their addresses. Tasks see ``TFDIST_WORLD_SIZE`` (training tasks in the group)
and ``TFDIST_MEMBERSHIP`` (the generation, 0 at launch, +1 at every change).

Epoch boundaries come from the training side: the leader writes ``epoch-N.json`` into the directory named by
``TFDIST_ELASTIC_DIR`` after its backup (see :class:`tfdist.keras.elastic.ElasticEpochs`); a returned worker
joins the group at the next such boundary.

Example:
    >>> from tfdist.cluster import ClusterSpec
    >>> full = ClusterSpec(jobs={"worker": ["h:1", "h:2", "h:3"]})
    >>> group = Membership(generation=1, workers=("worker:0", "worker:2"))
    >>> group.spec(full, free=lambda address: True).jobs["worker"][1], group.tf_task("worker:2")
    ('h:3', 'worker:1')
    >>> group.world_size(full)
    2
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Optional

from tfdist import _address
from tfdist.cluster import ClusterSpec

__all__ = ["Membership", "WORLD_SIZE_VAR", "MEMBERSHIP_VAR", "ELASTIC_DIR_VAR", "read_boundaries",
           "write_boundary", "membership_variables", "optional_int"]

WORLD_SIZE_VAR = "TFDIST_WORLD_SIZE"
MEMBERSHIP_VAR = "TFDIST_MEMBERSHIP"
ELASTIC_DIR_VAR = "TFDIST_ELASTIC_DIR"
_BOUNDARY_PREFIX = "epoch-"


def _index(task: str) -> int:
    return int(task.rsplit(":", 1)[1])


def _address_free(address: str) -> bool:
    return _address.port_is_free(*_address.split_address(address))


@dataclasses.dataclass(frozen=True)
class Membership:
    """One generation of the training group.

    Args:
      generation: 0 at launch, +1 at every membership change.
      workers: The present workers' launcher names, in launch order.
    """

    generation: int
    workers: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(sorted(self.workers, key=lambda t: _index(t))))

    def tf_task(self, task: str) -> str:
        """The name ``task`` has in this generation's TF_CONFIG (workers renumbered, others unchanged)."""
        if task in self.workers:
            return f"worker:{self.workers.index(task)}"
        return task

    def spec(self, full: ClusterSpec, *, free: Callable[[str], bool] = _address_free) -> ClusterSpec:
        """This generation's cluster: ``full`` with only the present workers, renumbered.

        Every task keeps its address while ``free(address)`` says its port can be bound (it always should:
        the group was stopped); otherwise it gets a new free port on the same host.
        """
        jobs: dict[str, list[str]] = {job: [full.jobs[job][i] for i in sorted(full.jobs[job])]
                                      for job in full.jobs if job != "worker"}
        jobs["worker"] = [full.jobs["worker"][_index(task)] for task in self.workers]
        for job, addresses in jobs.items():
            for i, address in enumerate(addresses):
                if not free(address):
                    host = _address.split_address(address)[0]
                    addresses[i] = f"{host}:{_address.free_ports(1, host)[0]}"
        return ClusterSpec(jobs={job: addresses for job, addresses in jobs.items() if addresses})

    def world_size(self, full: ClusterSpec) -> int:
        """Training tasks in this generation: the present workers plus the chief."""
        return len(self.workers) + len(full.jobs.get("chief", ()))


def membership_variables(membership: Membership, full: ClusterSpec) -> dict[str, str]:
    """``TFDIST_WORLD_SIZE`` and ``TFDIST_MEMBERSHIP`` for every task of ``membership``."""
    return {WORLD_SIZE_VAR: str(membership.world_size(full)), MEMBERSHIP_VAR: str(membership.generation)}


def read_boundaries(directory: str, seen: set[str]) -> list[Mapping[str, object]]:
    """New epoch-boundary records in ``directory`` (written by the training leader), oldest first.

    ``seen`` holds the file names already returned; it is updated.
    """
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(_BOUNDARY_PREFIX) and n.endswith(".json"))
    except OSError:
        return []
    records = []
    for name in names:
        if name in seen:
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue  # Being written (the writer renames into place; a partial file is not read twice).
        seen.add(name)
        records.append(record)
    return records


def write_boundary(directory: str, *, generation: int, epoch: int, world_size: int) -> str:
    """Records that ``epoch`` (0-based) ended and was backed up; atomic (write, then rename). Returns the path.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_boundary(d, generation=1, epoch=3, world_size=2)
        >>> seen = set()
        >>> read_boundaries(d, seen), read_boundaries(d, seen)
        ([{'generation': 1, 'epoch': 3, 'world_size': 2}], [])
    """
    path = os.path.join(directory, f"{_BOUNDARY_PREFIX}g{generation:04d}-e{epoch:06d}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"generation": generation, "epoch": epoch, "world_size": world_size}, f)
    os.replace(tmp, path)
    return path


def optional_int(env: Mapping[str, str], name: str) -> Optional[int]:
    """``env[name]`` as an int, or None when unset or not a number."""
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
