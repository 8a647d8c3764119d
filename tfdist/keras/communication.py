"""Cheaper gradient communication for ``model.fit``: compression and packing.

:func:`with_communication` returns a copy of a tf-keras or Keras 3 optimizer whose
gradient all-reduce goes through :func:`tfdist.comm.collective.all_reduce_sum`:

* ``compression='fp16'`` or ``'bf16'`` halves the bytes on the wire. float16
  is range-scaled by a power of two so sums cannot overflow, and non-finite
  gradients stay non-finite, so ``LossScaleOptimizer`` (mixed precision)
  still detects an overflow and skips the step.
* ``compression=PowerSGD(rank=4)`` (or ``'powersgd'``, ``rank=``) sends each weight matrix's gradient as
  two rank-``r`` factors, ``compression=TopK(density=0.01)`` (or ``'topk'``, ``density=``) only its largest
  entries; each worker keeps what it did not send and adds it to its next gradient (error feedback, any
  :class:`tfdist.comm.ErrorFeedback` compressor of the registry). That state lives in optimizer variables,
  so checkpoints and backups carry it (tf-keras optimizers only: a Keras 3 optimizer takes the casts and the
  packing, and refuses these with a StrategyError).
* ``bytes_per_pack`` / ``split_bytes`` (or ``tuning=``, the autotuner's JSON)
  set how gradients are cut into all-reduces.

Gradient accumulation (one all-reduce per k micro-batches) is
:func:`tfdist.keras.accumulate_gradients`; the two combine.

Example:
    >>> import tf_keras
    >>> from tfdist.keras import with_communication
    >>> opt = with_communication(tf_keras.optimizers.SGD(0.1), compression="bf16", bytes_per_pack=4 << 20)
    >>> opt.communication.compression, opt.communication.bytes_per_pack
    ('bf16', 4194304)
"""

from __future__ import annotations

import functools
import os
from typing import Any

from tfdist import _compat
from tfdist.comm.collective import CollectiveConfig, all_reduce_sum, wire_bytes
from tfdist.comm.compressor import Compressor, ErrorFeedback
from tfdist.errors import StrategyError, invalid
from tfdist.keras import _compressors
from tfdist.keras._builders import refuse_mesh

__all__ = ["with_communication"]


def with_communication(
    optimizer: Any,
    *,
    compression: str | Compressor = "none",
    bytes_per_pack: int = 0,
    split_bytes: int = 0,
    tuning: str | os.PathLike[str] | Any | None = None,
    rank: int | None = None,
    density: float | None = None,
) -> Any:
    """A copy of ``optimizer`` that communicates gradients as configured.

    Args:
      optimizer: A tf-keras optimizer (``tf_keras.optimizers.SGD``, ``Adam``...) or a Keras 3 one
        (``keras.optimizers.SGD``...), not yet used. Create it, and call this, under the strategy's scope.
      compression: The gradient compressor, typed (``BFloat16()``, ``PowerSGD(rank=2)``, ``TopK()``) or by
        name: the wire dtype 'none', 'fp16', 'bf16'; or a compressor with error feedback: 'powersgd', 'topk'.
      bytes_per_pack: Pack size of the all-reduce (0: the strategy's setting).
      split_bytes: Split larger gradients into pieces of this size (0: never).
      tuning: A ``CollectiveTuning`` or its JSON path; supplies
        ``bytes_per_pack`` and ``split_bytes`` (explicit arguments win).
      rank: PowerSGD's rank, with compression='powersgd' (default 4).
      density: The share of each gradient's entries sent, with compression='topk' (default 0.01).

    Returns:
      An optimizer of a subclass of ``type(optimizer)`` with the same config.
      ``communication_bytes_per_step`` tells the bytes each replica hands to the
      gradient all-reduce per applied update, counted from the tensors traced
      into it (None before the first step). ``compression_variables`` lists
      the compressor's state (errors, Q factors, PowerSGD's warm-up steps).

    Raises:
      StrategyError: An invalid setting, an optimizer that is not a tf-keras
        ``Optimizer``, or a compressor under a strategy it cannot run in
        (parameter servers, a DTensor mesh).
    """
    named = compression.name if isinstance(compression, Compressor) else compression
    if named != "none" or bytes_per_pack or split_bytes or tuning is not None:
        refuse_mesh("compression", named, "with_communication", optimizer=optimizer)
    keras3 = _compat.is_keras3_optimizer(optimizer)
    tf_keras = _compat.installed_tf_keras()  # None: tf-keras is not installed, only a Keras 3 optimizer can be.
    if not keras3 and not (tf_keras is not None and isinstance(optimizer, tf_keras.optimizers.Optimizer)):
        raise invalid(
            StrategyError,
            "optimizer",
            type(optimizer).__name__,
            "a tf_keras.optimizers.Optimizer or a Keras 3 optimizer",
            "Pass e.g. tf_keras.optimizers.SGD(...) or keras.optimizers.SGD(...); legacy optimizers are not supported.",
        )
    if tuning is not None:
        from tfdist.comm.autotune import CollectiveTuning

        loaded = CollectiveTuning.of(tuning)
        bytes_per_pack = bytes_per_pack or loaded.bytes_per_pack
        split_bytes = split_bytes or loaded.split_bytes
    config = CollectiveConfig(
        compression=compression, bytes_per_pack=bytes_per_pack, split_bytes=split_bytes, rank=rank, density=density
    )
    if isinstance(config.compressor, ErrorFeedback):
        _check_compressor_strategy(config.compressor.name, keras3=keras3)
    base = type(optimizer)
    if issubclass(base, _CommunicationMixin) or "_tfdist" in vars(optimizer):
        raise invalid(
            StrategyError,
            "optimizer",
            base.__name__,
            "an optimizer not wrapped yet",
            "Call with_communication on the original optimizer once.",
        )
    if keras3:
        return _compat.reducing_optimizer(
            optimizer,
            config=config,
            reduce=lambda grads: all_reduce_sum(list(grads), config),
            measure=lambda grads: wire_bytes(grads, config),
            reporting=_Reporting,
        )
    # arg-type: mypy does not see a class as Hashable (it checks the unbound object.__hash__); classes hash.
    new = _subclass(base).from_config(optimizer.get_config())  # type: ignore[arg-type]
    new._tfdist_setup(config)
    return new


