"""Gradient communication: collective settings (packing, compression, cost), their autotuning, and the
compressors, each a typed config in one registry (casts, PowerSGD, top-k with error feedback, local SGD's
traffic), the host's rates beside the wire's, and the planner's choice among them on a link.

The Keras wiring (``with_communication``, ``accumulate_gradients``) is in :mod:`tfdist.keras`.
"""

from tfdist.comm.autotune import DEFAULT_PACK_CANDIDATES, CollectiveTuning, all_reduce_timer, autotune_collectives
from tfdist.comm.casts import BFloat16, Float16, NoCompression
from tfdist.comm.collective import (
    COMPRESSORS,
    GRADIENT_COMPRESSIONS,
    CollectiveConfig,
    all_reduce_sum,
    gradient_value_bytes,
    payload_bytes,
    wire_bytes,
)
from tfdist.comm.compressor import (
    Collectives,
    Compressor,
    ErrorFeedback,
    Link,
    StateSlot,
    TrafficModel,
    Warmup,
    WireCast,
)
from tfdist.comm.host import HostRates, combined_seconds, host_seconds
from tfdist.comm.host_probe import measure_host_rates
from tfdist.comm.local_sgd import LocalSGD
from tfdist.comm.powersgd import PowerSGD, lowrank_value_count, matrix_shape, orthogonalize, powersgd_sum
from tfdist.comm.registry import compressor_for, register_compressor, registered_compressors
from tfdist.comm.topk import TopK, topk_count, topk_sum
from tfdist.comm.traffic import (
    ARITHMETIC_PASSES,
    POWERSGD_FLOOR_PASSES,
    TRAFFIC_KINDS,
    CompressedTraffic,
    compressed_traffic,
)
from tfdist.comm.variants import VARIANTS, VariantEstimate, choose_variant, estimate_variants

__all__ = [
    "ARITHMETIC_PASSES",
    "COMPRESSORS",
    "DEFAULT_PACK_CANDIDATES",
    "GRADIENT_COMPRESSIONS",
    "POWERSGD_FLOOR_PASSES",
    "TRAFFIC_KINDS",
    "VARIANTS",
    "BFloat16",
    "CollectiveConfig",
    "CollectiveTuning",
    "Collectives",
    "CompressedTraffic",
    "Compressor",
    "ErrorFeedback",
    "Float16",
    "HostRates",
    "Link",
    "LocalSGD",
    "NoCompression",
    "PowerSGD",
    "StateSlot",
    "TopK",
    "TrafficModel",
    "VariantEstimate",
    "Warmup",
    "WireCast",
    "all_reduce_sum",
    "all_reduce_timer",
    "autotune_collectives",
    "choose_variant",
    "combined_seconds",
    "compressed_traffic",
    "compressor_for",
    "estimate_variants",
    "gradient_value_bytes",
    "host_seconds",
    "lowrank_value_count",
    "matrix_shape",
    "measure_host_rates",
    "orthogonalize",
    "payload_bytes",
    "powersgd_sum",
    "register_compressor",
    "registered_compressors",
    "topk_count",
    "topk_sum",
    "wire_bytes",
]
