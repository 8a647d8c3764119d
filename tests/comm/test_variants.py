"""The planner's variants: each priced by its own traffic model, the fastest chosen."""

from __future__ import annotations

from typing import Any

import pytest

from tfdist.comm import BFloat16, LocalSGD, NoCompression, PowerSGD, compressed_traffic
from tfdist.comm.variants import VARIANTS, VariantEstimate, choose_variant, estimate_variants
from tfdist.errors import PlanError
from tfdist.plan import Plan

SHAPES = [(2048, 1000), (1000,), (3, 3, 256, 256)]
VALUES = 2048 * 1000 + 1000 + 9 * 256 * 256
LINK: dict[str, Any] = {"workers": 4, "bandwidth": 125e6, "latency": 50e-6}


def test_each_variant_is_priced_as_the_planner_prices_it() -> None:
    found = {e.label: e for e in estimate_variants(shapes=SHAPES, memory_bandwidth=10e9, **LINK)}
    assert len(found) == len(VARIANTS)
    fp32 = Plan(params=VALUES, **LINK)
    assert found["none"].wire_seconds == fp32.ring_allreduce_s and found["none"].bytes_per_step == 4 * VALUES
    assert found["bf16"].wire_seconds == Plan(params=VALUES, bytes_per_value=2, **LINK).ring_allreduce_s
    power = compressed_traffic(shapes=SHAPES, compression=PowerSGD(rank=2), memory_bandwidth=10e9, **LINK)
    assert (found["powersgd rank=2"].wire_seconds, found["powersgd rank=2"].arithmetic_seconds) == (
        power.seconds_per_step,
        power.arithmetic_seconds,
    )
    assert found["powersgd rank=2"].seconds == power.total_seconds
    assert found["local_sgd period=4"].bytes_per_step == VALUES  # 4 bytes each, every 4 steps


def test_the_choice_follows_the_link_and_the_memory() -> None:
    fast = estimate_variants(shapes=SHAPES, workers=2, bandwidth=100e9, latency=1e-6, memory_bandwidth=1e9)
    assert choose_variant(fast).label == "bf16"  # The arithmetic costs more than a 100 GB/s wire saves.
    slow = estimate_variants(shapes=SHAPES, workers=2, bandwidth=1.25e6, latency=1e-3, memory_bandwidth=20e9)
    assert choose_variant(slow).label == "powersgd rank=1"
    only = estimate_variants(shapes=SHAPES, variants=[NoCompression(), LocalSGD(period=8)], **LINK)
    assert choose_variant(only).compressor == LocalSGD(period=8)
    assert [e.arithmetic_seconds for e in only] == [None, None]


def test_invalid_input_is_a_plan_error() -> None:
    with pytest.raises(PlanError, match="`variants`"):
        estimate_variants(shapes=SHAPES, variants=[object()], **LINK)  # type: ignore[list-item]
    with pytest.raises(PlanError, match="`bandwidth`"):
        estimate_variants(shapes=SHAPES, workers=2, bandwidth=0, latency=0)
    with pytest.raises(PlanError, match="`estimates`"):
        choose_variant([])
    assert VariantEstimate(compressor=BFloat16(), bytes_per_step=1, wire_seconds=2.0).seconds == 2.0
