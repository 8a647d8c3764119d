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
import gzip
import io
import os
import struct
import zlib
from typing import BinaryIO, Optional

_HEADER = 12
_FOOTER = 4


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


@dataclasses.dataclass(frozen=True)
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
    problem: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def lost_bytes(self) -> int:
        return self.total_bytes - self.valid_bytes


def _walk(stream: BinaryIO, total: int, path: str, seekable: bool) -> FileCheck:
    records = offset = 0
    while offset < total:
        header = stream.read(_HEADER)
        if len(header) < _HEADER:
            return FileCheck(path, records, offset, total, f"truncated record header at byte {offset}")
        length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
        if masked_crc(length_bytes) != length_crc:
            return FileCheck(path, records, offset, total,
                             f"corrupt record header at byte {offset} (is this a TFRecord file, and is its "
                             "compression set right?)")
        length = struct.unpack("<Q", length_bytes)[0]
        end = offset + _HEADER + length + _FOOTER
        if end > total:
            return FileCheck(path, records, offset, total,
                             f"truncated record at byte {offset}: needs {end - offset} bytes, {total - offset} left")
        if seekable:
            stream.seek(end)
        else:
            remaining = length + _FOOTER
            while remaining:
                chunk = stream.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                remaining -= len(chunk)
        records, offset = records + 1, end
    return FileCheck(path, records, offset, total)


def check_file(path: str, compression: Optional[str] = None) -> FileCheck:
    """Walks the framing of one TFRecord file (local or any ``tf.io.gfile`` path)."""
    compression = (compression or "").upper()
    if "://" not in path and not compression:
        with open(path, "rb") as f:
            return _walk(f, os.fstat(f.fileno()).st_size, path, seekable=True)
    if "://" in path:
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read()
    else:
        with open(path, "rb") as f:
            raw = f.read()
    try:
        if compression == "GZIP":
            raw = gzip.decompress(raw)
        elif compression == "ZLIB":
            raw = zlib.decompress(raw)
    except (OSError, EOFError, zlib.error) as err:
        return FileCheck(path, 0, 0, len(raw), f"cannot decompress as {compression}: {err}")
    return _walk(io.BytesIO(raw), len(raw), path, seekable=True)
