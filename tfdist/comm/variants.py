"""The planner's choice of how to send the gradients: each variant's time per step on a link, and the fastest.

:data:`VARIANTS` are the ways tfdist synchronizes gradients that the planner compares: every value as
float32, bf16 or fp16 (:func:`tfdist.comm.all_reduce_sum` with the tuned packing), PowerSGD at ranks 1, 2
and 4 and top-k 1% (``with_communication``, error feedback), and local SGD averaging the weights every 4
steps (``local_sgd``). :func:`estimate_variants` prices each in the alpha-beta model of
:class:`tfdist.plan.Plan` on one link (bandwidth, latency), adding the compressor's arithmetic when the
memory bandwidth is known; :func:`choose_variant` takes the fastest. What each variant does to accuracy is
not priced: PowerSGD, top-k and local SGD change the steps (docs/communication.md).

Example:
    >>> shapes = [(2048, 1000), (1000,)]
    >>> found = estimate_variants(shapes=shapes, workers=2, bandwidth=125e6, latency=50e-6)
    >>> [(e.label, round(e.seconds * 1e3, 1)) for e in found[:4]]
    [('none', 65.7), ('bf16', 32.9), ('fp16', 32.9), ('powersgd rank=1', 0.3)]
    >>> choose_variant(found).label
    'powersgd rank=1'
    >>> slow_memory = estimate_variants(shapes=shapes, workers=2, bandwidth=125e6, latency=50e-6,
    ...                                 memory_bandwidth=1e9)
    >>> choose_variant(slow_memory).label, round(choose_variant(slow_memory).seconds * 1e3, 1)
    ('local_sgd period=4', 22.6)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tfdist.comm.casts import BFloat16, Float16, NoCompression
from tfdist.comm.compressor import Compressor, TrafficModel, WireCast
from tfdist.comm.local_sgd import LocalSGD
from tfdist.comm.powersgd import PowerSGD
from tfdist.comm.topk import TopK
from tfdist.comm.traffic import compressed_traffic
from tfdist.errors import PlanError, invalid
from tfdist.plan import Plan

__all__ = ["VARIANTS", "VariantEstimate", "choose_variant", "estimate_variants"]

VARIANTS: tuple[Compressor, ...] = (
    NoCompression(),
    BFloat16(),
    Float16(),
    PowerSGD(rank=1),
    PowerSGD(rank=2),
    PowerSGD(rank=4),
    TopK(density=0.01),
    LocalSGD(period=4),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class VariantEstimate:
    """One variant's time per optimizer step in the cost model.

    Attributes:
      compressor: The variant: a registered compressor with its options.
      bytes_per_step: Bytes one worker hands to the collectives per step (local SGD: its all-reduce spread
        over its period).
      wire_seconds: The collectives' time per step on the link.
      arithmetic_seconds: The compressor's arithmetic per step at the memory bandwidth (None: not given; a
        cast on the wire counts as none).
    """

    compressor: Compressor
    bytes_per_step: float
    wire_seconds: float
    arithmetic_seconds: float | None = None

    @property
    def label(self) -> str:
        """The compression's name and its first option: 'bf16', 'powersgd rank=4', 'local_sgd period=4'."""
        options = list(self.compressor.options().items())[:1]
        return " ".join([self.compressor.name, *(f"{key}={value}" for key, value in options)])

    @property
    def seconds(self) -> float:
        """The wire and the arithmetic (the collectives wait for it, and it for them)."""
        return self.wire_seconds + (self.arithmetic_seconds or 0.0)


def estimate_variants(
    *,
    shapes: Sequence[Sequence[int]],
    workers: int,
    bandwidth: float,
    latency: float,
    memory_bandwidth: float | None = None,
    variants: Sequence[Compressor] = VARIANTS,
) -> list[VariantEstimate]:
    """Each variant's time per step for gradients of ``shapes`` on ``workers`` machines, in ``variants``' order.

    Args:
      shapes: The trainable weights' shapes.
      workers: Machines in the all-reduce.
      bandwidth: Each machine's link, bytes per second each way.
      latency: One message's latency, seconds.
      memory_bandwidth: Bytes per second one worker streams through memory: adds the compressors'
        arithmetic (see :func:`tfdist.comm.compressed_traffic`); None leaves it out.
      variants: The compressors to price (wire casts and traffic models).

    Raises:
      PlanError: An invalid link, shapes or memory bandwidth, or a variant the model cannot price.
    """
    estimates = []
    for compressor in variants:
        if isinstance(compressor, TrafficModel):
            traffic = compressed_traffic(
                shapes=shapes,
                workers=workers,
                bandwidth=bandwidth,
                latency=latency,
                compression=compressor,
                memory_bandwidth=memory_bandwidth,
            )
            estimates.append(
                VariantEstimate(
                    compressor=compressor,
                    bytes_per_step=traffic.bytes_per_step,
                    wire_seconds=traffic.seconds_per_step,
                    arithmetic_seconds=traffic.arithmetic_seconds,
                )
            )
        elif isinstance(compressor, WireCast):
            values = float(sum(math.prod(int(d) for d in shape) for shape in shapes))
            plan = Plan(
                params=values,
                workers=workers,
                bandwidth=bandwidth,
                latency=latency,
                bytes_per_value=compressor.value_bytes,
            )
            estimates.append(
                VariantEstimate(
                    compressor=compressor,
                    bytes_per_step=plan.gradient_bytes,
                    wire_seconds=plan.ring_allreduce_s,
                    arithmetic_seconds=None if memory_bandwidth is None else 0.0,
                )
            )
        else:
            raise invalid(PlanError, "variants", compressor, "wire casts or compressors with a traffic model")
    return estimates


def choose_variant(estimates: Sequence[VariantEstimate]) -> VariantEstimate:
    """The fastest of ``estimates`` (the first of equals)."""
    if not estimates:
        raise invalid(PlanError, "estimates", estimates, "at least one variant's estimate")
    return min(estimates, key=lambda estimate: estimate.seconds)
