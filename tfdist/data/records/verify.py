"""The framing check before reading: which files are damaged, what is kept, what is lost.

:func:`verify_files` returns a :class:`VerifyReport` value (or raises a
:class:`~tfdist.errors.DataError` naming the file with ``on_corrupt='raise'``);
the reader then takes only the records before the damage.

Example:
    >>> from tfdist.data import VerifyReport
    >>> VerifyReport().to_dict()["records_lost"]
    0
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tfdist.data.pipeline.options import SourceOptions
from tfdist.data.records import _framing
from tfdist.data.records.files import Listing, compression_of
from tfdist.data.storage import remote
from tfdist.errors import DataError, Error, StorageError, invalid

__all__ = ["VerifyReport"]

_log = logging.getLogger("tfdist.data")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What a framing check found.

    Attributes:
      files_checked: Files whose framing was walked.
      corrupt_files: Damaged files (sorted).
      records_kept_from_corrupt: Good records read from the damaged files.
      records_lost: Records lost in them (exact with the writer's manifest, else estimated).
      records_lost_exact: Whether ``records_lost`` is exact.
      limits: Damaged file -> records to take from it.
    """

    files_checked: int = 0
    corrupt_files: tuple[str, ...] = ()
    records_kept_from_corrupt: int = 0
    records_lost: int = 0
    records_lost_exact: bool = True
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __add__(self, other: VerifyReport) -> VerifyReport:
        return VerifyReport(
            files_checked=self.files_checked + other.files_checked,
            corrupt_files=tuple(sorted(self.corrupt_files + other.corrupt_files)),
            records_kept_from_corrupt=self.records_kept_from_corrupt + other.records_kept_from_corrupt,
            records_lost=self.records_lost + other.records_lost,
            records_lost_exact=self.records_lost_exact and other.records_lost_exact,
            limits={**self.limits, **other.limits},
        )

    def to_dict(self) -> dict[str, Any]:
        """The report as plain values (what ``TFRecordPipeline.last_report`` returns)."""
        return {
            "files_checked": self.files_checked,
            "corrupt_files": list(self.corrupt_files),
            "records_kept_from_corrupt": self.records_kept_from_corrupt,
            "records_lost": self.records_lost,
            "records_lost_exact": self.records_lost_exact,
        }


def _wanted(path: str, source: SourceOptions) -> bool:
    local = "://" not in path and compression_of(path, source.compression) is None
    return source.verify == "all" or (source.verify == "local" and local)


def _lost_records(check: _framing.FileCheck, written: int | None) -> tuple[int, bool]:
    """(records lost, exact?): exact when the writer's count is known, else estimated from unreadable bytes."""
    if written is not None:
        return written - check.records, True
    mean = check.valid_bytes / check.records if check.records else 0
    return (round(check.lost_bytes / mean) if mean else 0), False


def _head(path: str, size: int) -> bytes:
    try:
        with remote.open_file(path, "rb") as f:
            return f.read(size)
    except Error:
        raise
    except Exception as err:
        raise StorageError(f"Cannot read {path}: {err}. Check that it exists and is readable.") from err


def _compression_problem(path: str, compression: str | None) -> str | None:
    """What is wrong when ``path`` does not start the way ``compression`` says it must (None: it does).

    Reads the first 12 bytes only: a gzip magic number, a zlib header, or an
    uncompressed TFRecord length with a valid CRC.
    """
    head = _head(path, 12)
    if not head:
        return None  # An empty file is an empty dataset in every compression.
    gzip_magic = head[:2] == b"\x1f\x8b"
    zlib_header = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
    framed = len(head) == 12 and _framing.masked_crc(head[:8]) == struct.unpack("<I", head[8:])[0]
    if compression == "GZIP" and not gzip_magic:
        found = "ZLIB" if zlib_header else "uncompressed TFRecords" if framed else "no gzip header"
    elif compression == "ZLIB" and not zlib_header:
        found = "GZIP" if gzip_magic else "uncompressed TFRecords" if framed else "no zlib header"
    elif not compression and not framed:
        found = "GZIP" if gzip_magic else "ZLIB" if zlib_header else "no TFRecord header"
    else:
        return None
    return f"read as {compression or 'uncompressed'}, but the file starts like {found}"


def verify_files(paths: Sequence[str], source: SourceOptions, listing: Listing) -> VerifyReport:
    """Walks the framing of ``paths`` (as ``source.verify`` asks); raises or reports what is damaged.

    Raises:
      DataError: A file is damaged and ``source.on_corrupt`` is 'raise'.
    """
    if source.verify == "none":
        return VerifyReport()
    walked = {p for p in paths if _wanted(p, source)}
    # The files not walked in full: their first bytes must match the compression. Objects staged through
    # boto3 are left to the reader (a sniff would download each one whole, ahead of the pipeline).
    sniffed = [p for p in paths if p not in walked and remote.reader_for(p) == "tensorflow"]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(sniffed)))) as pool:
        problems = list(pool.map(lambda p: _compression_problem(p, compression_of(p, source.compression)), sniffed))
    for path, problem in zip(sniffed, problems):
        if problem is not None:
            raise invalid(
                DataError,
                "compression",
                source.compression,
                f"the compression of {path} ({problem})",
                "Pass compression='GZIP', 'ZLIB' or None to match the files, or 'auto' to use their names (.gz, .zz).",
            )
    todo = [p for p in paths if p in walked]
    if any("://" in p for p in todo):  # Threads overlap remote reads.
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            checks = list(pool.map(lambda p: _framing.check_file(p, compression_of(p, source.compression)), todo))
    else:  # Local walks hold the GIL: threads would only add contention. One CRC pass for all files.
        checks = _framing.check_files(todo, [compression_of(p, source.compression) for p in todo])
    damaged = [c for c in checks if not c.ok]
    if damaged and source.on_corrupt == "raise":
        check = damaged[0]
        raise DataError(
            f"Corrupt TFRecord file {check.path}: {check.problem}; {check.records} good records "
            f"before it, {check.lost_bytes} bytes unreadable. Re-write the file, or pass "
            "on_corrupt='skip' to train on the readable records.",
            field="files",
            value=check.path,
        )
    lost = {c.path: _lost_records(c, listing.records([c.path])) for c in damaged}
    for check in damaged:
        count, exact = lost[check.path]
        _log.warning(
            "Skipping the damaged part of %s: %s; %s%d records lost.",
            check.path,
            check.problem,
            "" if exact else "about ",
            count,
        )
    return VerifyReport(
        files_checked=len(checks),
        corrupt_files=tuple(sorted(lost)),
        records_kept_from_corrupt=sum(c.records for c in damaged),
        records_lost=sum(count for count, _ in lost.values()),
        records_lost_exact=all(exact for _, exact in lost.values()),
        limits={c.path: c.records for c in damaged},
    )
