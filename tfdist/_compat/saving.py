"""Checkpoint writing internals: a ``tf.train.Checkpoint`` write whose shards are merged after a barrier.

On a multi-process DTensor mesh, ``tf.train.Checkpoint`` writes each process's shards and merges them in one
function per process. DTensor turns that merge into "the first device merges whatever shard files it finds"
(``allow_missing_files``), then deletes ``ckpt-N_temp``, with nothing that waits for the other processes'
writes: a process still writing there fails (``NotFoundError`` on its shard), or its shard is left out.
DTensor's own ``sharded_save`` puts a barrier between the writes and the merge. Here, inside
:func:`deferred_merge` (given the checkpoint's prefix), the merge in the save function goes to a scratch
checkpoint in ``ckpt-N_temp`` and deletes nothing; once every process is past a barrier,
:func:`merge_shards` merges the scratch and any shard written after it into the checkpoint, and deletes
``ckpt-N_temp``. (Leaving the merge out instead leaves nothing for DTensor to run: the writes are dropped too.)

Example:
    >>> with deferred_merge("/tmp/ckpt-1"):
    ...     merging_deferred()
    True
    >>> merging_deferred()
    False
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tfdist._compat._common import _missing
from tfdist.errors import StorageError

T = TypeVar("T")
_DEFERRED = threading.local()
_INSTALL = threading.Lock()


def merging_deferred() -> bool:
    """Whether this thread is inside :func:`deferred_merge`."""
    return getattr(_DEFERRED, "prefix", None) is not None


def _may_be(destination: Any, prefix: str) -> bool:
    """Whether a merge's destination is ``prefix``, or may be (a traced function's tensor has no value yet)."""
    import tensorflow as tf

    value = destination if isinstance(destination, (str, bytes)) else tf.get_static_value(destination)
    if value is None:
        return True
    return (value.decode() if isinstance(value, bytes) else str(value)) == prefix


class _DeferringIoOps:
    """TF's ``gen_io_ops`` as ``functional_saver`` sees it: the same, but a merge inside :func:`deferred_merge`
    goes to a scratch checkpoint, ``<prefix>_temp/merged``, and deletes no directory (the writes it
    depends on run as before)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def merge_v2_checkpoints(self, checkpoint_prefixes: Any, destination_prefix: Any, **kwargs: Any) -> Any:
        if not merging_deferred() or not _may_be(destination_prefix, _DEFERRED.prefix):
            return self._real.merge_v2_checkpoints(checkpoint_prefixes, destination_prefix, **kwargs)
        # A Python string: DTensor has no layout for string ops in the save function (``tf.StringJoin``).
        scratch = _DEFERRED.prefix + "_temp/merged"
        return self._real.merge_v2_checkpoints(checkpoint_prefixes, scratch, **{**kwargs, "delete_old_dirs": False})


def _install() -> None:
    """Puts :class:`_DeferringIoOps` between ``functional_saver`` and ``gen_io_ops`` (once per process)."""
    try:
        from tensorflow.python.checkpoint import functional_saver
    except ImportError:
        raise _missing("tensorflow.python.checkpoint.functional_saver", "mesh backups") from None
    with _INSTALL:
        current = getattr(functional_saver, "gen_io_ops", None)
        if current is None or not hasattr(current, "merge_v2_checkpoints"):
            raise _missing("functional_saver.gen_io_ops.merge_v2_checkpoints", "mesh backups")
        if not isinstance(current, _DeferringIoOps):
            functional_saver.gen_io_ops = _DeferringIoOps(current)


@contextlib.contextmanager
def deferred_merge(file_prefix: str) -> Iterator[None]:
    """Checkpoint writes to ``file_prefix`` in this thread, within the block, leave their shards unmerged (a
    scratch checkpoint and the shards written after it, under ``file_prefix + "_temp"``): :func:`merge_shards`
    ends them."""
    _install()
    before = getattr(_DEFERRED, "prefix", None)
    _DEFERRED.prefix = str(file_prefix)
    try:
        yield
    finally:
        _DEFERRED.prefix = before


def merge_shards(file_prefix: str) -> bool:
    """Merges what a deferred write left for ``file_prefix`` (its scratch checkpoint, and shards written after
    it) into the checkpoint, on this process's CPU, and deletes ``file_prefix + "_temp"``.

    Returns False when there is nothing to merge (the write merged itself, or wrote nothing).
    """
    import tensorflow as tf

    shards = tf.io.gfile.glob(file_prefix + "_temp/*.index") + tf.io.gfile.glob(file_prefix + ".part-*.index")
    if not shards:
        return False
    prefixes = sorted(shard[: -len(".index")] for shard in shards)
    with tf.device("/device:CPU:0"):  # This host, not the mesh: one process merges.
        tf.raw_ops.MergeV2Checkpoints(
            checkpoint_prefixes=prefixes, destination_prefix=file_prefix, delete_old_dirs=True
        )
    return True


def merge_round(file_prefix: str, *, leader: bool, barrier: Callable[[], None]) -> None:
    """After a deferred write on every process: ``barrier`` (each waits for its own save first, so every shard
    is written), the ``leader`` merges (:func:`merge_shards`), ``barrier`` again (merged before anyone goes on)."""
    barrier()
    if leader:
        merge_shards(file_prefix)
    barrier()


def merged_after_barrier(write: Callable[[], T], file_prefix: str, *, leader: bool, barrier: Callable[[], None]) -> T:
    """Runs ``write`` (a checkpoint write to ``file_prefix`` on every process of a mesh) with its merge deferred,
    then: ``barrier`` (every process's shards written), the ``leader`` merges them, ``barrier`` again.

    Raises :class:`tfdist.errors.StorageError` on every process if there is no checkpoint at ``file_prefix``
    then (the write went elsewhere: its shards would stay unmerged).

    Example:
        >>> import os, tempfile, tensorflow as tf
        >>> prefix = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> checkpoint = tf.train.Checkpoint(v=tf.Variable(3.0))
        >>> merged_after_barrier(lambda: checkpoint.write(prefix), prefix, leader=True, barrier=lambda: None) == prefix
        True
    """
    import tensorflow as tf

    with deferred_merge(file_prefix):
        result = write()
    merge_round(file_prefix, leader=leader, barrier=barrier)
    if not tf.io.gfile.exists(file_prefix + ".index"):
        raise StorageError(
            f"The checkpoint write left no checkpoint at {file_prefix!r} after its merge: its shards were "
            "expected under that prefix.",
            field="filepath",
            value=file_prefix,
            expected="a checkpoint at that prefix once every process wrote its shards",
            fix="Report it at tfdist's issue tracker with the path and the TensorFlow version.",
        )
    return result
