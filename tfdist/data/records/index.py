"""A record index: the files of a dataset, their record counts and the byte offsets of every ``grid``-th
record, in one file that workers map instead of listing the files and walking their headers.

Built once (``tfdist index 'PATTERN' --out data.tfindex``, or
:func:`tfdist.data.order.index.build_index`), it is read by every
worker of every job: ``TFRecordPipeline(files="data.tfindex", ...)``. Its arrays are stored raw behind a
JSON header and memory-mapped where the index is a local file, so a worker's memory holds the pages it
touches (the counts it searches and the offsets and names of the files it reads), not the dataset's.

The layout: the magic line, the header's length (8 bytes, little-endian), the JSON header, then each array
at a 64-byte boundary (``counts`` and ``sizes`` int64 per file, ``offsets`` int64 per ``grid`` records of
the listing, -1 where a file is read from its start, ``names`` fixed-width bytes, relative to the index's
directory when ``relative``).

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.tfindex")
    >>> write_index(path, names=np.asarray([b"a.tfrecord", b"b.tfrecord"]), counts=[3, 2], sizes=[48, 32],
    ...             offsets=[0, 32, 16], grid=2, compression="", relative=True)
    >>> index = open_index(path)
    >>> index.counts.tolist(), index.offsets.tolist(), os.path.basename(index.paths[1])
    ([3, 2], [0, 32, 16], 'b.tfrecord')
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from tfdist.errors import DataError, invalid

__all__: list[str] = []

SUFFIX = ".tfindex"
_MAGIC = b"TFDIST-INDEX 1\n"
_ALIGN = 64
_OPEN: dict[tuple[str, int, int], RecordIndex] = {}
_LOCK = threading.Lock()


def names_index(files: str | Sequence[str]) -> str | None:
    """The record index ``files`` names (one path ending in ``.tfindex``), else None.

    Example:
        >>> names_index("/data/train.tfindex"), names_index(["/data/train-*"])
        ('/data/train.tfindex', None)
    """
    one = [files] if isinstance(files, str) else list(files)
    return one[0] if len(one) == 1 and one[0].endswith(SUFFIX) else None


class IndexPaths(Sequence[str]):
    """The index's file paths, decoded one at a time (nothing of the size of the listing is built)."""

    def __init__(self, names: Any, root: str) -> None:
        self._names, self._root = names, root

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        name = bytes(self._names[i]).rstrip(b"\0").decode()
        return os.path.join(self._root, name) if self._root else name

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class RecordIndex:
    """An opened record index (see the module docstring): arrays, memory-mapped where the file is local.

    Attributes:
      path: The index file.
      grid: Records of the listing between two entries of ``offsets``.
      compression: The files' one compression ('' for none).
      counts: Records per file (int64).
      sizes: Bytes per file (int64).
      offsets: Byte offset, in its file, of every ``grid``-th record of the listing (int64; -1: read the
        file from its start).
      names: File names (fixed-width bytes).
      root: The directory the names are relative to ('' when they are full paths).
      places: Where each array starts in the index file (byte offset, item size), for readers that read
        entries by range (parameter-server workers).
      nbytes: The index file's size.
    """

    path: str
    grid: int
    compression: str
    counts: Any = dataclasses.field(repr=False)
    sizes: Any = dataclasses.field(repr=False)
    offsets: Any = dataclasses.field(repr=False)
    names: Any = dataclasses.field(repr=False)
    root: str
    places: dict[str, tuple[int, int]] = dataclasses.field(repr=False)
    nbytes: int = 0

    @functools.cached_property
    def paths(self) -> IndexPaths:
        """The files' paths, in listing order."""
        return IndexPaths(self.names, self.root)

    @property
    def num_records(self) -> int:
        """Records of all files."""
        return int(self.counts.sum())

    @property
    def local(self) -> bool:
        """Whether the files are local paths (no URL scheme)."""
        return "://" not in (self.root or (self.paths[0] if len(self.names) else ""))


