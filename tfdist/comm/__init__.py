"""Gradient communication: collective settings (packing, compression, cost) and their autotuning.

The Keras wiring (``with_communication``, ``accumulate_gradients``) is in :mod:`tfdist.keras`.
"""

from tfdist.comm.autotune import DEFAULT_PACK_CANDIDATES, CollectiveTuning, all_reduce_timer, autotune_collectives
from tfdist.comm.collective import (
    GRADIENT_COMPRESSIONS,
    CollectiveConfig,
    all_reduce_sum,
    gradient_value_bytes,
    payload_bytes,
    wire_bytes,
)

__all__ = [
    "DEFAULT_PACK_CANDIDATES",
    "GRADIENT_COMPRESSIONS",
    "CollectiveConfig",
    "CollectiveTuning",
    "all_reduce_sum",
    "all_reduce_timer",
    "autotune_collectives",
    "gradient_value_bytes",
    "payload_bytes",
    "wire_bytes",
]
