"""Measures a cluster's :class:`~tfdist.comm.host.HostRates` where its tasks run (``tfdist doctor --measure-host``).

Each rate is a short TensorFlow micro-benchmark that every worker runs at once: tfdist's packed all-reduce
(:mod:`tfdist.comm.collective`), a stream through memory, top-k's selection (:mod:`tfdist.comm.selection`)
and its scatter into a dense sum, and PowerSGD's thin products at ranks 4 and 1. Apart from :mod:`tfdist.comm.host`, which the compressors price their steps
with, as the measuring uses the collectives that import those compressors.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfdist.comm.host import (
    DEFAULT_COLLECTIVE_BANDWIDTH,
    DEFAULT_SCATTER_BANDWIDTH,
    MATMUL_PASSES,
    PACKED_OVERLAP,
    STREAM_PASSES,
    HostRates,
    host_seconds,
)
from tfdist.errors import PlanError, require_int, require_number

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["measure_host_rates"]

_log = logging.getLogger("tfdist.comm.host")
_MEASURE_BYTES = 64 << 20  # What measure_host_rates all-reduces, in tensors and (by default) packs of MEASURE_PACK.
MEASURE_PACK = 4 << 20
MEASURE_RANK = 4  # The factors' rank matmul_seconds times with (PowerSGD's default).
MEASURE_DENSITY = 0.01  # The share select_seconds selects (top-k's default).


def measure_host_rates(
    strategy: tf.distribute.Strategy,
    *,
    link_bandwidth: float | None = None,
    repeats: int = 3,
    bytes_per_pack: int = MEASURE_PACK,
) -> HostRates:
    """Measures this cluster's :class:`HostRates`; call on every worker at once (the all-reduce is collective).

    Times tfdist's packed all-reduce of 64 MB of float32, a stream of the same bytes through memory, top-k's
    selection of 1% of them and its scatter of two workers' 1% into their sum, and PowerSGD's thin products over
    them at ranks 4 and 1 (:func:`compute_seconds`): the all-reduce the median of ``repeats`` runs, the compute
    kernels the medians of interleaved rounds, each the slowest worker's; every worker returns the same rates. The wire's share of the
    all-reduce is taken out at the slowest ``link_bandwidth`` the workers give (bytes per second each way, e.g.
    as ``tfdist doctor --measure-link`` measured it; None: the wire is not the limit).

    Args:
      strategy: A MultiWorkerMirroredStrategy built on every worker (one replica per worker).
      link_bandwidth: The link's rate each way, bytes per second, or None.
      repeats: Timed runs of each.
      bytes_per_pack: The packs' size (tfdist's tuned packing is a few MB); 0 measures TF's default instead,
        every tensor in one pack, which nothing overlaps (the rates' ``overlap`` is then 0).

    Raises:
      PlanError: ``link_bandwidth``, ``repeats`` or ``bytes_per_pack`` invalid.
    """
    require_number(PlanError, "link_bandwidth", link_bandwidth, above=0, allow_none=True)
    require_int(PlanError, "repeats", repeats, minimum=1, maximum=100)
    require_int(PlanError, "bytes_per_pack", bytes_per_pack, minimum=0, fix="0 measures TF's one pack.")
    import tensorflow as tf

    from tfdist.comm.autotune import all_reduce_timer
    from tfdist.comm.collective import CollectiveConfig

    shapes = [(MEASURE_PACK // 4,)] * (_MEASURE_BYTES // MEASURE_PACK)
    config = CollectiveConfig(bytes_per_pack=bytes_per_pack, split_bytes=bytes_per_pack) if bytes_per_pack else None
    timer = all_reduce_timer(strategy, shapes, config)  # None: TF's own all-reduce, one pack.
    reduce_seconds = statistics.median(timer() for _ in range(repeats))
    computed = compute_seconds(shapes, repeats)
    local = tf.constant([[reduce_seconds, *computed, link_bandwidth or 0.0]], tf.float64)
    every = strategy.gather(strategy.experimental_distribute_values_from_function(lambda _: local), axis=0).numpy()
    slowest = every.max(axis=0)  # Every worker's times, the slowest of each; and the slowest link given.
    links = [float(rate) for rate in every[:, -1] if rate > 0]
    link_bandwidth = min(links) if links else None
    workers = strategy.num_replicas_in_sync
    moved = 2.0 * (workers - 1) / workers * _MEASURE_BYTES
    wire = moved / link_bandwidth if link_bandwidth else 0.0
    overlap = PACKED_OVERLAP if bytes_per_pack else 0.0
    host = host_seconds(measured=float(slowest[0]), wire=wire, overlap=overlap)
    if host <= 0:
        _log.warning(
            "The all-reduce took no longer than the wire alone (%.0f ms for %.0f ms at %.3g MB/s): the link is the "
            "limit, and the collectives' own rate cannot be told; keeping %.3g MB/s. Measure on a faster link.",
            slowest[0] * 1e3,
            wire * 1e3,
            (link_bandwidth or 0) / 1e6,
            DEFAULT_COLLECTIVE_BANDWIDTH / 1e6,
        )
    return HostRates(
        collective_bandwidth=moved / host if host > 0 else DEFAULT_COLLECTIVE_BANDWIDTH,
        memory_bandwidth=STREAM_PASSES * _MEASURE_BYTES / float(slowest[1]),
        select_bandwidth=_MEASURE_BYTES / float(slowest[2]),
        matmul_bandwidth=MATMUL_PASSES * _MEASURE_BYTES / float(slowest[3]),
        matvec_bandwidth=MATMUL_PASSES * _MEASURE_BYTES / float(slowest[4]),
        scatter_bandwidth=_scatter_rate(shapes, float(slowest[5])),
        overlap=overlap,
    )


def stream_seconds(shapes: Sequence[tuple[int, ...]], repeats: int) -> float:
    """Median seconds this process takes for ``a + b`` over float32 tensors of ``shapes``: :data:`STREAM_PASSES`
    passes over memory (two reads and a write of each value), after one warm-up."""
    return _interleaved({"stream": _stream(shapes)}, repeats)["stream"]


def _stream(shapes: Sequence[tuple[int, ...]]) -> Callable[[], Any]:
    import tensorflow as tf

    a = [tf.ones(s) for s in shapes]
    b = [tf.ones(s) for s in shapes]
    return tf.function(lambda: [x + y for x, y in zip(a, b)])


def _scattered(shapes: Sequence[tuple[int, ...]]) -> int:
    """The values two workers' top-k of :data:`MEASURE_DENSITY` send for ``shapes``: what the scatter times."""
    from tfdist.comm.selection import topk_count

    return 2 * sum(topk_count(int(s[0]), density=MEASURE_DENSITY) for s in shapes)


def _scatter_rate(shapes: Sequence[tuple[int, ...]], seconds: float) -> float:
    """The scatter's rate from its time beyond the fill; the default when there was none to tell (a scatter
    no slower than the fill alone)."""
    if seconds <= 0:
        _log.warning(
            "The scatter took no longer than the sum's fill alone (%.2f ms): its rate cannot be told; keeping "
            "%.3g MB/s.",
            seconds * 1e3,
            DEFAULT_SCATTER_BANDWIDTH / 1e6,
        )
        return DEFAULT_SCATTER_BANDWIDTH
    return 4.0 * _scattered(shapes) / seconds


def compute_seconds(shapes: Sequence[tuple[int, ...]], repeats: int) -> tuple[float, float, float, float, float]:
    """Median seconds this process takes, over float32 tensors of ``shapes`` (1-D), for:

    * a stream (:func:`stream_seconds`);
    * top-k's selection of :data:`MEASURE_DENSITY` of each tensor's magnitudes (the values scanned once);
    * PowerSGD's thin products with rank-:data:`MEASURE_RANK` factors, each tensor seen as ``[n, 512]``: ``P =
      M Q``, ``M^T P`` and ``P Q^T`` (:data:`MATMUL_PASSES` over every value); then the same at rank 1;
    * the scatter of :func:`_scattered` values at random indices into one dense sum of every value, less the
      same sum with one value scattered (its fill: a stream), per round.

    Each is run once per round, in interleaved rounds (at least 5), and its median over the rounds is kept: a
    burst of other work on the host then costs each kernel one round, not one kernel all of its runs.
    """
    import tensorflow as tf

    from tfdist.comm.selection import largest, topk_count

    values = [tf.abs(tf.random.stateless_normal(s, seed=(1, i))) for i, s in enumerate(shapes)]
    columns = 512
    matrices = [tf.reshape(v, [-1, columns]) for v in values]

    def products(rank: int) -> Callable[[], Any]:
        q = tf.ones([columns, rank])

        def run() -> Any:
            out = []
            for m in matrices:
                p = tf.matmul(m, q)
                out.append(tf.matmul(p, tf.matmul(m, p, transpose_a=True), transpose_b=True))
            return out

        return tf.function(run)

    total = sum(int(s[0]) for s in shapes)

    def scatter(count: int) -> Callable[[], Any]:
        where = tf.random.stateless_uniform([count, 1], seed=(2, count), maxval=total, dtype=tf.int32)
        sent = tf.ones([count])
        return tf.function(lambda: [tf.scatter_nd(where, sent, [total])])

    kernels = {
        "stream": _stream(shapes),
        "select": tf.function(
            lambda: [largest(v, topk_count(int(v.shape[0]), density=MEASURE_DENSITY)) for v in values]
        ),
        "products": products(MEASURE_RANK),
        "matvec": products(1),
        "scatter": scatter(_scattered(shapes)),
        "fill": scatter(1),
    }
    times = _interleaved(kernels, repeats, paired=("scatter", "fill"))
    return times["stream"], times["select"], times["products"], times["matvec"], times["scatter"]


def _interleaved(
    kernels: dict[str, Callable[[], Any]], repeats: int, paired: tuple[str, str] | None = None
) -> dict[str, float]:
    """Median seconds of each kernel (its last output fetched) over interleaved rounds, after one warm-up each
    (the tracing); ``paired`` (a, b): a's time is its median of a - b within each round."""
    import time

    def once(function: Callable[[], Any]) -> float:
        start = time.perf_counter()
        function()[-1].numpy()
        return time.perf_counter() - start

    for function in kernels.values():
        once(function)
    rounds: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(max(repeats, 5)):
        for name, function in kernels.items():
            rounds[name].append(once(function))
    if paired is not None:
        minuend, subtrahend = paired
        rounds[minuend] = [a - b for a, b in zip(rounds[minuend], rounds[subtrahend])]
    return {name: statistics.median(times) for name, times in rounds.items()}
