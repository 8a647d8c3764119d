"""The host's share of a step in the planner: its collectives' rate and its arithmetic, beside the wire."""

from __future__ import annotations

import dataclasses
import itertools
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from tfdist.comm import (
    BFloat16,
    Float16,
    HostRates,
    NoCompression,
    PowerSGD,
    TopK,
    combined_seconds,
    compressed_traffic,
    estimate_variants,
    host_seconds,
    measure_host_rates,
)
from tfdist.comm.host import (
    DEFAULT_COLLECTIVE_BANDWIDTH,
    DEFAULT_MATMUL_BANDWIDTH,
    DEFAULT_MEMORY_BANDWIDTH,
    DEFAULT_SCATTER_BANDWIDTH,
    DEFAULT_SELECT_BANDWIDTH,
    PACKED_OVERLAP,
)
from tfdist.comm.variants import choose_variant
from tfdist.errors import PlanError
from tfdist.plan import Plan

# About the ResNet-50 gradient list's size (25.6M values) in a few tensors.
SHAPES = [(3, 3, 512, 512)] * 10 + [(2048, 1000), (1000,)]
VALUES = 10 * 9 * 512 * 512 + 2048 * 1000 + 1000
ONE_GBIT: dict[str, Any] = {"workers": 2, "bandwidth": 125e6, "latency": 50e-6}


def test_combined_is_a_sum_a_maximum_or_between() -> None:
    assert combined_seconds(wire=0.8, host=0.3, overlap=0.0) == pytest.approx(1.1)
    assert combined_seconds(wire=0.8, host=0.3, overlap=1.0) == pytest.approx(0.8)
    assert combined_seconds(wire=0.1, host=0.3, overlap=1.0) == pytest.approx(0.3)
    assert combined_seconds(wire=0.8, host=0.3, overlap=0.5) == pytest.approx(0.95)
    assert combined_seconds(wire=0.0, host=0.3, overlap=0.5) == pytest.approx(0.3)  # No wire: the host alone.


@pytest.mark.parametrize("overlap", sorted({0.0, 0.25, 0.5, PACKED_OVERLAP, 0.9, 1.0}))
def test_host_seconds_inverts_the_combination(overlap: float) -> None:
    for wire, host in itertools.product((0.0, 0.05, 0.4, 0.8), (0.01, 0.2, 0.8, 1.5)):
        if overlap == 1.0 and host <= wire:
            continue  # The longer alone counts: a host shorter than the wire leaves no trace.
        measured = combined_seconds(wire=wire, host=host, overlap=overlap)
        assert host_seconds(measured=measured, wire=wire, overlap=overlap) == pytest.approx(host), (wire, host)
    assert host_seconds(measured=0.5, wire=0.8, overlap=overlap) == 0.0  # Faster than the wire: not told.


def test_host_rates_have_measured_defaults_and_refuse_what_cannot_be() -> None:
    host = HostRates()
    assert (host.collective_bandwidth, host.memory_bandwidth, host.overlap) == (
        DEFAULT_COLLECTIVE_BANDWIDTH,
        DEFAULT_MEMORY_BANDWIDTH,
        PACKED_OVERLAP,
    )
    assert host.collective_seconds(300e6) == pytest.approx(1.0)
    assert host.arithmetic_seconds(3, 25e6) == pytest.approx(3 * 4 * 25e6 / DEFAULT_MEMORY_BANDWIDTH)
    # What is no stream through memory runs slower than one: top-k's selection, PowerSGD's thin products.
    assert DEFAULT_SELECT_BANDWIDTH < DEFAULT_MATMUL_BANDWIDTH < DEFAULT_MEMORY_BANDWIDTH
    assert host.select_seconds(25e6) == pytest.approx(4 * 25e6 / DEFAULT_SELECT_BANDWIDTH)
    assert host.matmul_seconds(4, 25e6) == pytest.approx(4 * 4 * 25e6 / DEFAULT_MATMUL_BANDWIDTH)
    bad: dict[str, Any]
    for bad in (
        {"collective_bandwidth": 0},
        {"memory_bandwidth": -1e9},
        {"select_bandwidth": 0.0},
        {"matmul_bandwidth": float("nan")},
        {"overlap": 1.5},
        {"overlap": "x"},
    ):
        with pytest.raises(PlanError, match=f"`{next(iter(bad))}`") as caught:
            HostRates(**bad)
        assert caught.value.field == next(iter(bad))
        assert isinstance(caught.value, ValueError)
    with pytest.raises(PlanError, match="tfdist doctor --probe 30 --measure-host"):
        HostRates(collective_bandwidth=float("inf"))
    for call in (
        lambda: combined_seconds(wire=-1.0, host=0.1, overlap=0.5),
        lambda: host_seconds(measured=0.1, wire=0.1, overlap=2),
    ):
        with pytest.raises(PlanError):
            call()


