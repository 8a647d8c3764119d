"""What a task of an elastic group knows about it, and the epoch boundaries it reports (TensorFlow-free).

``tfdist-launch --min-workers`` gives every task ``TFDIST_WORLD_SIZE`` (training tasks in the group),
``TFDIST_MEMBERSHIP`` (the generation: 0 at launch, +1 at every change) and ``TFDIST_ELASTIC_DIR``. The
training leader says there that it records epoch boundaries (:func:`announce`, as its fit begins), then records
each backed-up epoch (:func:`write_boundary`), both called by :class:`tfdist.keras.elastic.ElasticEpochs`; the
launcher reads them (:func:`announced`, :func:`read_boundaries`) and grows the group at the first boundary after
a worker returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping

WORLD_SIZE_VAR = "TFDIST_WORLD_SIZE"
MEMBERSHIP_VAR = "TFDIST_MEMBERSHIP"
ELASTIC_DIR_VAR = "TFDIST_ELASTIC_DIR"
_BOUNDARY_PREFIX = "epoch-"
_LEADER_PREFIX = "leader-"


def _write_atomically(path: str, record: Mapping[str, object]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def _leader_path(directory: str, generation: int) -> str:
    return os.path.join(directory, f"{_LEADER_PREFIX}g{generation:04d}.json")


def announce(directory: str, *, generation: int, world_size: int) -> str:
    """Records that the training leader of ``generation`` records epoch boundaries; atomic. Returns the path.

    Without it the launcher cannot tell a script that marks no boundaries (a returned worker would wait in
    vain) from one that has not reached them yet, and says so once at the return.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> announced(d)
        False
        >>> _ = announce(d, generation=2, world_size=3)
        >>> announced(d)
        True
    """
    path = _leader_path(directory, generation)
    _write_atomically(path, {"generation": generation, "world_size": world_size})
    return path


def announced(directory: str) -> bool:
    """Whether a training leader of this run said it records epoch boundaries (:func:`announce`) or recorded
    one: the leaders of every generation run the same script, so one that did tells for all."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(name.startswith((_LEADER_PREFIX, _BOUNDARY_PREFIX)) and name.endswith(".json") for name in names)


def recorded(directory: str) -> frozenset[str]:
    """The names of the epoch-boundary records in ``directory`` now (a launcher's snapshot, for
    :func:`read_boundaries`' ``only``)."""
    try:
        return frozenset(n for n in os.listdir(directory) if n.startswith(_BOUNDARY_PREFIX) and n.endswith(".json"))
    except OSError:
        return frozenset()


def read_boundaries(
    directory: str, seen: set[str], *, only: Collection[str] | None = None
) -> list[Mapping[str, object]]:
    """New epoch-boundary records in ``directory`` (written by the training leader), oldest first.

    ``seen`` holds the file names already returned; it is updated. ``only`` (names from :func:`recorded`)
    limits them to those that existed then.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_boundary(d, generation=0, epoch=0, world_size=2)
        >>> before = recorded(d)
        >>> _ = write_boundary(d, generation=0, epoch=1, world_size=2)
        >>> seen = set()
        >>> [r["epoch"] for r in read_boundaries(d, seen, only=before)], [r["epoch"] for r in read_boundaries(d, seen)]
        ([0], [1])
    """
    names = sorted(recorded(directory) if only is None else recorded(directory) & set(only))
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


def write_boundary(directory: str, *, generation: int, epoch: int, world_size: int, last: bool = False) -> str:
    """Records that ``epoch`` (0-based) ended and was backed up; atomic (write, then rename). Returns the path.

    ``last`` marks the final epoch of the fit: nobody joins there (the backup is deleted as fit ends, so a
    group restarted to grow would train from the start).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = write_boundary(d, generation=1, epoch=3, world_size=2)
        >>> seen = set()
        >>> read_boundaries(d, seen), read_boundaries(d, seen)
        ([{'generation': 1, 'epoch': 3, 'world_size': 2}], [])
    """
    path = os.path.join(directory, f"{_BOUNDARY_PREFIX}g{generation:04d}-e{epoch:06d}.json")
    record = {"generation": generation, "epoch": epoch, "world_size": world_size}
    _write_atomically(path, {**record, "last": True} if last else record)
    return path


def optional_int(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as an int, or None when unset or not a number."""
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
