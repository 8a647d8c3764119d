"""The per-step traffic of the compressors and local SGD, in the cost model of :mod:`tfdist.plan`.

What :func:`tfdist.keras.with_communication` (PowerSGD, top-k) and :func:`tfdist.keras.local_sgd` send
depends on each weight's shape, so these take the shapes, and the link (bandwidth, latency) as
:class:`tfdist.plan.Plan` does. Each compressor carries its own model (a
:class:`~tfdist.comm.TrafficModel` in :mod:`tfdist.comm.registry`): the bytes it sends, the collectives'
time, and the values its arithmetic streams.

Given the host's rates (:class:`~tfdist.comm.HostRates`, or the memory bandwidth of one worker alone), they
also model the compressor's compute, which on CPUs costs more than the wire it saves: every step streams the
gradients through memory several times, and some of its work is no stream at all. The passes counted, each
one read or write of every compressed float32 value, are those of tfdist's implementation, listed in each
compressor's docstring (``PowerSGD`` 10, ``TopK`` 11, ``LocalSGD`` 3 per averaging;
:data:`ARITHMETIC_PASSES`); each compressor's ``compute_seconds`` prices them, and what runs at another rate
(top-k's selection and scatter at ``select_bandwidth`` and ``scatter_bandwidth``, PowerSGD's thin products at
``matmul_bandwidth``, ``matvec_bandwidth`` at rank 1).

A kernel that fused PowerSGD's steps perfectly would still need 7 (read ``g`` and ``e`` once while
computing ``M Q``, write ``M``, read it for ``M^T P`` and for the error, write the error and the sum):
:data:`POWERSGD_FLOOR_PASSES`, the physical limit the benchmark compares with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

from tfdist.comm.compressor import Link, TrafficModel
from tfdist.comm.host import HostRates, given_rates
from tfdist.comm.registry import compressor_for, registered_compressors
from tfdist.errors import PlanError, invalid, require_number

__all__ = ["ARITHMETIC_PASSES", "POWERSGD_FLOOR_PASSES", "TRAFFIC_KINDS", "CompressedTraffic", "compressed_traffic"]


# The built-in compressors compressed_traffic models, and their passes (registered_compressors(TrafficModel)
# lists every one registered).
TRAFFIC_KINDS = tuple(registered_compressors(TrafficModel))
ARITHMETIC_PASSES = {name: cls.arithmetic_passes for name, cls in registered_compressors(TrafficModel).items()}
POWERSGD_FLOOR_PASSES = 7  # PowerSGD perfectly fused: the memory traffic no implementation can avoid.


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompressedTraffic:
    """Bytes one worker sends per step with a compressor, and the seconds the alpha-beta model gives them.

    Attributes:
      compression: The compressor's name: 'powersgd', 'topk', 'local_sgd'...
      bytes_per_step: Bytes one worker hands to the collectives per optimizer step (local SGD: the weights'
        all-reduce spread over its period).
      seconds_per_step: The collectives' time per step: PowerSGD two ring all-reduces (the P factors; the Q
        factors with the whole tensors), top-k two ring all-gathers (values, indices), local SGD one ring
        all-reduce of the weights every ``period`` steps.
      fewer_bytes: float32 all-reduce bytes over ``bytes_per_step``.
      arithmetic_seconds: The compressor's compute per step on the given host (its ``compute_seconds``: its
        ``arithmetic_passes`` over the values it streams, and what runs at another rate), or None when no
        host or memory bandwidth was given.
      total_seconds: ``seconds_per_step`` plus ``arithmetic_seconds`` (the collectives wait for the
        arithmetic, and it for them), or None without a memory bandwidth.
      warmup_steps: The first steps, which send otherwise (PowerSGD's plain warm-up; 0: none). The other
        numbers are those of the steps after them.
      warmup_bytes_per_step: Bytes one worker hands to the collectives in each warm-up step.
      warmup_seconds_per_step: The collectives' time of each warm-up step.
    """

    compression: str
    bytes_per_step: float
    seconds_per_step: float
    fewer_bytes: float
    arithmetic_seconds: float | None = None
    warmup_steps: int = 0
    warmup_bytes_per_step: float = 0.0
    warmup_seconds_per_step: float = 0.0

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
    compression: str | TrafficModel,
    rank: int | None = None,
    density: float | None = None,
    period: int | None = None,
    memory_bandwidth: float | None = None,
    host: HostRates | None = None,
) -> CompressedTraffic:
    """The per-step traffic of a compressor on gradients of ``shapes`` (the model's trainable weights).

    ``compression`` is a compressor with a traffic model, typed (``PowerSGD(rank=4)``, ``TopK()``,
    ``LocalSGD(period=8)``) or by name ('powersgd', 'topk', 'local_sgd') with its option as a keyword:
    ``rank``, ``density`` or ``period`` (each refused with the others). ``memory_bandwidth`` (bytes per
    second one worker streams, e.g. measured with ``tfdist plan``'s ``--memory-bandwidth`` or the
    benchmark) adds the compressor's compute, its other rates the defaults of :class:`~tfdist.comm.HostRates`;
    ``host`` (refused with ``memory_bandwidth``) gives every rate. A compressor that starts otherwise (PowerSGD's warm-up of
    plain steps) tells its first steps apart (``warmup_steps``...).

    Example:
        >>> t = compressed_traffic(shapes=[(2048, 1000), (1000,)], workers=2, bandwidth=1e9, latency=1e-4,
        ...                        compression="powersgd", rank=4)
        >>> int(t.bytes_per_step), round(t.fewer_bytes), round(t.seconds_per_step * 1e3, 3)
        (52772, 155, 0.453)
        >>> t.warmup_steps, int(t.warmup_bytes_per_step), round(t.warmup_seconds_per_step * 1e3, 3)
        (25, 8244768, 8.645)
        >>> from tfdist.comm import PowerSGD
        >>> round(compressed_traffic(shapes=[(2048, 1000)], workers=2, bandwidth=1e9, latency=1e-4,
        ...                          compression=PowerSGD(), memory_bandwidth=20e9).arithmetic_seconds * 1e3, 3)
        11.82
    """
    given = {"rank": rank, "density": density, "period": period}
    named = {key: value for key, value in given.items() if value is not None}
    compressor = cast(TrafficModel, compressor_for(compression, named, kind=TrafficModel, error=PlanError))
    link = Link(workers=workers, bandwidth=bandwidth, latency=latency)  # Validates the link as the planner does.
    check_shapes(shapes)
    require_number(
        PlanError,
        "memory_bandwidth",
        memory_bandwidth,
        above=0,
        allow_none=True,
        fix="Bytes per second (a server core streams about 10-20 GB/s, e.g. 15e9), or None to leave the "
        "arithmetic out.",
    )
    host = given_rates(host, memory_bandwidth)
    sent = compressor.sent_bytes(shapes)
    warmup = compressor.warmup(shapes, link)
    arithmetic = None if host is None else compressor.compute_seconds(shapes, host, workers=workers)
    return CompressedTraffic(
        compression=compressor.name,
        bytes_per_step=sent,
        seconds_per_step=compressor.seconds(shapes, link),
        fewer_bytes=4.0 * sum(math.prod(int(d) for d in s) for s in shapes) / sent,
        arithmetic_seconds=arithmetic,
        warmup_steps=warmup.steps,
        warmup_bytes_per_step=warmup.sent_bytes,
        warmup_seconds_per_step=warmup.seconds,
    )


def check_shapes(shapes: Any) -> None:
    """Raises a :class:`PlanError` unless ``shapes`` is a non-empty list of shapes of positive integers."""
    if (
        not isinstance(shapes, (list, tuple))
        or not shapes
        or not all(isinstance(s, (list, tuple)) and all(_dimension(d) for d in s) for s in shapes)
    ):
        raise invalid(PlanError, "shapes", shapes, "a list of weight shapes, each a list of positive integers")


def _dimension(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
