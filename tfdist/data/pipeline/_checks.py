"""Checks a pipeline build runs that say what is wrong before anything is read: the cache path, and a
worker share smaller than one batch."""

from __future__ import annotations

import logging
import os
from typing import Any

from tfdist.data.pipeline._context import PipelineSlot
from tfdist.data.sharding import ShardPlan
from tfdist.errors import DataError, invalid

_log = logging.getLogger("tfdist.data")


def check_cache_path(cache: Any) -> None:
    """Refuses a ``cache`` file path whose directory does not exist (``cache=True`` caches in memory).

    Example:
        >>> check_cache_path(True)
        >>> check_cache_path("/no/such/dir/cache")
        Traceback (most recent call last):
        ...
        tfdist.errors.DataError: Invalid value for `cache`. Received: '/no/such/dir/cache'. Expected a file path ...
    """
    if isinstance(cache, str):
        import tensorflow as tf

        parent = os.path.dirname(cache) or "."
        if "://" not in parent and not tf.io.gfile.isdir(parent):
            raise invalid(
                DataError,
                "cache",
                cache,
                "a file path in an existing directory",
                f"Create {parent} first, or pass cache=True to cache in memory.",
            )


def share_of(known: int | None, plan: ShardPlan, where: PipelineSlot) -> int | None:
    """Records this worker reads of the ``known`` records of its files (None: unknown, or hashed)."""
    if known is None or plan.policy == "hash":
        return None
    if plan.policy == "data":
        return known // plan.num_workers + (where.index < known % plan.num_workers)
    return known


def warn_small_share(share: int | None, where: PipelineSlot, *, num_epochs: int | None, drop_remainder: bool) -> None:
    """Logs when this worker's share is smaller than one batch (with drop_remainder: no batch at all)."""
    if share is None or share >= where.batch_size or num_epochs is None:
        return
    outcome = (
        "with drop_remainder=True it yields no batch at all" if drop_remainder else "each epoch is one partial batch"
    )
    _log.warning(
        "Input pipeline %d/%d reads %d record(s), fewer than one batch of %d: %s.",
        where.index,
        where.count,
        share,
        where.batch_size,
        outcome,
    )