def _check_compressor_strategy(compression: str, *, keras3: bool = False) -> None:
    """A StrategyError where a compressor cannot run: a Keras 3 optimizer (no place for its per-replica state),
    parameter servers (no all-reduce to replace)."""
    import tensorflow as tf

    if keras3:
        raise invalid(
            StrategyError,
            "compression",
            compression,
            "'none', 'fp16' or 'bf16' with a Keras 3 optimizer (an error-feedback compressor keeps each replica's "
            "own error between steps; Keras 3 saves one value per optimizer variable, so its backups would merge "
            "the replicas' errors)",
            "Use compression='bf16' (or 'fp16') with the Keras 3 optimizer, or build the model with tf-keras "
            "(`from tfdist import keras`) for PowerSGD and top-k.",
        )

    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise invalid(
            StrategyError,
            "compression",
            compression,
            "no compressor under ParameterServerStrategy (workers send their gradients to the parameter "
            "servers, not to each other: there is no all-reduce to compress)",
            "Use MultiWorkerMirroredStrategy for PowerSGD or top-k, or train on parameter servers without compression.",
        )


@functools.cache
def _subclass(base: type) -> type[Any]:
    return type(f"Communicating{base.__name__}", (_CommunicationMixin, base), {"__module__": __name__})


class _Reporting:
    """What an optimizer of :func:`with_communication` tells (tf-keras and Keras 3 alike), from its ``_tfdist``."""

    _tfdist: dict[str, Any]  # Set by _tfdist_setup (Keras 3: reducing_optimizer); an annotation only.

    @property
    def communication(self) -> CollectiveConfig:
        return self._tfdist["config"]

    @property
    def communication_bytes_per_step(self) -> int | None:
        return self._tfdist["bytes"]

    @property
    def compression_variables(self) -> list[Any]:
        """The compressor's state variables (each error, each PowerSGD Q and warm-up count), in the order they
        were created at the first step; empty before it, and without a compressor."""
        return list(self._tfdist.get("states", {}).values())


class _CommunicationMixin(_Reporting):
    """Overrides the tf-keras ``Optimizer`` hooks for aggregation and application."""

    def _tfdist_setup(self, config: CollectiveConfig) -> None:
        # object.__setattr__: a plain dict, out of Keras' automatic tracking (and so out of checkpoints).
        object.__setattr__(self, "_tfdist", {"config": config, "bytes": None})
        if isinstance(config.compressor, ErrorFeedback):
            # The compressors' errors and Q factors, created at the first step, keyed "0", "1"... in order: a
            # dict the optimizer tracks, so checkpoints carry them (tfdist.keras._compressors). Not a list:
            # tf-keras checkpoints a copy of an optimizer's list attributes, made once, so a restore before
            # the first step would never reach the state created in it.
            self.tfdist_compression_state: dict[str, Any] = {}

    def aggregate_gradients(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        import tensorflow as tf

        pairs = [pair for pair in grads_and_vars if pair[0] is not None]
        dense = [i for i, (g, _) in enumerate(pairs) if not isinstance(g, tf.IndexedSlices)]
        sparse = [i for i, (g, _) in enumerate(pairs) if isinstance(g, tf.IndexedSlices)]
        config = self._tfdist["config"]
        grads = [pairs[i][0] for i in dense]
        self._tfdist["bytes"] = wire_bytes(grads, config)
        out = list(pairs)
        if isinstance(config.compressor, ErrorFeedback):
            if sparse and not self._tfdist.get("sparse_logged"):
                self._tfdist["sparse_logged"] = True
                _compressors.log_sparse(config, [pairs[i][1] for i in sparse])
            summed = _compressors.aggregate(self, grads, [pairs[i][1] for i in dense], config.compressor, config)
        else:
            summed = all_reduce_sum(grads, config)
        for i, grad in zip(dense, summed):
            out[i] = (grad, pairs[i][1])
        if sparse:  # IndexedSlices (embedding rows) keep TF's own sparse aggregation.
            merged = super().aggregate_gradients([pairs[i] for i in sparse])  # type: ignore[misc]
            for i, pair in zip(sparse, merged):
                out[i] = pair
        return out