def test_measure_host_rates_checks_its_arguments_before_tensorflow() -> None:
    with pytest.raises(PlanError, match="`link_bandwidth`"):
        measure_host_rates(None, link_bandwidth=0)
    with pytest.raises(PlanError, match="`repeats`"):
        measure_host_rates(None, repeats=0)


def test_a_variant_pays_its_collectives_on_the_host_as_on_a_link_of_that_rate() -> None:
    host = HostRates(collective_bandwidth=300e6, memory_bandwidth=10e9, overlap=0.5)
    found = {e.label: e for e in estimate_variants(shapes=SHAPES, host=host, **ONE_GBIT)}
    fp32 = Plan(params=VALUES, workers=2, bandwidth=300e6, latency=0.0)
    assert found["none"].host_seconds == pytest.approx(fp32.ring_allreduce_s)  # 102 MB each way at 300 MB/s
    assert found["none"].arithmetic_seconds == 0.0
    assert found["bf16"].host_seconds == pytest.approx(fp32.ring_allreduce_s / 2)
    assert found["bf16"].arithmetic_seconds == pytest.approx(BFloat16.arithmetic_passes * 4 * VALUES / 10e9)
    assert Float16.arithmetic_passes > BFloat16.arithmetic_passes > NoCompression.arithmetic_passes == 0
    wire, on_host = found["none"].wire_seconds, found["none"].host_seconds or 0.0
    assert found["none"].seconds == pytest.approx(wire + on_host - 0.5 * min(wire, on_host))
    power = compressed_traffic(shapes=SHAPES, compression=PowerSGD(rank=4), memory_bandwidth=10e9, **ONE_GBIT)
    assert found["powersgd rank=4"].arithmetic_seconds == power.arithmetic_seconds  # One memory model for both.
    assert found["powersgd rank=4"].wire_seconds == power.seconds_per_step
    assert 0 < (found["powersgd rank=4"].host_seconds or 0) < power.seconds_per_step  # No latency on the host.


def test_without_host_rates_the_wire_and_the_arithmetic_add_up_as_before() -> None:
    plain = estimate_variants(shapes=SHAPES, memory_bandwidth=10e9, **ONE_GBIT)
    assert all(e.host_seconds is None and e.overlap == 0.0 for e in plain)
    assert all(e.seconds == pytest.approx(e.wire_seconds + (e.arithmetic_seconds or 0.0)) for e in plain)
    with pytest.raises(PlanError, match="`memory_bandwidth`. Received: 10000000000.0. Expected None with `host`"):
        estimate_variants(shapes=SHAPES, memory_bandwidth=10e9, host=HostRates(), **ONE_GBIT)


def test_a_slow_host_moves_the_choice_where_the_wire_alone_would_not() -> None:
    fast_link = {**ONE_GBIT, "bandwidth": 100e9}  # 800 Gbit/s: the wire is never the limit.
    quick_host = HostRates(collective_bandwidth=100e9, memory_bandwidth=1e9)
    assert choose_variant(estimate_variants(shapes=SHAPES, host=quick_host, **fast_link)).label == "none"
    slow_host = HostRates(collective_bandwidth=100e6, memory_bandwidth=10e9)
    # The host's copies now cost what a slow link would: the fewest bytes win again.
    assert choose_variant(estimate_variants(shapes=SHAPES, host=slow_host, **fast_link)).label == "powersgd rank=1"
    # On 2 CPU cores at 10 Gbit/s the host, not the wire, decides TF's collectives' time (measured: 4-5x the wire).
    ten_gbit = {**ONE_GBIT, "bandwidth": 1.25e9}
    bf16 = estimate_variants(shapes=SHAPES, host=HostRates(), variants=[BFloat16()], **ten_gbit)[0]
    assert bf16.seconds > 4 * bf16.wire_seconds


