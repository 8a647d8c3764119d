"""Input files: expand globs, size them, find the writer's record counts, name their compression.

The read side lists and sizes files only through :func:`_glob`,
:func:`_size_of` and :func:`_is_dir` here, which ask :mod:`tfdist.data.storage.remote`
(TF's file systems, or boto3 for ``s3://``).

:class:`FileInfo` and :class:`Listing` are public (``tfdist.data``, what ``TFRecordPipeline.listing()``
returns); the rest is the data layer's own.

Example:
    >>> from tfdist.data import FileInfo, Listing
    >>> listing = Listing(files=(FileInfo(path="/d/a.tfrecord", size=10, records=4),
    ...                          FileInfo(path="/d/b.tfrecord.gz", size=7)))
    >>> listing.sizes, listing.records(["/d/a.tfrecord"]), listing.records(["/d/b.tfrecord.gz"])
    ((('/d/a.tfrecord', 10), ('/d/b.tfrecord.gz', 7)), 4, None)
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tfdist.data.records.index import names_index
from tfdist.data.records.writer import COMPRESSIONS, prefixes_of, read_manifest
from tfdist.data.storage import remote
from tfdist.errors import DataError, Error, StorageError, invalid

__all__ = ["FileInfo", "Listing"]

# File name endings -> compression: the writer's own endings first, then common spellings.
_COMPRESSION_BY_SUFFIX = tuple((suffix, kind) for kind, suffix in COMPRESSIONS.items() if kind) + (
    (".gzip", "GZIP"),
    (".zlib", "ZLIB"),
)


def compression_of(path: str, given: str | None) -> str | None:
    """``given`` when it is 'GZIP' or 'ZLIB'; for None or 'auto', the compression the file name ends in.

    Example:
        >>> compression_of("/data/train-00000-of-00004.tfrecord.gz", "auto"), compression_of("/data/x.tfrecord", "auto")
        ('GZIP', None)
    """
    if given not in (None, "auto"):
        return given
    for suffix, kind in _COMPRESSION_BY_SUFFIX:
        if path.endswith(suffix):
            return kind
    return None


# File systems whose reads are served by this machine's disks or memory; anything else (nfs, lustre, gpfs,
# fuse.gcsfuse, fuse.mountpoint-s3, cifs, ...) may cost a network round trip per read.
_LOCAL_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "ramfs", "overlay"})


def on_local_disk(paths: Sequence[str], mountinfo: str | None = None) -> bool:
    """Whether every path lies on a local file system, by the longest mount point in ``/proc/self/mountinfo``.

    Each directory is resolved once (symbolic links included); a file that is
    itself a link to another file system is judged by its directory. The
    answer only chooses how to read (reader threads or not), never what.

    False for URLs (``s3://``, ``gs://``, ...), network and FUSE mounts, and wherever the mount table
    cannot be read (not Linux): callers then keep reading ahead in parallel.

    Example:
        >>> table = "27 1 254:0 / / rw - ext4 /dev/vda rw\\n40 27 0:50 / /mnt/nfs rw - nfs4 srv:/x rw\\n"
        >>> on_local_disk(["/data/a.tfrecord"], table), on_local_disk(["/mnt/nfs/a.tfrecord"], table)
        (True, False)
    """
    if any("://" in path for path in paths):
        return False
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return False
    mounts = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " in line and len(fields) > 4:
            mounts[fields[4].replace("\\040", " ")] = line.split(" - ", 1)[1].split()[0]
    for directory in {os.path.dirname(path) or "." for path in paths}:  # Links are resolved per directory.
        path = os.path.realpath(directory)
        points = [p for p in mounts if path == p or path.startswith(p.rstrip("/") + "/")]
        if not points or mounts[max(points, key=len)] not in _LOCAL_FILE_SYSTEMS:
            return False
    return True


def _glob(pattern: str) -> list[str]:
    """The paths ``pattern`` matches (a pattern without wildcards is itself), through the path's reader."""
    remote.ensure_filesystem(pattern)
    try:
        return remote.glob(pattern)
    except Error:
        raise
    except Exception as err:
        raise StorageError(f"Cannot list {pattern}: {err}. Check the path and your access to it.") from err


def _is_dir(path: str) -> bool:
    """Whether ``path`` is a directory (object stores have none)."""
    if remote.reader_for(path) != "tensorflow":
        return False
    import tensorflow as tf

    try:
        return bool(tf.io.gfile.isdir(path))
    except tf.errors.OpError:
        return False


def _size_of(path: str) -> int:
    """Bytes in ``path``; DataError when it does not exist, StorageError when it cannot be read."""
    try:
        return remote.size(path)
    except StorageError:
        if not remote.exists(path):
            raise invalid(
                DataError,
                "files",
                path,
                "existing TFRecord files",
                "Check that the path exists; globs need quotes in the shell.",
            ) from None
        raise


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileInfo:
    """One input file: its path, size in bytes, and from the writer's manifest its records and class (or None).

    ``record_bytes`` is the manifest's uncompressed size of its framed
    records (or None): what the records take once read, compressed or not.
    """

    path: str
    size: int
    records: int | None = None
    label: str | None = None
    record_bytes: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listing:
    """The input files, sorted by path (the same on every worker)."""

    files: tuple[FileInfo, ...]
    local: bool = False  # Every file on a local file system (on_local_disk, when listed): read without threads.

    @property
    def sizes(self) -> tuple[tuple[str, int], ...]:
        """(path, size) pairs, as :func:`~tfdist.data.sharding.plan_shards` takes them."""
        return tuple((f.path, f.size) for f in self.files)

    def records(self, paths: Sequence[str]) -> int | None:
        """Records in ``paths`` per the writer's manifests, or None when any count is unknown."""
        known = {f.path: f.records for f in self.files}
        counts = [known.get(p) for p in paths]
        found = [c for c in counts if c is not None]
        return None if len(found) < len(counts) else sum(found)


def list_files(patterns: Sequence[str], *, on_corrupt: str = "raise") -> Listing:
    """Expands ``patterns``, sizes every file and attaches the writer's record counts.

    Args:
      patterns: Globs or paths.
      on_corrupt: For a corrupt manifest: 'raise' a DataError, or 'skip' it
        (record counts are then unknown).

    Raises:
      DataError: A pattern matches nothing, names a directory, or a manifest is corrupt.
      StorageError: A file cannot be listed or read.
    """
    index = names_index(patterns)
    if index is not None:  # The files a record index names, with their counts (one FileInfo each).
        from tfdist.data.records.index import open_index

        opened = open_index(index)
        entries = zip(opened.paths, opened.sizes.tolist(), opened.counts.tolist())
        files = tuple(FileInfo(path=p, size=s, records=c) for p, s, c in entries)
        return Listing(files=files, local=opened.local and on_local_disk([files[0].path]))
    paths: list[str] = []
    for pattern in patterns:
        matched = _glob(pattern)
        if not matched:
            raise invalid(
                DataError,
                "files",
                pattern,
                "a pattern that matches at least one file",
                "Check the path; globs need quotes in the shell.",
            )
        paths.extend(matched)
    paths = sorted(set(p for p in paths if not p.endswith("-manifest.json")))
    if not paths:
        raise invalid(DataError, "files", list(patterns), "TFRecord files (only manifests matched)")
    local = all("://" not in p for p in paths) and on_local_disk(paths)
    if local:
        directories, sizes = _local_sizes(paths)
    else:  # URLs, and network or FUSE mounts, where a stat can cost a round trip.
        directories = [p for p in paths if _is_dir(p)]
        if not directories:
            with ThreadPoolExecutor(max_workers=min(32, len(paths))) as pool:  # Overlaps round trips.
                sizes = list(pool.map(_size_of, paths))
    if directories:
        raise invalid(
            DataError,
            "files",
            directories[0],
            "TFRecord files, not a directory",
            f"Pass a glob of the files in it, e.g. '{directories[0].rstrip('/')}/*.tfrecord*'.",
        )
    written: dict[str, list[dict]] = {}
    for prefix in sorted({prefix for path in paths for prefix in prefixes_of(path)}):
        manifest = read_manifest(prefix, on_corrupt=on_corrupt)
        if manifest is not None:
            for path, info in manifest["files"].items():
                written.setdefault(path, []).append(info)
    infos = [_written_info(written.get(p, []), p, s) for p, s in zip(paths, sizes)]
    return Listing(
        files=tuple(
            FileInfo(
                path=p,
                size=s,
                records=info.get("records"),
                label=info.get("class"),
                record_bytes=_count_or_none(info.get("bytes")),
            )
            for p, s, info in zip(paths, sizes, infos)
        ),
        local=local,
    )


def _local_sizes(paths: Sequence[str]) -> tuple[list[str], list[int]]:
    """(the directories among ``paths``, every path's size): one ``os.stat`` per local path, no threads."""
    directories, sizes = [], []
    for path in paths:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            sizes.append(_size_of(path))  # Gone since the glob: _size_of names the path in a DataError.
            continue
        except OSError as err:
            raise StorageError(
                f"Cannot read {path}: {err.strerror or err}. Check that it exists and is readable.",
                field="files",
                value=path,
            ) from err
        if stat.S_ISDIR(info.st_mode):
            directories.append(path)
        sizes.append(info.st_size)
    return directories, sizes


def _count_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _written_info(entries: list[dict], path: str, size: int) -> dict:
    """The manifest entry for ``path``, or {} when no manifest names it or it cannot be told which one does.

    Two manifests can name the same file: ``part`` partitioned by ``v`` and the
    prefix ``part-v=2`` write the same shard names. Then the entry whose byte
    count matches the (uncompressed) file wins; an undecidable tie leaves the
    counts unknown, so the reader walks the file instead of trusting either.
    """
    if len({(e.get("records"), e.get("class")) for e in entries}) > 1 and compression_of(path, "auto") is None:
        entries = [e for e in entries if e.get("bytes") == size]
    return entries[0] if len({(e.get("records"), e.get("class")) for e in entries}) == 1 else {}
