"""Gradient communication: collective settings (packing, compression, cost), their autotuning, and the
compressors that send fewer values (PowerSGD, top-k with error feedback).

The Keras wiring (``with_communication``, ``accumulate_gradients``) is in :mod:`tfdist.keras`.
"""

from tfdist.comm.autotune import DEFAULT_PACK_CANDIDATES, CollectiveTuning, all_reduce_timer, autotune_collectives
from tfdist.comm.collective import (
    COMPRESSORS,
    GRADIENT_COMPRESSIONS,
    CollectiveConfig,
    all_reduce_sum,
    gradient_value_bytes,
    payload_bytes,
    wire_bytes,
)
from tfdist.comm.powersgd import lowrank_value_count, matrix_shape, orthogonalize, powersgd_sum
from tfdist.comm.topk import topk_count, topk_sum
from tfdist.comm.traffic import (
    ARITHMETIC_PASSES,
    POWERSGD_FLOOR_PASSES,
    TRAFFIC_KINDS,
    CompressedTraffic,
    compressed_traffic,
)

__all__ = [
    "ARITHMETIC_PASSES",
    "COMPRESSORS",
    "DEFAULT_PACK_CANDIDATES",
    "GRADIENT_COMPRESSIONS",
    "POWERSGD_FLOOR_PASSES",
    "TRAFFIC_KINDS",
    "CollectiveConfig",
    "CollectiveTuning",
    "CompressedTraffic",
    "all_reduce_sum",
    "all_reduce_timer",
    "autotune_collectives",
    "compressed_traffic",
    "gradient_value_bytes",
    "lowrank_value_count",
    "matrix_shape",
    "orthogonalize",
    "payload_bytes",
    "powersgd_sum",
    "topk_count",
    "topk_sum",
    "wire_bytes",
]