def test_each_compressor_prices_its_compute_at_the_rate_of_what_it_does() -> None:
    matrices = 10 * 9 * 512 * 512 + 2048 * 1000  # What PowerSGD compresses; the bias goes whole.
    host = HostRates(
        memory_bandwidth=10e9, select_bandwidth=1e9, scatter_bandwidth=2e7, matmul_bandwidth=4e9, matvec_bandwidth=8e9
    )
    found = {e.label: e for e in estimate_variants(shapes=SHAPES, host=host, **ONE_GBIT)}
    # PowerSGD: 6 passes through memory, its 4 thin products at theirs: rank 1's matrix-vector products at
    # the matvec rate, ranks 2 and 4 at the matmul rate.
    for rank, products in ((1, 8e9), (2, 4e9), (4, 4e9)):
        power = 6 * 4 * matrices / 10e9 + 4 * 4 * matrices / products
        assert found[f"powersgd rank={rank}"].arithmetic_seconds == pytest.approx(power)
    # Top-k: 11 passes through memory, its selection scanning every value once, and the scatter of both
    # workers' entries (1% of each tensor, rounded up) into their sum.
    entries = 2 * (10 * 23593 + 20480 + 10)
    topk = 11 * 4 * VALUES / 10e9 + 4 * VALUES / 1e9 + 4 * entries / 2e7
    assert found["topk density=0.01"].arithmetic_seconds == pytest.approx(topk)
    # Local SGD and the casts stream only: the new rates leave them as they were.
    stream_only = HostRates(
        memory_bandwidth=10e9, select_bandwidth=1.0, scatter_bandwidth=1.0, matmul_bandwidth=1.0, matvec_bandwidth=1.0
    )
    same = {e.label: e for e in estimate_variants(shapes=SHAPES, host=stream_only, **ONE_GBIT)}
    for label in ("none", "bf16", "fp16", "local_sgd period=4"):
        assert same[label].seconds == found[label].seconds
    # A slower selection or scatter moves top-k alone; slower thin products move ranks 2 and 4 alike, slower
    # matrix-vector products rank 1 alone.
    slower = HostRates(
        memory_bandwidth=10e9, select_bandwidth=0.5e9, scatter_bandwidth=1e7, matmul_bandwidth=2e9, matvec_bandwidth=8e9
    )
    moved = {
        e.label: e.seconds - found[e.label].seconds for e in estimate_variants(shapes=SHAPES, host=slower, **ONE_GBIT)
    }
    assert moved["topk density=0.01"] == pytest.approx(4 * VALUES / 1e9 + 4 * entries / 2e7)
    assert moved["powersgd rank=4"] == pytest.approx(4 * 4 * matrices / 4e9)
    assert moved["powersgd rank=2"] == pytest.approx(moved["powersgd rank=4"])
    assert moved["powersgd rank=1"] == 0
    slower_matvec = dataclasses.replace(host, matvec_bandwidth=4e9)
    again = {e.label: e for e in estimate_variants(shapes=SHAPES, host=slower_matvec, **ONE_GBIT)}
    assert again["powersgd rank=1"].seconds - found["powersgd rank=1"].seconds == pytest.approx(4 * 4 * matrices / 8e9)
    assert all(again[label].seconds == found[label].seconds for label in found if label != "powersgd rank=1")
    # Top-k's scatter grows with the workers (each one's entries land in the sum); its other compute does not.
    four = estimate_variants(shapes=SHAPES, host=host, variants=[TopK()], **{**ONE_GBIT, "workers": 4})[0]
    more = (four.arithmetic_seconds or 0.0) - (found["topk density=0.01"].arithmetic_seconds or 0.0)
    assert more == pytest.approx(4 * entries / 2e7)


class _Timed:
    """A fake kernel for the probe's rounds: each call sleeps its next duration and returns a fetchable output."""

    def __init__(self, name: str, seconds: list[float], calls: list[str]) -> None:
        self.name, self.seconds, self.calls = name, iter(seconds), calls

    def __call__(self) -> list[Any]:
        self.calls.append(self.name)
        time.sleep(next(self.seconds))
        return [types.SimpleNamespace(numpy=lambda: 0.0)]  # As a tensor's output is fetched.


def test_the_probe_times_its_kernels_in_interleaved_rounds_and_pairs_the_scatter_with_its_fill() -> None:
    from tfdist.comm import host_probe

    calls: list[str] = []
    # One warm-up each, then 5 rounds. The selection meets a burst of other work in one round; the scatter and
    # its fill in three rounds of five, the same burst for both within a round.
    kernels: dict[str, Callable[[], Any]] = {
        "select": _Timed("select", [0.0, 0.01, 0.3, 0.01, 0.01, 0.01], calls),
        "scatter": _Timed("scatter", [0.0, 0.35, 0.35, 0.35, 0.05, 0.05], calls),
        "fill": _Timed("fill", [0.0, 0.3, 0.3, 0.3, 0.0, 0.0], calls),
    }
    times = host_probe._interleaved(kernels, repeats=3, paired=("scatter", "fill"))  # At least 5 rounds.
    assert calls == ["select", "scatter", "fill"] * 6  # Interleaved: each round runs every kernel once.
    assert times["select"] < 0.2  # The burst costs the selection one round, not its median.
    assert times["fill"] >= 0.3  # Unpaired, a burst in most rounds is the median...
    assert times["scatter"] < 0.2  # ...paired with the fill round by round, it cancels: the scatter's 0.05 s.


def test_a_scatter_the_probe_cannot_tell_from_its_fill_keeps_the_default_rate(caplog: pytest.LogCaptureFixture) -> None:
    from tfdist.comm import host_probe

    shapes = [(1 << 20,)] * 2  # Two workers' 1% of each: 2 * 2 * 10,486 values.
    assert host_probe._scatter_rate(shapes, 0.1) == pytest.approx(4 * 2 * 2 * 10486 / 0.1)
    with caplog.at_level("WARNING", logger="tfdist.comm.host"):
        assert host_probe._scatter_rate(shapes, -0.001) == DEFAULT_SCATTER_BANDWIDTH
    assert "no longer than the sum's fill alone (-1.00 ms)" in caplog.text
    assert f"keeping {DEFAULT_SCATTER_BANDWIDTH / 1e6:.3g} MB/s" in caplog.text
