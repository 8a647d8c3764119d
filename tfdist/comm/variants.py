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
from tfdist.comm.host import HostRates, combined_seconds, given_rates
from tfdist.comm.local_sgd import LocalSGD
from tfdist.comm.powersgd import PowerSGD
from tfdist.comm.topk import TopK
from tfdist.comm.traffic import check_shapes, compressed_traffic
from tfdist.errors import PlanError, invalid, require_type
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
      arithmetic_seconds: The casts' or the compressor's arithmetic per step at the memory bandwidth (None:
        not given).
      host_seconds: The host's work in the same collectives, their bytes at the host's collective bandwidth
        (None: not given; see :class:`tfdist.comm.HostRates`).
      overlap: The share of the shorter of the wire's and the host's times (its collectives and arithmetic)
        hidden behind the longer.
    """

    compressor: Compressor
    bytes_per_step: float
    wire_seconds: float
    arithmetic_seconds: float | None = None
    host_seconds: float | None = None
    overlap: float = 0.0

    @property
    def label(self) -> str:
        """The compression's name and its first option: 'bf16', 'powersgd rank=4', 'local_sgd period=4'."""
        options = list(self.compressor.options().items())[:1]
        return " ".join([self.compressor.name, *(f"{key}={value}" for key, value in options)])

    @property
    def seconds(self) -> float:
        """The wire and the host (its collectives' work and the arithmetic), combined as
        :func:`tfdist.comm.combined_seconds` with :attr:`overlap` (0: the collectives wait for the arithmetic,
        and it for them)."""
        host = (self.host_seconds or 0.0) + (self.arithmetic_seconds or 0.0)
        return combined_seconds(wire=self.wire_seconds, host=host, overlap=self.overlap)


def estimate_variants(
    *,
    shapes: Sequence[Sequence[int]],
    workers: int,
    bandwidth: float,
    latency: float,
    memory_bandwidth: float | None = None,
    variants: Sequence[Compressor] = VARIANTS,
    host: HostRates | None = None,
) -> list[VariantEstimate]:
    """Each variant's time per step for gradients of ``shapes`` on ``workers`` machines, in ``variants``' order.

    Args:
      shapes: The trainable weights' shapes.
      workers: Machines in the all-reduce.
      bandwidth: Each machine's link, bytes per second each way.
      latency: One message's latency, seconds.
      memory_bandwidth: Bytes per second one worker streams through memory: adds the casts' and the
        compressors' arithmetic (see :func:`tfdist.comm.compressed_traffic`); None leaves it out. Refused
        with ``host``, which has its own.
      variants: The compressors to price (wire casts and traffic models).
      host: The host's rates: adds each variant's collectives at its collective bandwidth and its arithmetic
        at its memory bandwidth, combined with the wire by its overlap; None prices the wire (and the
        arithmetic at ``memory_bandwidth``) alone.

    Raises:
      PlanError: An invalid link, shapes or memory bandwidth, or a variant the model cannot price.
    """
    check_shapes(shapes)
    require_type(PlanError, "host", host, (HostRates, type(None)), "HostRates or None")
    require_type(PlanError, "variants", variants, (list, tuple), "a list of compressors")
    rates = given_rates(host, memory_bandwidth)
    estimates = []
    for compressor in variants:
        sent, wire, arithmetic = _priced(compressor, shapes, workers, bandwidth, latency, rates)
        if host is None:
            estimates.append(
                VariantEstimate(
                    compressor=compressor, bytes_per_step=sent, wire_seconds=wire, arithmetic_seconds=arithmetic
                )
            )
            continue
        # The host's own work: the same collectives' bytes at its collective bandwidth, with no latency.
        on_host = _priced(compressor, shapes, workers, host.collective_bandwidth, 0.0, None)[1]
        estimates.append(
            VariantEstimate(
                compressor=compressor,
                bytes_per_step=sent,
                wire_seconds=wire,
                arithmetic_seconds=arithmetic,
                host_seconds=on_host,
                overlap=host.overlap,
            )
        )
    return estimates


def _priced(
    compressor: Compressor,
    shapes: Sequence[Sequence[int]],
    workers: int,
    bandwidth: float,
    latency: float,
    rates: HostRates | None,
) -> tuple[float, float, float | None]:
    """(bytes per step, the collectives' seconds, the compute's seconds on ``rates`` or None) of one variant on a
    link."""
    if isinstance(compressor, TrafficModel):
        traffic = compressed_traffic(
            shapes=shapes, workers=workers, bandwidth=bandwidth, latency=latency, compression=compressor, host=rates
        )
        return traffic.bytes_per_step, traffic.seconds_per_step, traffic.arithmetic_seconds
    if isinstance(compressor, WireCast):
        values = float(sum(math.prod(int(d) for d in shape) for shape in shapes))
        plan = Plan(
            params=values, workers=workers, bandwidth=bandwidth, latency=latency, bytes_per_value=compressor.value_bytes
        )
        arithmetic = None if rates is None else rates.arithmetic_seconds(compressor.arithmetic_passes, values)
        return plan.gradient_bytes, plan.ring_allreduce_s, arithmetic
    raise invalid(PlanError, "variants", compressor, "wire casts or compressors with a traffic model")


def choose_variant(estimates: Sequence[VariantEstimate]) -> VariantEstimate:
    """The fastest of ``estimates`` (the first of equals)."""
    if not estimates:
        raise invalid(PlanError, "estimates", estimates, "at least one variant's estimate")
    return min(estimates, key=lambda estimate: estimate.seconds)
