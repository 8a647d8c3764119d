"""TFRecord framing checks: find truncated or corrupt files and name them.

A TFRecord is ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``. TensorFlow silently stops at a truncated last record
(the rest of the file is lost without an error) and reports garbage as
``DataLossError: corrupted record at N`` without the file name. Walking the
headers (and checking each length's CRC) finds both, cheaply: for local,
uncompressed files only the 12-byte headers are read.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import StorageError

_HEADER = 12
_CRC_PASS = 1 << 20  # Headers checked per CRC pass at most (a pass over many small files, or one big file).
_READ_WHOLE = 1 << 20  # Smaller local files are read whole: cheaper than mapping them (class groups are small).
_SPARSE = 16 << 10  # A first record this long: headers read one pread each, not through a map (a page fault each).
_FOOTER = 4
# How to undo each compression tfdist.data.records.writer.COMPRESSIONS names (a test checks the two agree).
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {"GZIP": gzip.decompress, "ZLIB": zlib.decompress}


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileCheck:
    """What a framing walk found in one file.

    Attributes:
      path: The file.
      records: Complete, well-framed records before any problem.
      valid_bytes: Bytes (uncompressed) those records span.
      total_bytes: Bytes (uncompressed) in the file.
      problem: None when the file is sound, else what is wrong and where.
    """

    path: str
    records: int
    valid_bytes: int
    total_bytes: int
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def lost_bytes(self) -> int:
        return self.total_bytes - self.valid_bytes


def _bad_crcs(rows: Any) -> Any:
    """Per header (a row of 12 bytes, uint8): whether its length CRC is wrong (a bool array).

    Vectorized (numpy: one pass per length byte for all headers at once); a
    CRC per record in Python cost more than the rest of the walk.
    """
    import numpy as np

    table = _numpy_table()
    crc = np.full(len(rows), 0xFFFFFFFF, dtype=np.uint32)
    for column in range(8):
        crc = table[(crc ^ rows[:, column]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)  # uint32 wraps like & 0xFFFFFFFF.
    return masked != np.ascontiguousarray(rows[:, 8:]).view("<u4").reshape(-1)


@functools.lru_cache(maxsize=1)
def _numpy_table() -> Any:
    import numpy as np

    return np.asarray(_TABLE, dtype=np.uint32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Walked:
    """A walk whose length CRCs are not checked yet: its headers (offsets and bytes), where and why it stopped."""

    path: str
    offsets: Any  # int64 array
    rows: Any
    records: int
    end: int
    total: int
    problem: str | None

    def check(self, bad: Any) -> FileCheck:
        """The file's check, given ``bad``: which of its headers have a wrong length CRC.

        A bad CRC before the point where the walk stopped is the first problem
        (the lengths after it are not trusted).
        """
        import numpy as np

        wrong = np.flatnonzero(bad)
        if len(wrong):
            first = int(wrong[0])
            at = int(self.offsets[first])
            return FileCheck(
                path=self.path,
                records=first,
                valid_bytes=at,
                total_bytes=self.total,
                problem=f"corrupt record header at byte {at} (is this a TFRecord "
                "file, and is its compression set right?)",
            )
        return FileCheck(
            path=self.path, records=self.records, valid_bytes=self.end, total_bytes=self.total, problem=self.problem
        )


_LENGTH = struct.Struct("<Q").unpack_from


def _walk(data: Any, path: str) -> _Walked:
    """Walks the record headers of ``data`` (a file's bytes, or a memory map of it); CRCs are checked later."""
    return _walk_headers(lambda at: data[at : at + _HEADER], len(data), path)


def _walk_reads(fd: int, total: int, path: str) -> _Walked:
    """:func:`_walk` for an open file of long records: one 12-byte ``pread`` per header.

    Headers 16 KB or more apart sit on pages of their own: through a memory map
    each costs a page fault (8,000 headers of ~30 KB records: 18 ms), a
    ``pread`` about a third of that (7 ms).
    """
    return _walk_headers(lambda at: os.pread(fd, _HEADER, at), total, path)


def _walk_headers(header_at: Callable[[int], bytes], total: int, path: str) -> _Walked:
    """Follows the record lengths of a file of ``total`` bytes, ``header_at(offset)`` giving the 12 header bytes.

    The walk runs in Python (one header read per record); :func:`_checked`
    then tests the length CRCs of many files' headers at once, by numpy.
    """
    import numpy as np

    offsets, headers = [], []
    offset = records = 0
    problem = None
    while offset < total:
        if total - offset < _HEADER:
            problem = f"truncated record header at byte {offset}"
            break
        header = header_at(offset)
        offsets.append(offset)
        headers.append(header)
        end = offset + _HEADER + _LENGTH(header)[0] + _FOOTER
        if end > total:
            problem = f"truncated record at byte {offset}: needs {end - offset} bytes, {total - offset} left"
            break
        records, offset = records + 1, end
    rows = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(-1, _HEADER) if headers else None
    return _Walked(
        path=path,
        offsets=np.asarray(offsets, dtype=np.int64),
        rows=rows,
        records=records,
        end=offset,
        total=total,
        problem=problem,
    )


def _checked(walks: list[Any]) -> list[FileCheck]:
    """FileChecks for ``walks`` (each a FileCheck already, or a :class:`_Walked`): one CRC pass over all headers."""
    import numpy as np

    rows = [w.rows for w in walks if isinstance(w, _Walked) and len(w.offsets)]
    bad = _bad_crcs(np.concatenate(rows)) if rows else np.zeros(0, bool)
    checks, start = [], 0
    for walk in walks:  # In order: each walk's headers are the next len(offsets) rows.
        if isinstance(walk, FileCheck):
            checks.append(walk)
            continue
        checks.append(walk.check(bad[start : start + len(walk.offsets)]))
        start += len(walk.offsets)
    return checks


def first_record(path: str, *, check_data: bool = False) -> bytes | None:
    """The first record of a local, uncompressed TFRecord file; None when it has none or its framing is bad.

    Two reads, no ``tf.data`` pipeline (building one to read a record costs
    ~25 ms of tracing). The length CRC is always checked; the data CRC (pure
    Python, ~0.1 us per byte) only with ``check_data``.
    """
    with open(path, "rb") as f:
        header = f.read(_HEADER)
        if len(header) < _HEADER or masked_crc(header[:8]) != struct.unpack_from("<I", header, 8)[0]:
            return None
        length = struct.unpack_from("<Q", header)[0]
        data = f.read(length + _FOOTER)
    if len(data) < length + _FOOTER:
        return None
    if check_data and masked_crc(data[:length]) != struct.unpack_from("<I", data, length)[0]:
        return None
    return data[:length]


def check_file(path: str, compression: str | None = None) -> FileCheck:
    """Walks the framing of one TFRecord file (local or any ``tf.io.gfile`` path).

    Raises:
      StorageError: The file cannot be read (missing, no permission, I/O error).
    """
    return check_files([path], [compression])[0]


def check_files(paths: Sequence[str], compressions: Sequence[str | None]) -> list[FileCheck]:
    """Walks the framing of many files, one after the other; their length CRCs are checked in one pass.

    A CRC pass costs ~70 us of numpy calls whatever its size: with many small
    files (class groups) one pass per file cost more than the walks.

    Raises:
      StorageError: A file cannot be read (missing, no permission, I/O error).
    """
    checks: list[FileCheck] = []
    walks: list[Any] = []
    pending = 0
    for path, compression in zip(paths, compressions, strict=True):
        try:
            walk = _check_file(path, compression)
        except OSError as err:
            raise StorageError(
                f"Cannot read {path}: {err.strerror or err}. Check that it exists and is readable.",
                field="files",
                value=path,
            ) from err
        walks.append(walk)
        pending += len(walk.offsets) if isinstance(walk, _Walked) else 0
        if pending >= _CRC_PASS:  # Bounded memory: ~50 bytes per pending record.
            checks += _checked(walks)
            walks, pending = [], 0
    return checks + _checked(walks)


_WALKED: dict[tuple[str, int, int], Any] = {}  # (path, size, mtime_ns) -> record offsets of the last walk.
_WALKED_KEEP = 1 << 22  # Offsets kept for block_offsets (32 MB): a walk is not done twice per build.


def _stamp(fd: int, path: str) -> tuple[str, int, int]:
    stat = os.fstat(fd)
    return path, stat.st_size, stat.st_mtime_ns


def _check_file(path: str, compression: str | None) -> FileCheck | _Walked:
    from tfdist.data.storage import remote

    compression = (compression or "").upper()
    local = remote.readable_path(path)  # An s3:// object read through boto3 is checked in its staged copy.
    if "://" not in local and not compression:
        with open(local, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size:
                return FileCheck(path=path, records=0, valid_bytes=0, total_bytes=0)
            if size <= _READ_WHOLE:
                walk = _walk(f.read(), path)
            elif _LENGTH(os.pread(f.fileno(), 8, 0))[0] >= _SPARSE:
                walk = _walk_reads(f.fileno(), size, path)
            else:
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # Only the headers' pages are read.
                    walk = _walk(data, path)
            if sum(len(v) for v in _WALKED.values()) + len(walk.offsets) <= _WALKED_KEEP:
                _WALKED[_stamp(f.fileno(), path)] = (walk.offsets, walk.records)
            return walk
    if "://" in local:
        with remote.open_file(local, "rb") as f:
            raw = f.read()
    else:
        with open(local, "rb") as f:
            raw = f.read()
    try:
        raw = _DECOMPRESS[compression](raw) if compression else raw
    except (OSError, EOFError, zlib.error) as err:
        return FileCheck(
            path=path,
            records=0,
            valid_bytes=0,
            total_bytes=len(raw),
            problem=f"cannot decompress as {compression}: {err}",
        )
    return _walk(raw, path)


def block_offsets(path: str, block: int, phase: int = 0) -> tuple[int, Any]:
    """(records, byte offsets of records phase, phase + block, ...: int64) of a local, uncompressed TFRecord file.

    The headers are walked as :func:`check_file` walks them (CRCs are the verifier's job), or taken from
    the verifier's walk of the same file in this process; a damaged tail ends at the last whole record.
    """
    import numpy as np

    with open(path, "rb") as f:
        stamp = _stamp(f.fileno(), path)
    known = _WALKED.pop(stamp, None)
    if known is None:
        walk = _check_file(path, None)
        _WALKED.pop(stamp, None)
        if isinstance(walk, FileCheck):  # Empty (or unreadable as framed records).
            return walk.records, np.zeros(0, np.int64)
        known = (walk.offsets, walk.records)
    offsets, records = known
    return records, np.asarray(offsets[phase:records:block], np.int64)
