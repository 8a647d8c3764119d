"""Gradient all-reduce with compression, splitting and packing, for replica context.

TensorFlow's collectives all-reduce what they are given: float32 gradients at
full width, one big tensor as one big message, packs only as large as the
strategy says. :func:`all_reduce_sum` adds what Horovod users expect:

* **compression** to float16 or bfloat16 on the wire and back. For float16 the
  gradients are first multiplied by a power of two chosen so that no partial
  sum can exceed float16's range (65504): one extra scalar all-reduce per step
  carries each replica's largest magnitude. Scaling by a power of two is exact,
  small gradients keep their precision, and non-finite gradients stay
  non-finite, so a ``LossScaleOptimizer`` still sees an overflow and skips the
  step. bfloat16 has float32's range and needs no scaling.
* **splitting** of large tensors into pieces of ``split_bytes``, which TF's
  gRPC ring moves faster than one large message (see BENCHMARKS.md).
* **packing** via ``bytes_per_pack`` (TF's own ``CommunicationOptions``).

Example:
    >>> from tfdist.comm import CollectiveConfig
    >>> CollectiveConfig(compression="fp16", bytes_per_pack=4 << 20).wire_dtype_name
    'float16'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfdist.comm.casts import NoCompression
from tfdist.comm.compressor import Compressor, ErrorFeedback, WireCast
from tfdist.comm.registry import compressor_for, registered_compressors
from tfdist.errors import StrategyError, require_int

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "COMPRESSORS",
    "GRADIENT_COMPRESSIONS",
    "CollectiveConfig",
    "all_reduce_sum",
    "gradient_value_bytes",
    "payload_bytes",
    "wire_bytes",
]

# The built-in gradient compressions by name (tfdist.comm.registry: registered_compressors() lists all).
# Casts: the dtype float32 gradients travel as. Not file compression: that is
# tfdist.data.records.writer.COMPRESSIONS.
GRADIENT_COMPRESSIONS = tuple(registered_compressors(WireCast))
# Compressors that send fewer values, each replica keeping what it did not send (error feedback): rank-r
# factors (tfdist.comm.powersgd) or the largest entries (tfdist.comm.topk). Float32 on the wire.
COMPRESSORS = tuple(registered_compressors(ErrorFeedback))
# CollectiveConfig's keywords for the options of a compressor given by name (PowerSGD's, top-k's).
_NAMED_OPTIONS = ("rank", "density")
_MAX_EXPONENT = 60  # Keep the scale (2**e) well inside float32's range.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectiveConfig:
    """How gradients travel in an all-reduce.

    Args:
      compression: The gradient compressor: a typed config such as ``BFloat16()``, ``PowerSGD(rank=2)`` or
        ``TopK(density=0.05)``, or its registered name: 'none', 'fp16' or 'bf16' (the dtype on the wire);
        'powersgd' or 'topk' (fewer values, with error feedback: :data:`COMPRESSORS`).
      bytes_per_pack: Pack tensors into all-reduces of about this many bytes;
        0 keeps the strategy's setting.
      split_bytes: Split tensors larger than this into pieces before packing;
        0 never splits.
      rank: PowerSGD's rank, with compression='powersgd' by name (default 4); refused with any other.
      density: The share of each gradient's entries top-k sends, with compression='topk' by name
        (default 0.01); refused with any other.

    Attributes:
      compressor: The typed compressor config, built from ``compression`` (and ``rank`` or ``density``).
        Two configs are equal when their compressors and packing are.

    Example:
        >>> CollectiveConfig().compression
        'none'
        >>> CollectiveConfig(compression="powersgd", rank=2).compressor
        PowerSGD(rank=2, warmup_steps=25, min_compression_rate=2.0)
    """

    compression: str | Compressor = dataclasses.field(default="none", compare=False, repr=False)
    bytes_per_pack: int = 0
    split_bytes: int = 0
    rank: int | None = dataclasses.field(default=None, compare=False, repr=False)
    density: float | None = dataclasses.field(default=None, compare=False, repr=False)
    compressor: WireCast | ErrorFeedback = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        named = {key: getattr(self, key) for key in _NAMED_OPTIONS if getattr(self, key) is not None}
        compressor = compressor_for(self.compression, named, kind=(WireCast, ErrorFeedback))
        object.__setattr__(self, "compressor", compressor)
        require_int(
            StrategyError, "bytes_per_pack", self.bytes_per_pack, minimum=0, fix="Use 0 to keep the strategy's packing."
        )
        require_int(StrategyError, "split_bytes", self.split_bytes, minimum=0, fix="Use 0 to never split.")

    @property
    def wire_dtype_name(self) -> str | None:
        """The dtype gradients travel as, or None for their own."""
        return self.compressor.wire_dtype if isinstance(self.compressor, WireCast) else None


def gradient_value_bytes(compression: Any) -> int:
    """Bytes one float32 gradient value takes on the wire under ``compression`` (a name or a compressor).

    Example:
        >>> gradient_value_bytes("none"), gradient_value_bytes("bf16")
        (4, 2)
    """
    return compressor_for(compression).value_bytes


def payload_bytes(tensors: Sequence[Any], config: CollectiveConfig) -> int:
    """Bytes handed to the gradient all-reduce for ``tensors`` (static shapes), per replica: in the wire
    dtype of a cast, else as they are.

    Example:
        >>> import numpy as np
        >>> payload_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="bf16"))
        2000
    """
    cast = config.compressor if isinstance(config.compressor, WireCast) else NoCompression()
    return cast.payload_bytes(tensors)


def wire_bytes(tensors: Sequence[Any], config: CollectiveConfig) -> int:
    """Bytes one replica hands to the collectives per step for ``tensors``: the payload, plus fp16's float32
    range scalar; PowerSGD's factors and whole tensors (and after its warm-up one value of it), or top-k's
    values and int32 indices.

    Example:
        >>> import numpy as np
        >>> wire_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="fp16"))
        2004
        >>> wire_bytes([np.zeros([512, 256], np.float32)], CollectiveConfig(compression="powersgd", rank=4))
        12292
        >>> wire_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="topk", density=0.01))
        80
    """
    return config.compressor.wire_bytes(tensors)


def _split(flat: tf.Tensor, piece_elems: int) -> list[tf.Tensor]:
    import tensorflow as tf

    n = int(flat.shape[0])
    sizes = [piece_elems] * (n // piece_elems) + ([n % piece_elems] if n % piece_elems else [])
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


def _range_scale(tensors: Sequence[tf.Tensor], context: Any, wire_max: float) -> tf.Tensor:
    """A power of two that keeps every partial sum of ``tensors`` within ``wire_max`` (float16's range)."""
    import tensorflow as tf

    local_max = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(tf.cast(t, tf.float32))) for t in tensors]))
    # The sum of every replica's largest magnitude bounds every element of every partial sum.
    bound = context.all_reduce(tf.distribute.ReduceOp.SUM, local_max)
    exponent = tf.floor(tf.math.log(wire_max / 2.0 / bound) / math.log(2.0))
    # bound == 0 gives +inf: any scale works, use 1. A non-finite bound gives -inf/NaN: keep it non-finite.
    exponent = tf.where(tf.math.is_inf(exponent) & (exponent > 0), tf.zeros_like(exponent), exponent)
    exponent = tf.clip_by_value(exponent, -_MAX_EXPONENT, _MAX_EXPONENT)
    scale = tf.pow(2.0, exponent)
    return tf.where(tf.math.is_finite(bound), scale, tf.constant(math.nan))


