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

from tfdist._names import describe_choices
from tfdist.comm.powersgd import check_rank, lowrank_value_count
from tfdist.comm.topk import topk_count
from tfdist.errors import StrategyError, invalid, require_int

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

# Gradient compression -> the dtype float32 gradients travel as (None: unchanged). Not file compression:
# that is tfdist.data.records.writer.COMPRESSIONS.
_WIRE_DTYPES = {"none": None, "fp16": "float16", "bf16": "bfloat16"}
GRADIENT_COMPRESSIONS = tuple(_WIRE_DTYPES)
# Compressors that send fewer values, each replica keeping what it did not send (error feedback): rank-r
# factors (tfdist.comm.powersgd) or the largest entries (tfdist.comm.topk). Float32 on the wire.
COMPRESSORS = ("powersgd", "topk")
_CHOICES = GRADIENT_COMPRESSIONS + COMPRESSORS
_FP16_MAX = 65504.0
_MAX_EXPONENT = 60  # Keep the scale (2**e) well inside float32's range.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectiveConfig:
    """How gradients travel in an all-reduce.

    Args:
      compression: 'none', 'fp16' or 'bf16': the dtype on the wire; 'powersgd' or 'topk': fewer values,
        with error feedback (:data:`COMPRESSORS`).
      bytes_per_pack: Pack tensors into all-reduces of about this many bytes;
        0 keeps the strategy's setting.
      split_bytes: Split tensors larger than this into pieces before packing;
        0 never splits.
      rank: PowerSGD's rank (compression='powersgd').
      density: The share of each gradient's entries top-k sends (compression='topk').

    Example:
        >>> CollectiveConfig().compression
        'none'
    """

    compression: str = "none"
    bytes_per_pack: int = 0
    split_bytes: int = 0
    rank: int = 4
    density: float = 0.01

    def __post_init__(self) -> None:
        if not isinstance(self.compression, str) or self.compression not in _CHOICES:
            raise invalid(StrategyError, "compression", self.compression, describe_choices(self.compression, _CHOICES))
        check_rank(self.rank)
        topk_count(1, density=self.density)
        require_int(
            StrategyError, "bytes_per_pack", self.bytes_per_pack, minimum=0, fix="Use 0 to keep the strategy's packing."
        )
        require_int(StrategyError, "split_bytes", self.split_bytes, minimum=0, fix="Use 0 to never split.")

    @property
    def wire_dtype_name(self) -> str | None:
        """The dtype gradients travel as, or None for their own."""
        return _WIRE_DTYPES.get(self.compression)


def gradient_value_bytes(compression: str) -> int:
    """Bytes one float32 gradient value takes on the wire under ``compression``.

    Example:
        >>> gradient_value_bytes("none"), gradient_value_bytes("bf16")
        (4, 2)
    """
    if not isinstance(compression, str) or compression not in _WIRE_DTYPES:
        raise invalid(StrategyError, "compression", compression, describe_choices(compression, _WIRE_DTYPES))
    return 4 if _WIRE_DTYPES[compression] is None else 2


def payload_bytes(tensors: Sequence[Any], config: CollectiveConfig) -> int:
    """Bytes handed to the gradient all-reduce for ``tensors`` (static shapes), per replica.

    Example:
        >>> import numpy as np
        >>> payload_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="bf16"))
        2000
    """
    total = 0
    for tensor in tensors:
        itemsize = gradient_value_bytes(config.compression) if config.wire_dtype_name else _itemsize(tensor)
        total += math.prod(int(d) for d in tensor.shape) * itemsize
    return total


def wire_bytes(tensors: Sequence[Any], config: CollectiveConfig) -> int:
    """Bytes one replica hands to the collectives per step for ``tensors``: the payload, plus fp16's float32
    range scalar; PowerSGD's factors and whole tensors, or top-k's values and int32 indices.

    Example:
        >>> import numpy as np
        >>> wire_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="fp16"))
        2004
        >>> wire_bytes([np.zeros([512, 256], np.float32)], CollectiveConfig(compression="powersgd", rank=4))
        12288
        >>> wire_bytes([np.zeros([1000], np.float32)], CollectiveConfig(compression="topk", density=0.01))
        80
    """
    counter = _COMPRESSOR_BYTES.get(config.compression)
    if counter is not None:
        return counter([[int(d) for d in t.shape] for t in tensors], config)
    scale = 4 if config.compression == "fp16" and len(tensors) else 0
    return payload_bytes(tensors, config) + scale


def _powersgd_bytes(shapes: Sequence[Sequence[int]], config: CollectiveConfig) -> int:
    return 4 * sum(lowrank_value_count(shapes, rank=config.rank))  # Float32 factors and whole tensors.


def _topk_bytes(shapes: Sequence[Sequence[int]], config: CollectiveConfig) -> int:
    return sum(8 * topk_count(math.prod(shape), density=config.density) for shape in shapes)  # Value + index.


_COMPRESSOR_BYTES = {"powersgd": _powersgd_bytes, "topk": _topk_bytes}


def _itemsize(tensor: Any) -> int:
    dtype = tensor.dtype
    size = getattr(dtype, "size", None)
    return int(size if size is not None else dtype.itemsize)


def _split(flat: tf.Tensor, piece_elems: int) -> list[tf.Tensor]:
    import tensorflow as tf

    n = int(flat.shape[0])
    sizes = [piece_elems] * (n // piece_elems) + ([n % piece_elems] if n % piece_elems else [])
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


def _fp16_scale(tensors: Sequence[tf.Tensor], context: Any) -> tf.Tensor:
    """A power of two that keeps every partial sum of ``tensors`` within float16 range."""
    import tensorflow as tf

    local_max = tf.reduce_max(tf.stack([tf.reduce_max(tf.abs(tf.cast(t, tf.float32))) for t in tensors]))
    # The sum of every replica's largest magnitude bounds every element of every partial sum.
    bound = context.all_reduce(tf.distribute.ReduceOp.SUM, local_max)
    exponent = tf.floor(tf.math.log(_FP16_MAX / 2.0 / bound) / math.log(2.0))
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
    wire = tf.as_dtype(config.wire_dtype_name) if config.wire_dtype_name else None
    scale = _fp16_scale(tensors, context) if config.compression == "fp16" else None
    pieces, layout = [], []
    for tensor in tensors:
        flat = tf.reshape(tensor, [-1])
        if scale is not None:
            flat = tf.cast(flat, tf.float32) * scale
        if wire is not None:
            flat = tf.cast(flat, wire)
        if config.split_bytes and int(flat.shape[0]) * flat.dtype.size > config.split_bytes:
            parts = _split(flat, max(1, config.split_bytes // flat.dtype.size))
        else:
            parts = [flat]
        layout.append(len(parts))
        pieces.extend(parts)
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=config.bytes_per_pack)
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
