"""What a task's host adds to the wire: the collectives' own work per byte, and the arithmetic.

A link's rate is not the only limit: TensorFlow's RING all-reduce over gRPC copies, frames and sums every
byte on the host, and on two CPU cores it moved 215-320 MB/s between simulated hosts whatever the link
(BENCHMARKS.md). So the planner charges each variant two times per step, each worker's:

* the **wire**: the alpha-beta time of its collectives on the link (:class:`tfdist.plan.Plan`);
* the **host**: the same collectives' bytes at :attr:`HostRates.collective_bandwidth` (the rate the
  collective implementation moves bytes at when the wire is not the limit), plus its compute: the casts'
  and compressors' passes over the gradients at :attr:`HostRates.memory_bandwidth`, and what is not a
  stream through memory at a rate of its own: top-k's selection at :attr:`HostRates.select_bandwidth` and
  its scatter of what every worker sent at :attr:`HostRates.scatter_bandwidth`, PowerSGD's thin matrix
  products at :attr:`HostRates.matmul_bandwidth` (:attr:`HostRates.matvec_bandwidth` at rank 1; each
  compressor's ``compute_seconds``).

and combines them as :func:`combined_seconds`: ``wire + host - overlap * min(wire, host)``. An overlap of 0
is a sum (nothing of one hides behind the other), 1 the maximum of the two; tfdist's packed all-reduce sits
between, near the sum, fitted to the benchmark (:data:`PACKED_OVERLAP`). ``tfdist doctor --probe SECONDS --measure-host``
measures the rates where the tasks run (:func:`tfdist.comm.host_probe.measure_host_rates`: each a short TensorFlow micro-benchmark on
every task at once), ``tfdist plan`` reads them (``--collective-bandwidth``, ``--memory-bandwidth``,
``--select-bandwidth``, ``--scatter-bandwidth``, ``--matmul-bandwidth``, ``--matvec-bandwidth``), and without them
takes the defaults measured on two CPU cores.

Example:
    >>> host = HostRates(collective_bandwidth=300e6, memory_bandwidth=10e9)
    >>> round(host.collective_seconds(100e6) * 1e3, 1)  # 100 MB each way through the host's collectives
    333.3
    >>> round(combined_seconds(wire=0.8, host=0.3, overlap=0.5), 2)  # 0.8 s on the wire, half the host's hidden
    0.95
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfdist._options import option
from tfdist.errors import PlanError, invalid, require_number

if TYPE_CHECKING:
    pass

__all__ = ["HostRates", "combined_seconds", "host_seconds"]

# Measured between 2 simulated hosts on 2 shared CPU cores (BENCHMARKS.md): tfdist's packed RING all-reduce
# moved about 300 MB/s each way per task with the wire out of the way, and a task streamed ~10 GB/s.
DEFAULT_COLLECTIVE_BANDWIDTH = 300e6
DEFAULT_MEMORY_BANDWIDTH = 10e9
# Measured the same way on the same 2 cores (2026-12-07): top-k's selection scanned 1.19 GB/s of float32
# magnitudes and PowerSGD's thin products ([n, m] by [m, 4] and back) streamed 7.0 GB/s beside a 19.8 GB/s
# stream; the defaults keep those shares of the default stream, as a busier host slows every rate alike.
DEFAULT_SELECT_BANDWIDTH = 0.6e9
DEFAULT_MATMUL_BANDWIDTH = 3.5e9
# Measured on the same 2 cores (2026-12-07, one process alone, where the rates above ran on every task at once:
# doctor's probes since measured 8-25 MB/s and 1.3-2x): rank-1 products (matrix-vector and outer products, a
# stream each) took 0.77x the time of rank-4 ones, and scattering 512k float32 values at random indices into a
# 100 MB sum took 86 ms beyond the sum's fill (24 MB/s of values: random writes, not a stream); the same shares.
DEFAULT_MATVEC_BANDWIDTH = 4.5e9
DEFAULT_SCATTER_BANDWIDTH = 12e6
# How much of the shorter of the wire's and the host's times hides behind the longer in tfdist's packed
# all-reduce (packs of a few MB; TF runs a function's collectives one after another, so only the work inside a
# pack overlaps): fitted at 1 Gbit/s between 2 simulated hosts with the rate measured unshaped (0-0.25 fit),
# then checked at 10 Gbit/s, unshaped and on 4 hosts (BENCHMARKS.md).
PACKED_OVERLAP = 0.25
STREAM_PASSES = 3  # stream_seconds' a + b: two reads and a write of every value
MATMUL_PASSES = 3  # matmul_seconds' M Q, M^T P and P Q^T: each a pass over every value of M


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostRates:
    """How fast one task's host moves bytes through its collectives and through memory.

    Attributes:
      collective_bandwidth: Bytes per second each way one task's all-reduce moves when the wire is not the
        limit (TF's RING over gRPC, tfdist's packs): what the host's copies, framing and sums allow.
      memory_bandwidth: Bytes per second one task streams through memory (all tasks at once): the rate of
        the casts' and the compressors' arithmetic.
      select_bandwidth: Bytes per second of float32 magnitudes top-k's selection (:func:`tfdist.comm.topk.largest`,
        1%) scans, all tasks at once: a scan that builds an index list is compute, not a stream.
      matmul_bandwidth: Bytes per second of a matrix a thin product with rank-4 factors (``[n, m] @ [m, 4]``
        and back, PowerSGD's) streams, all tasks at once.
      matvec_bandwidth: The same with rank-1 factors: matrix-vector and outer products, another kernel than
        a matrix product's (PowerSGD at rank 1).
      scatter_bandwidth: Bytes per second of float32 values scattered at random indices into a dense sum, all
        tasks at once (top-k's sum of what every worker sent): a write per value to a random place, not a
        stream.
      overlap: The share of the shorter of the wire's and the host's times hidden behind the longer, from 0
        (they add up) to 1 (the longer alone counts).

    Example:
        >>> HostRates(collective_bandwidth=0)
        Traceback (most recent call last):
        ...
        tfdist.errors.PlanError: Invalid value for `collective_bandwidth`. Received: 0. Expected a number > 0. \
Bytes per second, e.g. 300e6; tfdist doctor --probe 30 --measure-host measures it.
    """

    collective_bandwidth: float = option(
        DEFAULT_COLLECTIVE_BANDWIDTH,
        help="bytes per second each way a task's all-reduce moves when the wire is not the limit, e.g. 300MB/s "
        "(tfdist doctor --measure-host measures it)",
    )
    memory_bandwidth: float = option(
        DEFAULT_MEMORY_BANDWIDTH,
        help="bytes per second a task streams through memory, e.g. 10GB/s: the casts' and compressors' arithmetic",
    )
    select_bandwidth: float = option(
        DEFAULT_SELECT_BANDWIDTH,
        help="bytes per second of float32 values top-k's selection scans, e.g. 600MB/s",
    )
    scatter_bandwidth: float = option(
        DEFAULT_SCATTER_BANDWIDTH,
        help="bytes per second of float32 values top-k scatters into its sum at random indices, e.g. 12MB/s",
    )
    matmul_bandwidth: float = option(
        DEFAULT_MATMUL_BANDWIDTH,
        help="bytes per second of a matrix PowerSGD's thin products stream, e.g. 3.5GB/s",
    )
    matvec_bandwidth: float = option(
        DEFAULT_MATVEC_BANDWIDTH,
        help="bytes per second of a matrix PowerSGD's rank-1 products (matrix-vector) stream, e.g. 4.5GB/s",
    )
    overlap: float = PACKED_OVERLAP

    def __post_init__(self) -> None:
        for name in RATE_NAMES:
            require_number(
                PlanError,
                name,
                getattr(self, name),
                above=0,
                fix="Bytes per second, e.g. 300e6; tfdist doctor --probe 30 --measure-host measures it.",
            )
        require_number(
            PlanError, "overlap", self.overlap, minimum=0, maximum=1, fix="0 adds the times up, 1 takes the longer."
        )

    def collective_seconds(self, moved: float) -> float:
        """The host's time for collectives that move ``moved`` bytes each way (a ring all-reduce of S bytes on
        N workers moves ``2(N-1)/N * S``)."""
        return moved / self.collective_bandwidth

    def arithmetic_seconds(self, passes: float, values: float) -> float:
        """The time of ``passes`` reads or writes of ``values`` float32 values through memory."""
        return passes * 4.0 * values / self.memory_bandwidth

    def select_seconds(self, values: float) -> float:
        """The time top-k's selection takes to scan ``values`` float32 magnitudes."""
        return 4.0 * values / self.select_bandwidth

    def matmul_seconds(self, passes: float, values: float, *, rank: int = 4) -> float:
        """The time of ``passes`` thin products with rank-``rank`` factors over a matrix of ``values`` float32
        values (rank 1 at :attr:`matvec_bandwidth`)."""
        return passes * 4.0 * values / (self.matvec_bandwidth if rank == 1 else self.matmul_bandwidth)

    def scatter_seconds(self, values: float) -> float:
        """The time of scattering ``values`` float32 values at random indices into a dense sum (its fill apart)."""
        return 4.0 * values / self.scatter_bandwidth


RATE_NAMES = tuple(field.name for field in dataclasses.fields(HostRates) if field.name != "overlap")
"""HostRates' rates (its fields but the overlap), in their order: what the probe measures and a run records."""


def combined_seconds(*, wire: float, host: float, overlap: float) -> float:
    """A step's time from the wire's and the host's: ``wire + host - overlap * min(wire, host)``.

    Example:
        >>> combined_seconds(wire=1.0, host=0.5, overlap=0.0), combined_seconds(wire=1.0, host=0.5, overlap=1.0)
        (1.5, 1.0)
    """
    _check_times(wire=wire, host=host, overlap=overlap)
    return wire + host - overlap * min(wire, host)


def host_seconds(*, measured: float, wire: float, overlap: float) -> float:
    """The host's time that, with the wire's, gives ``measured`` (:func:`combined_seconds` inverted); 0 when
    the wire alone takes as long (then the wire is the limit and the host's time cannot be told).

    Example:
        >>> round(host_seconds(measured=0.95, wire=0.8, overlap=0.5), 3), host_seconds(measured=1.2, wire=0.1, overlap=0.5)
        (0.3, 1.15)
    """
    _check_times(measured=measured, wire=wire, overlap=overlap)
    if measured <= wire:
        return 0.0
    if measured >= (2.0 - overlap) * wire:  # The host is the longer: all of the wire's time but the overlap shows.
        return measured - (1.0 - overlap) * wire
    return (measured - wire) / (1.0 - overlap)  # The wire is the longer (overlap < 1 here).


def given_rates(host: HostRates | None, memory_bandwidth: float | None) -> HostRates | None:
    """The rates a pricing function was given: ``host``, or a memory bandwidth alone (None: neither).

    >>> given_rates(None, 15e9).memory_bandwidth, given_rates(None, None)
    (15000000000.0, None)

    Raises:
      PlanError: both given.
    """
    if host is not None and memory_bandwidth is not None:
        raise invalid(
            PlanError,
            "memory_bandwidth",
            memory_bandwidth,
            "None with `host`",
            "Pass it as HostRates(memory_bandwidth=...).",
        )
    return HostRates(memory_bandwidth=memory_bandwidth) if memory_bandwidth is not None else host


def _check_times(**values: float) -> None:
    for name, value in values.items():
        if name == "overlap":
            require_number(PlanError, name, value, minimum=0, maximum=1)
        else:
            require_number(PlanError, name, value, minimum=0, fix="Seconds, e.g. 0.25.")