def _arrays(header: dict[str, Any], raw: Any, at: int) -> dict[str, Any]:
    import numpy as np

    out = {}
    for name, (start, dtype, length) in header["arrays"].items():
        out[name] = np.frombuffer(raw, dtype=np.dtype(dtype), count=length, offset=start - at)
    return out


def open_index(path: str) -> RecordIndex:
    """The record index at ``path`` (kept open for the process; mapped when local).

    Raises:
      DataError: ``path`` is not a record index (its fix: build one with ``tfdist index``).
    """
    import numpy as np

    from tfdist.data.storage import remote

    local = "://" not in path
    try:
        stamp = (path, *((os.stat(path).st_size, os.stat(path).st_mtime_ns) if local else (0, 0)))
    except OSError:
        stamp = (path, -1, -1)
    with _LOCK:
        if stamp in _OPEN:
            return _OPEN[stamp]
    fix = f"Build it with: tfdist index 'FILES-PATTERN' --out {path}"
    if not (os.path.isfile(path) if local else remote.exists(path)):
        raise invalid(DataError, "files", path, "an existing record index", fix)
    with open(path, "rb") if local else remote.open_file(path, "rb") as f:
        head = f.read(len(_MAGIC) + 8)
        if len(head) < len(_MAGIC) + 8 or not head.startswith(_MAGIC):
            raise invalid(DataError, "files", path, "a record index written by tfdist index", fix)
        (length,) = struct.unpack("<Q", head[len(_MAGIC) :])
        header = json.loads(f.read(length))
        body = len(head) + length
        if local:
            raw: Any = np.memmap(path, dtype=np.uint8, mode="r")
            at, nbytes = 0, len(raw)
        else:  # Remote: read once into memory (object stores cannot be mapped).
            raw, at = f.read(), body
            nbytes = body + len(raw)
    arrays = _arrays(header, raw, at)
    directory = os.path.dirname(path) if header.get("relative") else ""
    index = RecordIndex(
        path=path,
        grid=int(header["grid"]),
        compression=str(header.get("compression") or ""),
        counts=arrays["counts"],
        sizes=arrays["sizes"],
        offsets=arrays["offsets"],
        names=arrays["names"],
        root=directory,
        places={name: (start, np.dtype(dtype).itemsize) for name, (start, dtype, _) in header["arrays"].items()},
        nbytes=nbytes,
    )
    with _LOCK:
        _OPEN[stamp] = index
    return index


def write_index(
    path: str, *, names: Any, counts: Any, sizes: Any, offsets: Any, grid: int, compression: str, relative: bool
) -> None:
    """Writes a record index (arrays as :class:`RecordIndex` holds them; ``names`` a bytes array)."""
    import numpy as np

    from tfdist.data.storage import remote

    arrays = {
        "counts": np.ascontiguousarray(counts, np.dtype("<i8")),
        "sizes": np.ascontiguousarray(sizes, np.dtype("<i8")),
        "offsets": np.ascontiguousarray(offsets, np.dtype("<i8")),
        "names": np.ascontiguousarray(names),
    }
    header: dict[str, Any] = {"grid": grid, "compression": compression, "relative": relative, "arrays": {}}
    for _ in range(2):  # The header's own length moves the arrays: settle it.
        text = json.dumps(header, sort_keys=True).encode()
        at = -(-(len(_MAGIC) + 8 + len(text) + 16) // _ALIGN) * _ALIGN
        places = {}
        for name, array in arrays.items():
            places[name] = [at, array.dtype.str, len(array)]
            at = -(-(at + array.nbytes) // _ALIGN) * _ALIGN
        header["arrays"] = places
    text = json.dumps(header, sort_keys=True).encode()
    with open(path, "wb") if "://" not in path else remote.open_file(path, "wb") as f:
        f.write(_MAGIC + struct.pack("<Q", len(text)) + text)
        written = len(_MAGIC) + 8 + len(text)
        for name, array in arrays.items():
            start = header["arrays"][name][0]
            f.write(b"\0" * (start - written))
            f.write(array.tobytes())
            written = start + array.nbytes
