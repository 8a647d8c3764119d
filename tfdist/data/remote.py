"""Remote file systems: load tensorflow-io only when a path needs it, and fail clearly.

tensorflow-io is abandoned upstream and loads only on TF 2.17.x; on 2.18+ its
import *succeeds* but its file systems are silently missing. tfdist imports it
lazily, only for ``s3://``, ``hdfs://``, ``az://`` (and similar) paths, and
checks that the scheme is registered afterwards.

Example:
    >>> from tfdist.data.remote import scheme_of
    >>> scheme_of("s3://bucket/train-*"), scheme_of("/data/train-*")
    ('s3', '')
"""

from __future__ import annotations

import logging

from tfdist.errors import DataError, StorageError, invalid

__all__ = ["ensure_filesystem", "scheme_of", "TFIO_SCHEMES"]

_log = logging.getLogger("tfdist.data")
BUILTIN_SCHEMES = frozenset({"", "file", "gs", "ram"})
TFIO_SCHEMES = frozenset({"s3", "hdfs", "viewfs", "har", "az", "http", "https", "oss"})


def scheme_of(path: str) -> str:
    """The URL scheme of ``path`` ('' for local paths)."""
    return path.split("://", 1)[0].lower() if "://" in path else ""


def ensure_filesystem(path: str) -> None:
    """Makes ``path``'s file system usable, importing tensorflow-io if it needs it.

    Raises:
      DataError: The scheme is unknown.
      StorageError: tensorflow-io cannot be imported, or it imported but did
        not register the scheme (TF other than 2.17.x).
    """
    scheme = scheme_of(path)
    if scheme in BUILTIN_SCHEMES:
        return
    import tensorflow as tf

    if scheme in tf.io.gfile.get_registered_schemes():
        return
    if scheme not in TFIO_SCHEMES:
        known = sorted((BUILTIN_SCHEMES | TFIO_SCHEMES) - {""})
        raise invalid(DataError, "path", path, f"a local path or one of the schemes {known}",
                      "Check the scheme's spelling.")
    try:
        import tensorflow_io  # noqa: F401 - registers its file systems on import.
    except Exception as err:  # noqa: BLE001 - any failure to load means the same to the user.
        raise StorageError(f"Reading {path!r} needs tensorflow-io, which failed to import: {err}. "
                        "Install tensorflow-io==0.37.1 with tensorflow==2.17.1 (see BUILD_NOTES.md).") from err
    if scheme not in tf.io.gfile.get_registered_schemes():
        raise StorageError(f"Reading {path!r} needs tensorflow-io's '{scheme}' file system, which did not load with "
                        f"TensorFlow {tf.__version__} (its native library has undefined symbols on TF 2.18+). "
                        "Use tensorflow==2.17.1 with tensorflow-io==0.37.1 (see BUILD_NOTES.md).")
    _log.info("Loaded tensorflow-io for %s:// paths.", scheme)
