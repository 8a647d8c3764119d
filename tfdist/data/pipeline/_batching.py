"""Batching a finite stream without losing records silently.

By default every record of a finite epoch is kept: the last batch of a worker
may be partial, and tf.distribute handles partial and uneven batches
(MultiWorkerMirroredStrategy reads with ``get_next_as_optional``). A static
batch (``drop_remainder=True``) is the user's explicit choice, and what it
drops is logged with the count.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tfdist import _compat

_log = logging.getLogger("tfdist.data")


def _log_dropped(where: str, batch_size: int, size: Any) -> bool:
    """Logs one dropped partial batch (called from the input pipeline); returns False (drop it)."""
    _log.warning(
        "drop_remainder=True: input pipeline %s drops its last partial batch: %d record(s) not read "
        "(batch %d). Pass drop_remainder=False to keep every record.",
        where,
        int(size),
        batch_size,
    )
    return False


def batch(
    dataset: Any,
    batch_size: int,
    *,
    drop_remainder: bool,
    finite: bool,
    where: str,
    logged: bool = True,
    parallel: bool = False,
    deterministic: bool | None = None,
    chunks: bool = False,
) -> Any:
    """``dataset.batch(batch_size)``; with ``drop_remainder`` the dropped records are logged with their count.

    Args:
      dataset: Elements to batch.
      batch_size: Elements per batch.
      drop_remainder: Drop a final partial batch (static batch dimension).
      finite: Whether ``dataset`` ends. An endless stream has no remainder: its batches are
        given a static size whatever ``drop_remainder`` says.
      where: Names the input pipeline in the log line, e.g. ``"1/2"``.
      logged: Count dropped records at run time (a Python callback in the
        pipeline). False where the pipeline runs outside this process (tf.data
        service, parameter-server workers): the warning is then logged once,
        now, without an exact count.
      parallel: Batch with ``num_parallel_calls=AUTOTUNE``.
      deterministic: Passed on with ``parallel``.
      chunks: ``dataset``'s elements are runs of records (1-D): ``rebatch``
        them into batches of ``batch_size`` records.

    Returns:
      The batched dataset.
    """
    import tensorflow as tf

    kwargs: dict[str, Any] = (
        {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": deterministic} if parallel and not chunks else {}
    )

    def batched(drop: bool) -> Any:
        if chunks:
            return _compat.rebatch_dense(dataset, batch_size, drop_remainder=drop)
        return dataset.batch(batch_size, drop_remainder=drop, **kwargs)

    if not drop_remainder or not finite:
        # An endless stream never ends in a partial batch: its batches get a static size whatever
        # drop_remainder says (a DTensor mesh needs one), and a finite one without drop_remainder keeps all.
        return batched(not finite)
    if not logged:
        _log.warning(
            "drop_remainder=True: input pipeline %s drops its last partial batch (up to %d records per "
            "pass). Pass drop_remainder=False to keep every record.",
            where,
            batch_size - 1,
        )
        return batched(True)
    report = functools.partial(_log_dropped, where, batch_size)

    # tf.data passes a tuple element's parts as separate arguments: take them back as one element.
    def full(*parts: Any) -> Any:
        size = tf.shape(tf.nest.flatten(parts)[0], out_type=tf.int64)[0]
        return tf.cond(
            tf.equal(size, batch_size),
            lambda: tf.constant(True),
            lambda: tf.reshape(tf.py_function(report, [size], tf.bool), []),
        )

    def static(*parts: Any) -> Any:
        shaped = tf.nest.map_structure(
            lambda t: tf.ensure_shape(t, [batch_size] + t.shape[1:].as_list()) if isinstance(t, tf.Tensor) else t,
            parts,
        )
        return shaped[0] if len(shaped) == 1 else shaped

    return batched(False).filter(full).map(static)
