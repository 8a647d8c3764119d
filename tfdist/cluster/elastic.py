"""What a task of an elastic group knows about it, and the epoch boundaries it reports (TensorFlow-free).

``tfdist-launch --min-workers`` gives every task ``TFDIST_WORLD_SIZE`` (training tasks in the group),
``TFDIST_MEMBERSHIP`` (the generation: 0 at launch, +1 at every change) and ``TFDIST_ELASTIC_DIR``. The
training leader records each backed-up epoch there (:func:`write_boundary`, called by
:class:`tfdist.keras.elastic.ElasticEpochs`); the launcher reads them (:func:`read_boundaries`) and grows the
group at the first boundary after a worker returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

WORLD_SIZE_VAR = "TFDIST_WORLD_SIZE"
MEMBERSHIP_VAR = "TFDIST_MEMBERSHIP"
ELASTIC_DIR_VAR = "TFDIST_ELASTIC_DIR"
_BOUNDARY_PREFIX = "epoch-"


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
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        record = {"generation": generation, "epoch": epoch, "world_size": world_size}
        json.dump({**record, "last": True} if last else record, f)
    os.replace(tmp, path)
    return path


def optional_int(env: Mapping[str, str], name: str) -> int | None:
    """``env[name]`` as an int, or None when unset or not a number."""
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None
