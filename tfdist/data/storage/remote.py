"""Remote file systems: which reader serves a path, and the few file operations tfdist's data layer needs.

Every path is served by one of two readers:

- ``tensorflow``: TF's own file systems (local, ``gs://``, ``ram://``) and, on
  TF 2.17, tensorflow-io's (``s3``, ``hdfs``, ``az``, ...), imported lazily and
  checked after import (on TF 2.18+ its import succeeds but registers nothing);
- ``boto3``: ``s3://`` where TF has no ``s3`` file system (TF 2.18+, or
  tensorflow-io not installed) - :mod:`tfdist.data.storage.s3` lists the objects and
  stages each worker's shards into a bounded local cache that
  ``tf.data.TFRecordDataset`` reads.

``TFDIST_S3_READER=boto3`` or ``=tensorflow`` forces the choice for ``s3://``.
The boto3 reader stages files from a ``tf.py_function`` when the pipeline runs
in the training process (single worker, MultiWorkerMirroredStrategy), and
through the staging agent of each TF server that runs it elsewhere
(ParameterServerStrategy workers, tf.data service workers; see
:mod:`tfdist.data.storage.staging`).

Example:
    >>> from tfdist.data.storage.remote import scheme_of, reader_for
    >>> scheme_of("s3://bucket/train-*"), scheme_of("/data/train-*")
    ('s3', '')
    >>> reader_for("/data/train-*")
    'tensorflow'
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import DataError, StorageError, invalid
from tfdist.runtime.versions import install_hint, tfio_unavailable_reason

_log = logging.getLogger("tfdist.data")
BUILTIN_SCHEMES = frozenset({"", "file", "gs", "ram"})
_TFIO_SCHEMES = frozenset({"s3", "hdfs", "viewfs", "har", "az", "http", "https", "oss"})
READERS = ("tensorflow", "boto3")
_STAGE_AHEAD = 4  # Objects each worker downloads ahead of its reader, in parallel.


def scheme_of(path: str) -> str:
    """The URL scheme of ``path`` ('' for local paths)."""
    return path.split("://", 1)[0].lower() if "://" in path else ""


@functools.cache
def _reader_for_scheme(scheme: str, forced: str) -> str:
    if scheme in BUILTIN_SCHEMES:
        return "tensorflow"
    import tensorflow as tf

    if scheme not in _TFIO_SCHEMES and scheme not in tf.io.gfile.get_registered_schemes():
        raise invalid(
            DataError,
            "path",
            f"{scheme}://...",
            f"a local path or one of the schemes {sorted((BUILTIN_SCHEMES | _TFIO_SCHEMES) - {''})}",
            "Check the scheme's spelling.",
        )
    if scheme == "s3" and forced == "boto3":
        _log.info("Reading s3:// through boto3 (TFDIST_S3_READER=boto3).")
        return "boto3"
    if scheme in tf.io.gfile.get_registered_schemes():
        return "tensorflow"
    problem = tfio_unavailable_reason()
    if problem is None:
        try:
            import tensorflow_io  # noqa: F401 - registers its file systems on import.
        except Exception as err:
            problem = f"tensorflow-io failed to import: {err}"
    if problem is None and scheme in tf.io.gfile.get_registered_schemes():
        _log.info("Reading %s:// through tensorflow-io.", scheme)
        return "tensorflow"
    problem = problem or f"tensorflow-io did not register '{scheme}' with TensorFlow {tf.__version__}"
    if scheme == "s3" and forced != "tensorflow":
        _log.info("Reading s3:// through boto3 (%s).", problem)
        return "boto3"
    raise StorageError(
        f"No file system for {scheme}:// on TensorFlow {tf.__version__}: {problem}. s3:// works on "
        f"every TF through boto3 ({install_hint('s3')}); other schemes need tensorflow-io with "
        f"tensorflow==2.17.* ({install_hint('tfio')}), or a mount.",
        field="path",
        value=f"{scheme}://",
        fix=f"{install_hint('tfio')} on TF 2.17, or mount it",
    )


def reader_for(path: str) -> str:
    """'tensorflow' or 'boto3': what serves ``path`` here (see the module docstring)."""
    forced = os.environ.get("TFDIST_S3_READER", "")
    if forced and forced not in READERS:
        raise invalid(DataError, "TFDIST_S3_READER", forced, f"one of {READERS}", "Unset it to choose automatically.")
    return _reader_for_scheme(scheme_of(path), forced)


def ensure_filesystem(path: str) -> None:
    """Makes ``path``'s file system usable (imports tensorflow-io or checks boto3), or raises.

    Raises:
      DataError: The scheme is unknown.
      StorageError: No reader can serve it on this TensorFlow.
    """
    if reader_for(path) == "boto3":
        _store()


def _store() -> Any:
    from tfdist.data.storage import s3

    return s3.store()


def glob(pattern: str) -> list[str]:
    """The paths that match ``pattern`` (TF glob rules), sorted; a pattern without wildcards is returned as is."""
    if not any(c in pattern for c in "*?["):
        return [pattern]
    if reader_for(pattern) == "boto3":
        return _store().glob(pattern)
    import tensorflow as tf

    return sorted(tf.io.gfile.glob(pattern))


def size(path: str) -> int:
    """The file's size in bytes."""
    if reader_for(path) == "boto3":
        return _store().size(path)
    import tensorflow as tf

    try:
        return tf.io.gfile.stat(path).length
    except tf.errors.OpError as err:
        raise StorageError(f"Cannot read {path}: {err.message}. Check that it exists and is readable.") from err


