"""The per-step traffic of the compressors and local SGD, in the cost model of :mod:`tfdist.plan`.

What :func:`tfdist.keras.with_communication` (PowerSGD, top-k) and :func:`tfdist.keras.local_sgd` send
depends on each weight's shape, so these take the shapes, and the link (bandwidth, latency) as
:class:`tfdist.plan.Plan` does.

Given the memory bandwidth of one worker, they also model the compressor's arithmetic, which on CPUs costs
more than the wire it saves: every step streams the gradients through memory several times. The passes
counted, each one read or write of every compressed float32 value, are those of tfdist's implementation:

============  ======  ================================================================================
compressor    passes  what streams the gradients
============  ======  ================================================================================
powersgd      10      ``g + e`` (3), ``M Q`` (1), ``M^T P`` (1), ``P Q_w^T`` (1), ``M - P Q_w^T`` (3), ``P Q^T`` (1)
topk          12      ``g + e`` (3), ``abs`` (2), the threshold's mask (1), the scatter-add of what all sent (2),
                      its slices (2), the error with the sent entries zeroed (2)
local_sgd     3       per averaging, the weights summed and scaled (read, write, write), once per period
============  ======  ================================================================================

A kernel that fused PowerSGD's steps perfectly would still need 7 (read ``g`` and ``e`` once while
computing ``M Q``, write ``M``, read it for ``M^T P`` and for the error, write the error and the sum):
:data:`POWERSGD_FLOOR_PASSES`, the physical limit the benchmark compares with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from tfdist._names import describe_choices
from tfdist.comm.powersgd import check_rank, matrix_shape
from tfdist.comm.topk import topk_count
from tfdist.errors import PlanError, invalid, require_int, require_number
from tfdist.plan import Plan

__all__ = ["ARITHMETIC_PASSES", "POWERSGD_FLOOR_PASSES", "TRAFFIC_KINDS", "CompressedTraffic", "compressed_traffic"]


TRAFFIC_KINDS = ("powersgd", "topk", "local_sgd")  # What compressed_traffic models (tfdist.keras.with_communication).
ARITHMETIC_PASSES = {"powersgd": 10, "topk": 12, "local_sgd": 3}  # Per step (local SGD: per averaging); see above.
POWERSGD_FLOOR_PASSES = 7  # PowerSGD perfectly fused: the memory traffic no implementation can avoid.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompressedTraffic:
    """Bytes one worker sends per step with a compressor, and the seconds the alpha-beta model gives them.

    Attributes:
      compression: 'powersgd', 'topk' or 'local_sgd'.
      bytes_per_step: Bytes one worker hands to the collectives per optimizer step (local SGD: the weights'
        all-reduce spread over its period).
      seconds_per_step: The collectives' time per step: PowerSGD two ring all-reduces (the P factors; the Q
        factors with the whole tensors), top-k two ring all-gathers (values, indices), local SGD one ring
        all-reduce of the weights every ``period`` steps.
      fewer_bytes: float32 all-reduce bytes over ``bytes_per_step``.
      arithmetic_seconds: The compressor's arithmetic per step at the given memory bandwidth
        (:data:`ARITHMETIC_PASSES` over the values it streams), or None when no bandwidth was given.
      total_seconds: ``seconds_per_step`` plus ``arithmetic_seconds`` (the collectives wait for the
        arithmetic, and it for them), or None without a memory bandwidth.
    """

    compression: str
    bytes_per_step: float
    seconds_per_step: float
    fewer_bytes: float
    arithmetic_seconds: float | None = None

    @property
    def total_seconds(self) -> float | None:
        return None if self.arithmetic_seconds is None else self.seconds_per_step + self.arithmetic_seconds

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_seconds": self.total_seconds}


def compressed_traffic(
    *,
    shapes: Sequence[Sequence[int]],
    workers: int,
    bandwidth: float,
    latency: float,
    compression: str,
    rank: int = 4,
    density: float = 0.01,
    period: int = 4,
    memory_bandwidth: float | None = None,
) -> CompressedTraffic:
    """The per-step traffic of a compressor on gradients of ``shapes`` (the model's trainable weights).

    ``memory_bandwidth`` (bytes per second one worker streams, e.g. measured with ``tfdist plan``'s
    ``--memory-bandwidth`` or the benchmark) adds the compressor's arithmetic.

    Example:
        >>> t = compressed_traffic(shapes=[(2048, 1000), (1000,)], workers=2, bandwidth=1e9, latency=1e-4,
        ...                        compression="powersgd", rank=4)
        >>> int(t.bytes_per_step), round(t.fewer_bytes), round(t.seconds_per_step * 1e3, 3)
        (52768, 155, 0.453)
        >>> round(compressed_traffic(shapes=[(2048, 1000)], workers=2, bandwidth=1e9, latency=1e-4,
        ...                          compression="powersgd", memory_bandwidth=20e9).arithmetic_seconds * 1e3, 3)
        4.096
    """
    if compression not in TRAFFIC_KINDS:
        raise invalid(PlanError, "compression", compression, describe_choices(compression, TRAFFIC_KINDS))
    Plan(params=1, workers=workers, bandwidth=bandwidth, latency=latency)  # Validates the link as the planner does.
    require_int(PlanError, "period", period, minimum=1, fix="Average every 1 or more steps.")
    check_rank(rank)
    if not shapes or not all(isinstance(s, (list, tuple)) and all(_dimension(d) for d in s) for s in shapes):
        raise invalid(PlanError, "shapes", shapes, "a list of weight shapes, each a list of positive integers")
    require_number(
        PlanError,
        "memory_bandwidth",
        memory_bandwidth,
        above=0,
        allow_none=True,
        fix="Bytes per second (a server core streams about 10-20 GB/s, e.g. 15e9), or None to leave the "
        "arithmetic out.",
    )
    link = _Link(workers=workers, bandwidth=bandwidth, latency=latency)
    sizes = [math.prod(int(d) for d in s) for s in shapes]
    sent, seconds = _TRAFFIC[compression](shapes, sizes, link, rank=rank, density=density, period=period)
    arithmetic = None
    if memory_bandwidth is not None:
        streamed = _streamed_values(compression, shapes, sizes, rank=rank, period=period)
        arithmetic = ARITHMETIC_PASSES[compression] * 4.0 * streamed / memory_bandwidth
    return CompressedTraffic(
        compression=compression,
        bytes_per_step=sent,
        seconds_per_step=seconds,
        fewer_bytes=4.0 * sum(sizes) / sent,
        arithmetic_seconds=arithmetic,
    )


def _streamed_values(compression: str, shapes: Any, sizes: list[int], *, rank: int, period: int) -> float:
    """The values a compressor's arithmetic streams per step: PowerSGD its matrices, top-k every gradient,
    local SGD the weights once per period."""
    if compression == "powersgd":
        views = [matrix_shape([int(d) for d in s], rank=rank) for s in shapes]
        return float(sum(size for size, view in zip(sizes, views) if view is not None))
    return float(sum(sizes)) / (period if compression == "local_sgd" else 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Link:
    """The ring collectives' alpha-beta times on ``workers`` machines (the all-reduce is Plan's formula)."""

    workers: int
    bandwidth: float
    latency: float

    def ring(self, nbytes: float) -> float:
        """A ring all-reduce of ``nbytes``."""
        if nbytes <= 0 or self.workers == 1:
            return 0.0
        return Plan(
            params=nbytes / 4, workers=self.workers, bandwidth=self.bandwidth, latency=self.latency
        ).ring_allreduce_s

    def gather(self, nbytes: float) -> float:
        """A ring all-gather in which every worker contributes ``nbytes``."""
        n = self.workers
        return 0.0 if n == 1 else (n - 1) * self.latency + (n - 1) * nbytes / self.bandwidth


def _powersgd(shapes: Any, sizes: list[int], link: _Link, *, rank: int, **_: Any) -> tuple[float, float]:
    views = [matrix_shape([int(d) for d in s], rank=rank) for s in shapes]
    p = sum(rank * v[0] for v in views if v is not None)
    q = sum(rank * v[1] for v in views if v is not None)
    whole = sum(size for size, v in zip(sizes, views) if v is None)
    return 4.0 * (p + q + whole), link.ring(4.0 * p) + link.ring(4.0 * (q + whole))


def _topk(shapes: Any, sizes: list[int], link: _Link, *, density: float, **_: Any) -> tuple[float, float]:
    k = sum(topk_count(size, density=density) for size in sizes)
    return 8.0 * k, 2 * link.gather(4.0 * k)  # Float32 values, then int32 indices.


def _local_sgd(shapes: Any, sizes: list[int], link: _Link, *, period: int, **_: Any) -> tuple[float, float]:
    return 4.0 * sum(sizes) / period, link.ring(4.0 * sum(sizes)) / period


_TRAFFIC: dict[str, Any] = {"powersgd": _powersgd, "topk": _topk, "local_sgd": _local_sgd}


def _dimension(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
