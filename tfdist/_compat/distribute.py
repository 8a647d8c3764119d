"""TensorFlow runtime internals: strategies, sharded variables, errors, coordination, tf.data service."""

from __future__ import annotations

import sys
from typing import Any

from tfdist._compat._common import _attr, _missing


def stop_data_server(server: Any) -> None:
    """Stops an in-process tf.data service dispatcher or worker (TF has no public stop)."""
    _attr(server, "_stop", "LocalDataService.stop")()


def communication_options(strategy: Any) -> Any:
    """The ``CommunicationOptions`` a MultiWorkerMirroredStrategy merges into every all-reduce."""
    return _attr(
        _attr(strategy, "extended", "communication_options"), "_communication_options", "communication_options"
    )


def _sharded_variable_class() -> type:
    try:
        from tensorflow.python.distribute.sharded_variable import ShardedVariable
    except ImportError:
        raise _missing(
            "tensorflow.python.distribute.sharded_variable.ShardedVariable", "embedding_layout/local_weights"
        ) from None
    return ShardedVariable


def is_sharded_variable(value: Any) -> bool:
    """Whether ``value`` is a ParameterServerStrategy ``ShardedVariable`` (no public class exists)."""
    return isinstance(value, _sharded_variable_class())


def is_tf_error(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is one of ``tf.errors.<name>`` (without importing TensorFlow if nothing has yet)."""
    tf = sys.modules.get("tensorflow")
    classes = tuple(c for c in (getattr(getattr(tf, "errors", None), n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(exc, classes)


def wait_for_coordinated_peers(barrier_id: str, timeout_seconds: float) -> str | None:
    """Blocks until every task of this process's TF coordination service reached ``barrier_id``.

    Returns None once they all did, else why not (TensorFlow not loaded, no coordination service, a timeout,
    or the leader gone: it hosts the service and may exit as soon as the barrier passes, before its answer
    reaches the others). Never raises. The barrier itself is ``context.wait_at_barrier`` (no public API).
    """
    tf_context = sys.modules.get("tensorflow.python.eager.context")
    if tf_context is None:
        return "TensorFlow is not loaded"
    ctx = tf_context.context()
    if getattr(ctx, "coordination_service", None) is None:
        return "this process configured no coordination service"
    try:
        ctx.wait_at_barrier(barrier_id, int(timeout_seconds * 1000))
    except Exception as exc:  # TF's errors, or a stack without the method: the caller goes on either way
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def is_variable(value: Any) -> bool:
    """A ``tf.Variable`` (mirrored and PS variables included) or a ``ShardedVariable``."""
    import tensorflow as tf

    return isinstance(value, tf.Variable) or is_sharded_variable(value)