def exists(path: str) -> bool:
    """Whether the file exists."""
    if reader_for(path) == "boto3":
        return _store().exists(path)
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def open_file(path: str, mode: str = "rb") -> Any:
    """A file object for ``path`` ('r', 'rb', 'w' or 'wb')."""
    if reader_for(path) == "boto3":
        return _store().open(path, mode)
    import tensorflow as tf

    return tf.io.gfile.GFile(path, mode)


def remove(path: str) -> None:
    """Deletes the file (or object) ``path``."""
    if reader_for(path) == "boto3":
        _store().remove(path)
        return
    import tensorflow as tf

    try:
        tf.io.gfile.remove(path)
    except tf.errors.OpError as err:
        raise StorageError(f"Cannot remove {path}: {err.message}. Check your access to it.") from err


def readable_path(path: str) -> str:
    """A path TensorFlow's readers can open: ``path`` itself, or a staged local copy of an object."""
    return _store().stage(path) if reader_for(path) == "boto3" else path


def writable_path(path: str) -> tuple[str, Callable[[], None]]:
    """(a path TensorFlow's writers can write, a function to call after closing it)."""
    if reader_for(path) != "boto3":
        return path, lambda: None
    import tempfile

    store = _store()
    fd, local = tempfile.mkstemp(prefix="write-", dir=store.cache_dir)
    os.close(fd)

    def finish() -> None:
        try:
            store.upload(local, path)
        finally:
            os.unlink(local)

    return local, finish


def staged_files(
    files: Any, paths: Sequence[str], *, ahead: int = _STAGE_AHEAD, on_server: bool = False
) -> tuple[Any, Callable[[Any, Any], Any]]:
    """Stages a ``tf.data`` dataset of paths for reading: ((path, readable path) pairs, ``ready``).

    Call ``ready(path, readable)`` inside the function that opens the file: it
    returns the path to open, once it can be opened. For TF-native paths the
    pair is (path, path) and ``ready`` returns it at once. Objects served by
    boto3 are staged ``ahead`` files (at least 4) before the reader, in order:

    - in this process, from a ``tf.py_function`` with the process's
      :func:`~tfdist.data.storage.s3.store` (a dataset built eagerly, to be read here);
    - by the staging agent of the TF server that runs the pipeline
      (:mod:`tfdist.data.storage.staging`), when the dataset is built inside a traced
      function (ParameterServerStrategy's worker datasets) or ``on_server``
      (it goes to the tf.data service).
    """
    import tensorflow as tf

    if not paths or reader_for(paths[0]) != "boto3":
        return files.map(lambda path: (path, path)), lambda path, local: local
    ahead = min(len(paths), max(ahead, _STAGE_AHEAD))
    store = _store()
    if on_server or not tf.executing_eagerly():
        from tfdist.data.storage.staging import StagedReads

        reads = StagedReads({path: store.version(path) for path in paths})
        _log.info(
            "Input pipeline reads %d s3:// object(s) through the staging agents of the TF servers that run "
            "it (stage root %s).",
            len(paths),
            reads.root,
        )
        return reads.request(files, ahead=ahead), reads.wait

    def stage(path: Any) -> Any:
        return store.stage(path.numpy().decode())

    def pair(path: Any) -> Any:
        local = tf.py_function(stage, [path], tf.string)
        local.set_shape([])
        return path, local

    return files.map(pair, num_parallel_calls=ahead, deterministic=True).prefetch(ahead), lambda path, local: local