def all_reduce_sum(tensors: Sequence[tf.Tensor], config: CollectiveConfig, context: Any = None) -> list[tf.Tensor]:
    """Sums dense ``tensors`` over all replicas; call in replica context.

    Every replica must call it with the same shapes, in the same order.

    Args:
      tensors: Dense tensors (e.g. gradients), any float dtype.
      config: Compression, packing and splitting.
      context: The replica context; default the current one.

    Returns:
      The sums, in the input's shapes and dtypes.
    """
    import tensorflow as tf

    context = context or tf.distribute.get_replica_context()
    if not tensors:
        return []
    cast = config.compressor if isinstance(config.compressor, WireCast) else NoCompression()
    wire = tf.as_dtype(cast.wire_dtype) if cast.wire_dtype else None
    scale = _range_scale(tensors, context, cast.wire_max) if cast.wire_max is not None else None
    pieces, layout = [], []
    for tensor in tensors:
        flat = tf.reshape(tensor, [-1])
        if scale is not None:
            flat = tf.cast(flat, tf.float32) * scale
        if wire is not None:
            flat = tf.cast(flat, wire)
        if (
            config.split_bytes
            and flat.shape[0] is not None
            and int(flat.shape[0]) * flat.dtype.size > config.split_bytes
        ):
            parts = _split(flat, max(1, config.split_bytes // flat.dtype.size))
        else:
            parts = [flat]
        layout.append(len(parts))
        pieces.extend(parts)
    packed = config.bytes_per_pack if all(piece.shape.is_fully_defined() for piece in pieces) else 0  # sizes known
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=packed)
    reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, pieces, options=options)
    out, start = [], 0
    for tensor, count in zip(tensors, layout):
        parts = reduced[start : start + count]
        start += count
        flat = parts[0] if count == 1 else tf.concat(parts, axis=0)
        if scale is not None:
            flat = tf.cast(flat, tf.float32) / scale
        out.append(tf.reshape(tf.cast(flat, tensor.dtype), tf.shape(tensor)))
    return out
