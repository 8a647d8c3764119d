"""The compressor registry: one typed config per compressor, found by name, carrying the numbers it had as
entries of name tables (bytes on the wire, traffic, arithmetic). Pure Python: no TensorFlow."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfdist.comm import (
    ARITHMETIC_PASSES,
    COMPRESSORS,
    GRADIENT_COMPRESSIONS,
    TRAFFIC_KINDS,
    BFloat16,
    CollectiveConfig,
    CollectiveTuning,
    Compressor,
    ErrorFeedback,
    Float16,
    HostRates,
    Link,
    LocalSGD,
    NoCompression,
    PowerSGD,
    TopK,
    TrafficModel,
    WireCast,
    compressed_traffic,
    compressor_for,
    gradient_value_bytes,
    register_compressor,
    registered_compressors,
    wire_bytes,
)
from tfdist.comm import registry as registry_module
from tfdist.errors import PlanError, StrategyError

SHAPES: dict[str, list[list[int]]] = {
    "mlp": [[8, 16], [16], [16, 1], [1]],
    "conv": [[3, 3, 64, 128], [128], [7, 7, 3, 64], [2048, 1000], [1000]],
    "small": [[4, 4], [6, 5], [3]],
}
# The configs as CollectiveConfig and compressed_traffic took them before compressors were typed.
NAMED: dict[str, dict[str, Any]] = {
    "none": {},
    "fp16": {"compression": "fp16"},
    "bf16": {"compression": "bf16"},
    "powersgd_r1": {"compression": "powersgd", "rank": 1},
    "powersgd_r4": {"compression": "powersgd", "rank": 4},
    "topk_1pct": {"compression": "topk", "density": 0.01},
    "topk_25pct": {"compression": "topk", "density": 0.25},
    "local_sgd_4": {"compression": "local_sgd", "period": 4},
    "local_sgd_1": {"compression": "local_sgd", "period": 1},
}
# PowerSGD as the name tables had it: no warm-up, every matrix the factors shrink at all (its defaults since
# are a 25-step warm-up and a rate of 2: test_powersgd_defaults_...).
PINNED_POWERSGD: dict[str, Any] = {"warmup_steps": 0, "min_compression_rate": 1}
TYPED: dict[str, Compressor] = {
    "none": NoCompression(),
    "fp16": Float16(),
    "bf16": BFloat16(),
    "powersgd_r1": PowerSGD(rank=1, **PINNED_POWERSGD),
    "powersgd_r4": PowerSGD(rank=4, **PINNED_POWERSGD),
    "topk_1pct": TopK(density=0.01),
    "topk_25pct": TopK(density=0.25),
    "local_sgd_4": LocalSGD(period=4),
    "local_sgd_1": LocalSGD(period=1),
}
# Pinned from the name-table implementation (wire_bytes and compressed_traffic before the registry), per
# shapes and config: wire bytes of float32 and of float64 tensors ...
WIRE = {
    ("mlp", "none"): (644, 1288),
    ("mlp", "fp16"): (326, 326),
    ("mlp", "bf16"): (322, 322),
    ("mlp", "powersgd_r1"): (228, 228),
    ("mlp", "powersgd_r4"): (516, 516),
    ("mlp", "topk_1pct"): (40, 40),
    ("mlp", "topk_25pct"): (328, 328),
    ("conv", "none"): (8529056, 17058112),
    ("conv", "fp16"): (4264532, 4264532),
    ("conv", "bf16"): (4264528, 4264528),
    ("conv", "powersgd_r1"): (20364, 20364),
    ("conv", "powersgd_r4"): (67920, 67920),
    ("conv", "topk_1pct"): (170600, 170600),
    ("conv", "topk_25pct"): (4264528, 4264528),
    ("small", "none"): (196, 392),
    ("small", "fp16"): (102, 102),
    ("small", "bf16"): (98, 98),
    ("small", "powersgd_r1"): (88, 88),
    ("small", "powersgd_r4"): (196, 196),
    ("small", "topk_1pct"): (24, 24),
    ("small", "topk_25pct"): (104, 104),
}
# ... and, per shapes, workers and config on a 1.25 GB/s, 50 us link with 20 GB/s of memory bandwidth:
# bytes_per_step, seconds_per_step, fewer_bytes, arithmetic_seconds.
TRAFFIC = {
    ("mlp", 2, "powersgd_r1"): (228.0, 0.0002001824, 2.824561403508772, 2.56e-07),
    ("mlp", 2, "powersgd_r4"): (516.0, 0.00020041280000000002, 1.248062015503876, 2.56e-07),
    ("mlp", 2, "topk_1pct"): (40.0, 0.00010003200000000001, 16.1, 3.864e-07),
    ("mlp", 2, "topk_25pct"): (328.0, 0.00010026240000000001, 1.9634146341463414, 3.864e-07),
    ("mlp", 2, "local_sgd_4"): (161.0, 2.5128800000000002e-05, 4.0, 2.415e-08),
    ("mlp", 2, "local_sgd_1"): (644.0, 0.00010051520000000001, 1.0, 9.66e-08),
    ("mlp", 8, "powersgd_r1"): (228.0, 0.0014003192, 2.824561403508772, 2.56e-07),
    ("mlp", 8, "powersgd_r4"): (516.0, 0.0014007224, 1.248062015503876, 2.56e-07),
    ("mlp", 8, "topk_1pct"): (40.0, 0.0007002239999999999, 16.1, 3.864e-07),
    ("mlp", 8, "topk_25pct"): (328.0, 0.0007018368, 1.9634146341463414, 3.864e-07),
    ("mlp", 8, "local_sgd_4"): (161.0, 0.0001752254, 4.0, 2.415e-08),
    ("mlp", 8, "local_sgd_1"): (644.0, 0.0007009016, 1.0, 9.66e-08),
    ("conv", 2, "powersgd_r1"): (20364.0, 0.0002162912, 418.83009231978, 0.004262272),
    ("conv", 2, "powersgd_r4"): (67920.0, 0.00025433599999999997, 125.57502944640754, 0.004262272),
    ("conv", 2, "topk_1pct"): (170600.0, 0.00023648, 49.99446658851114, 0.0051174336),
    ("conv", 2, "topk_25pct"): (4264528.0, 0.0035116224, 2.0, 0.0051174336),
    ("conv", 2, "local_sgd_4"): (2132264.0, 0.0017308112000000001, 4.0, 0.0003198396),
    ("conv", 2, "local_sgd_1"): (8529056.0, 0.0069232448000000005, 1.0, 0.0012793584),
    ("conv", 8, "powersgd_r1"): (20364.0, 0.0014285095999999999, 418.83009231978, 0.004262272),
    ("conv", 8, "powersgd_r4"): (67920.0, 0.0014950879999999999, 125.57502944640754, 0.004262272),
    ("conv", 8, "topk_1pct"): (170600.0, 0.00165536, 49.99446658851114, 0.0051174336),
    ("conv", 8, "topk_25pct"): (4264528.0, 0.0245813568, 2.0, 0.0051174336),
    ("conv", 8, "local_sgd_4"): (2132264.0, 0.0031601695999999998, 4.0, 0.0003198396),
    ("conv", 8, "local_sgd_1"): (8529056.0, 0.012640678399999999, 1.0, 0.0012793584),
    ("small", 2, "powersgd_r1"): (88.0, 0.00020007040000000003, 2.227272727272727, 9.2e-08),
    ("small", 2, "powersgd_r4"): (196.0, 0.00010015680000000001, 1.0, 0.0),
    ("small", 2, "topk_1pct"): (24.0, 0.0001000192, 8.166666666666666, 1.176e-07),
    ("small", 2, "topk_25pct"): (104.0, 0.00010008320000000001, 1.8846153846153846, 1.176e-07),
    ("small", 2, "local_sgd_4"): (49.0, 2.5039200000000002e-05, 4.0, 7.35e-09),
    ("small", 2, "local_sgd_1"): (196.0, 0.00010015680000000001, 1.0, 2.94e-08),
    ("small", 8, "powersgd_r1"): (88.0, 0.0014001232000000001, 2.227272727272727, 9.2e-08),
    ("small", 8, "powersgd_r4"): (196.0, 0.0007002744, 1.0, 0.0),
    ("small", 8, "topk_1pct"): (24.0, 0.0007001344, 8.166666666666666, 1.176e-07),
    ("small", 8, "topk_25pct"): (104.0, 0.0007005824, 1.8846153846153846, 1.176e-07),
    ("small", 8, "local_sgd_4"): (49.0, 0.0001750686, 4.0, 7.35e-09),
    ("small", 8, "local_sgd_1"): (196.0, 0.0007002744, 1.0, 2.94e-08),
}


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry as it is, restored after the test (which may register compressors of its own)."""
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    yield


def _as_pinned(compressor: Compressor) -> Compressor:
    """``compressor`` with the options the name tables had (PowerSGD's :data:`PINNED_POWERSGD`)."""
    return dataclasses.replace(compressor, **PINNED_POWERSGD) if isinstance(compressor, PowerSGD) else compressor


@pytest.mark.parametrize("key", sorted(WIRE), ids="/".join)
def test_wire_bytes_are_what_the_name_tables_gave(key: tuple[str, str]) -> None:
    shapes, config = key
    for dtype, pinned in zip(("float32", "float64"), WIRE[key]):
        tensors = [np.zeros(shape, dtype) for shape in SHAPES[shapes]]
        named = CollectiveConfig(**NAMED[config]).compressor
        assert wire_bytes(tensors, CollectiveConfig(compression=_as_pinned(named))) == pinned
        assert wire_bytes(tensors, CollectiveConfig(compression=TYPED[config])) == pinned
        assert CollectiveConfig(compression=TYPED[config]).compressor.wire_bytes(tensors) == pinned


@pytest.mark.parametrize("key", sorted(TRAFFIC), ids=lambda key: "/".join(map(str, key)))
def test_traffic_is_what_the_name_tables_gave(key: tuple[str, int, str]) -> None:
    shapes, workers, config = key
    link: dict[str, Any] = {"workers": workers, "bandwidth": 1.25e9, "latency": 5e-5, "memory_bandwidth": 2e10}
    named = compressor_for(NAMED[config]["compression"], {k: v for k, v in NAMED[config].items() if k != "compression"})
    for compression in (_as_pinned(named), TYPED[config]):
        traffic = compressed_traffic(shapes=SHAPES[shapes], **link, compression=compression)  # type: ignore[arg-type]
        got = (traffic.bytes_per_step, traffic.seconds_per_step, traffic.fewer_bytes)
        assert got == pytest.approx(TRAFFIC[key][:3], rel=1e-12, abs=1e-18)
        # The tables' arithmetic was every pass at the memory bandwidth: so is the compute when the thin
        # products run at memory speed, and with top-k's selection taken out and its scatter-add as the tables
        # had it (two passes: now the sum's fill, one, and every worker's entries at the scatter rate).
        assert isinstance(compression, TrafficModel)
        stream = HostRates(memory_bandwidth=2e10, matmul_bandwidth=2e10, matvec_bandwidth=2e10)
        compute = compression.compute_seconds(SHAPES[shapes], stream, workers=workers)
        if isinstance(compression, TopK):
            values = sum(math.prod(s) for s in SHAPES[shapes])
            entries = workers * compression.sent_bytes(SHAPES[shapes]) / 8
            compute -= stream.select_seconds(values) + stream.scatter_seconds(entries)
            compute += stream.arithmetic_seconds(1, values)
        assert compute == pytest.approx(TRAFFIC[key][3], rel=1e-9, abs=1e-18)
        assert traffic.arithmetic_seconds == compression.compute_seconds(
            SHAPES[shapes], HostRates(memory_bandwidth=2e10), workers=workers
        )
    compressor = TYPED[config]
    assert isinstance(compressor, TrafficModel)
    assert compressor.sent_bytes(SHAPES[shapes]) == TRAFFIC[key][0]
    on = Link(workers=workers, bandwidth=1.25e9, latency=5e-5)
    assert compressor.seconds(SHAPES[shapes], on) == pytest.approx(TRAFFIC[key][1], rel=1e-12, abs=1e-18)


def test_the_built_in_names_and_numbers_are_those_of_the_old_tables() -> None:
    assert list(registered_compressors()) == ["none", "fp16", "bf16", "powersgd", "topk", "local_sgd"]
    assert GRADIENT_COMPRESSIONS == ("none", "fp16", "bf16") and COMPRESSORS == ("powersgd", "topk")
    assert TRAFFIC_KINDS == ("powersgd", "topk", "local_sgd")
    assert ARITHMETIC_PASSES == {"powersgd": 10, "topk": 11, "local_sgd": 3}
    assert {name: gradient_value_bytes(name) for name in GRADIENT_COMPRESSIONS} == {"none": 4, "fp16": 2, "bf16": 2}
    assert [CollectiveConfig(compression=name).wire_dtype_name for name in GRADIENT_COMPRESSIONS] == [
        None,
        "float16",
        "bfloat16",
    ]
    assert (Float16.wire_max, BFloat16.wire_max) == (65504.0, None)  # Only float16 is range-scaled.
    # The defaults CollectiveConfig and compressed_traffic had for every compression.
    assert (PowerSGD().rank, TopK().density, LocalSGD().period) == (4, 0.01, 4)
    assert (PowerSGD().warmup_steps, PowerSGD().min_compression_rate) == (25, 2.0)  # Added since: torch's rate.
    assert wire_bytes([], CollectiveConfig(compression="fp16")) == 0  # No tensors: no range scalar either.


def test_powersgd_defaults_warm_up_and_send_the_matrices_they_would_not_halve_whole() -> None:
    # Rate 2: the MLP's 8x16 kernel is 128 values against 96 in rank-4 factors, so everything goes whole,
    # as without compression (and there is no warm-up to end); at rank 1 (24 values) it is compressed.
    link = Link(workers=2, bandwidth=1.25e9, latency=5e-5)
    assert PowerSGD(rank=4).sent_bytes(SHAPES["mlp"]) == WIRE[("mlp", "none")][0]
    assert PowerSGD(rank=4).warmup(SHAPES["mlp"], link).steps == 0
    # After the warm-up, one value more than the name tables: the warm-up's sum, ended, in the P factors'
    # all-reduce (its seconds charged there).
    for shapes in ("mlp", "conv"):
        pinned = TRAFFIC[(shapes, 2, "powersgd_r1")]
        assert PowerSGD(rank=1).sent_bytes(SHAPES[shapes]) == pinned[0] + 4
        assert PowerSGD(rank=1).seconds(SHAPES[shapes], link) == pytest.approx(pinned[1] + 4 / 1.25e9, rel=1e-12)
    # The small set: 4x4 at rank 1 is 16 values against 8, exactly 2x: whole. 6x5 (11 against 30) compressed.
    assert PowerSGD(rank=1).sent_bytes(SHAPES["small"]) == 4 * (16 + 11 + 3 + 1)
    # During the warm-up: every compressed matrix whole beside the factors (2 workers: one all-reduce each
    # of P with the plain sum, and of Q with the tensors sent whole).
    warm = PowerSGD(rank=4).warmup(SHAPES["conv"], link)
    p, q, whole, matrices = 4 * (576 + 147 + 2048), 4 * (128 + 64 + 1000), 128 + 1000, 73728 + 9408 + 2048000
    assert (warm.steps, warm.sent_bytes) == (25, 4.0 * (p + matrices + q + whole))
    assert warm.seconds == pytest.approx(link.ring(4.0 * (p + matrices)) + link.ring(4.0 * (q + whole)), rel=1e-12)
    traffic = compressed_traffic(
        shapes=SHAPES["conv"], workers=2, bandwidth=1.25e9, latency=5e-5, compression="powersgd"
    )
    assert (traffic.warmup_steps, traffic.warmup_bytes_per_step) == (25, warm.sent_bytes)
    assert traffic.to_dict()["warmup_seconds_per_step"] == warm.seconds
    assert (
        compressed_traffic(
            shapes=SHAPES["conv"], workers=2, bandwidth=1.25e9, latency=5e-5, compression="topk"
        ).warmup_steps
        == 0
    )


def test_a_typed_config_and_its_name_with_options_are_the_same_config() -> None:
    assert CollectiveConfig(compression="powersgd", rank=2) == CollectiveConfig(compression=PowerSGD(rank=2))
    assert CollectiveConfig(compression="powersgd").compressor == PowerSGD(rank=4)
    assert CollectiveConfig(compression="bf16") == CollectiveConfig(compression=BFloat16())
    assert CollectiveConfig(compression="topk", density=0.5) != CollectiveConfig(compression=TopK())
    assert repr(CollectiveConfig(compression="topk", density=0.5, bytes_per_pack=8)) == (
        "CollectiveConfig(bytes_per_pack=8, split_bytes=0, compressor=TopK(density=0.5))"
    )
    config = CollectiveConfig(compression="powersgd", rank=2, split_bytes=64)
    assert dataclasses.replace(config, bytes_per_pack=1).compressor == PowerSGD(rank=2)  # Options survive.
    assert config.compression == "powersgd" and config.rank == 2 and config.density is None  # As given.


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (
            {"compression": "topk", "rank": 4},
            r"`rank`. Received: 4. Expected no `rank` with 'topk' \(its options: "
            r"density\). Pass rank only with 'powersgd'",
        ),
        ({"compression": "bf16", "density": 0.1}, r"`density`.*no `density` with 'bf16' \(its options: none\)"),
        (
            {"compression": PowerSGD(rank=2), "rank": 2},
            r"`rank`.*no `rank` beside a compressor object.*PowerSGD\(rank=...\)",
        ),
        ({"compression": "powersgd", "rank": 0}, r"`rank`. Received: 0. Expected an integer >= 1"),
        ({"compression": "topk", "density": 1.5}, r"`density`. Received: 1.5"),
        (
            {"compression": "local_sgd"},
            r"`compression`. Received: 'local_sgd'.*'topk'.*is a TrafficModel, not a "
            r"WireCast or ErrorFeedback",
        ),
        ({"compression": LocalSGD()}, r"`compression`. Received: 'local_sgd'"),
        ({"compression": PowerSGD}, r"`compression`. Received: <class"),
    ],
    ids=[
        "rank_with_topk",
        "density_with_bf16",
        "rank_beside_typed",
        "bad_rank",
        "bad_density",
        "local_sgd",
        "local_sgd_typed",
        "a_class",
    ],
)
def test_collective_config_refuses_options_of_another_compressor(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(StrategyError, match=pattern) as caught:
        CollectiveConfig(**kwargs)
    assert caught.value.field in (kwargs.keys() - {"compression"} or {"compression"})  # The argument at fault.


def test_an_unknown_name_says_which_one_was_meant() -> None:
    with pytest.raises(StrategyError, match=r"`compression`. Received: 'powersdg'.*\(did you mean 'powersgd'\?\)"):
        CollectiveConfig(compression="powersdg")
    with pytest.raises(PlanError, match=r"`compression`. Received: 'top_k'.*\(did you mean 'topk'\?\)"):
        compressed_traffic(shapes=[[4]], workers=2, bandwidth=1e9, latency=1e-4, compression="top_k")
    with pytest.raises(PlanError, match=r"Received: 'bf16'. Expected one of 'local_sgd', 'powersgd', 'topk'"):
        compressed_traffic(shapes=[[4]], workers=2, bandwidth=1e9, latency=1e-4, compression="bf16")
    with pytest.raises(StrategyError, match=r"`compression`. Received: 'fp61'.*did you mean 'fp16'"):
        gradient_value_bytes("fp61")


def test_compressed_traffic_refuses_an_option_of_another_compressor() -> None:
    link: dict[str, Any] = {"shapes": [[64, 64]], "workers": 2, "bandwidth": 1e9, "latency": 1e-4}
    with pytest.raises(StrategyError, match=r"`period`.*no `period` with 'powersgd'.*only with 'local_sgd'"):
        compressed_traffic(compression="powersgd", period=8, **link)
    with pytest.raises(StrategyError, match=r"`density`.*beside a compressor object"):
        compressed_traffic(compression=TopK(), density=0.1, **link)
    with pytest.raises(StrategyError, match=r"`period`. Received: 0"):
        compressed_traffic(compression="local_sgd", period=0, **link)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Halves(TrafficModel):
    """A traffic model that sends half of every gradient (for the registry's tests)."""

    name = "halves"
    arithmetic_passes = 2

    share: float = dataclasses.field(default=0.5, metadata={"help": "the share sent"})

    def sent_bytes(self, shapes: Any) -> float:
        return 4.0 * self.share * sum(math.prod(s) for s in shapes)

    def seconds(self, shapes: Any, link: Link) -> float:
        return link.ring(self.sent_bytes(shapes))

    def streamed_values(self, shapes: Any) -> float:
        return float(sum(math.prod(s) for s in shapes))


def test_a_new_compressor_is_one_class_registered_in_one_place(registry: None) -> None:
    assert register_compressor(_Halves) is _Halves
    assert list(registered_compressors(TrafficModel)) == ["powersgd", "topk", "local_sgd", "halves"]
    assert compressor_for("halves", {"share": 0.25}) == _Halves(share=0.25)
    traffic = compressed_traffic(shapes=[[1000]], workers=2, bandwidth=1e9, latency=1e-4, compression="halves")
    assert (traffic.compression, traffic.bytes_per_step, traffic.fewer_bytes) == ("halves", 2000.0, 2.0)
    with pytest.raises(StrategyError, match="is a TrafficModel, not a WireCast or ErrorFeedback"):
        CollectiveConfig(compression="halves")  # Not a compression of the all-reduce.
    register_compressor(_Halves)  # Registering the same class again changes nothing.


def test_a_duplicate_name_is_refused_naming_both_classes(registry: None) -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OtherTopK(_Halves):
        name = "topk"

    with pytest.raises(StrategyError, match=r"`name`. Received: 'topk'") as caught:
        register_compressor(OtherTopK)
    message = str(caught.value)
    assert "tfdist.comm.topk.TopK" in message and f"{__name__}.{OtherTopK.__qualname__}" in message
    assert registered_compressors()["topk"] is TopK


def test_the_registry_refuses_what_is_not_a_complete_compressor(registry: None) -> None:
    class Plain:
        name = "plain"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unfinished(ErrorFeedback):  # No traffic, state or step.
        name = "unfinished"

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class NoDefault(_Halves):
        name = "nodefault"
        levels: int

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Nameless(_Halves):
        name = "no name"

    with pytest.raises(StrategyError, match="a dataclass subclass of tfdist.comm.Compressor"):
        register_compressor(Plain)  # type: ignore[type-var]
    with pytest.raises(StrategyError, match=r"implements every method. Add .*sent_bytes.*state_slots.*step"):
        register_compressor(Unfinished)
    with pytest.raises(StrategyError, match="options that all have defaults. Give levels a default"):
        register_compressor(NoDefault)
    with pytest.raises(StrategyError, match=r"`cls.name`. Received: 'no name'"):
        register_compressor(Nameless)
    with pytest.raises(StrategyError, match="a registered compressor. Register its class"):
        CollectiveConfig(compression=_Halves())
    assert set(registered_compressors()) == {"none", "fp16", "bf16", "powersgd", "topk", "local_sgd"}


def test_every_compressor_is_a_frozen_keyword_only_config_with_defaults() -> None:
    for name, cls in registered_compressors().items():
        assert cls.name == name and issubclass(cls, (WireCast, TrafficModel)), name
        fields = dataclasses.fields(cls)
        assert all(f.kw_only and f.default is not dataclasses.MISSING for f in fields), name
        assert compressor_for(name) == cls()
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cls(), fields[0].name if fields else "name", None)


def test_a_tuning_file_keeps_its_compressor_and_reads_older_files(tmp_path: Path) -> None:
    path = os.fspath(tmp_path / "tuning.json")
    tuning = CollectiveTuning(compression=PowerSGD(rank=2), bytes_per_pack=1 << 20, timings_ms={"0": 1.5})
    tuning.save(path)
    body = json.loads(Path(path).read_text())
    assert (body["compression"], body["rank"], "density" in body) == ("powersgd", 2, False)
    assert CollectiveTuning.load(path) == tuning
    # Files written before compressors were typed hold rank and density whatever the compression.
    older = {"format": "tfdist-collective-tuning/1", "bytes_per_pack": 4, "compression": "bf16", "density": 0.01}
    Path(path).write_text(
        json.dumps({**older, "rank": 4, "split_bytes": 0, "timings_ms": {}, "total_bytes": 0, "workers": 1})
    )
    loaded = CollectiveTuning.load(path)
    assert loaded.compressor == BFloat16() and loaded.bytes_per_pack == 4
    Path(path).write_text(json.dumps({**older, "compression": "topk", "density": 0.1, "rank": 4}))
    assert CollectiveTuning.load(path).compressor == TopK(density=0.1)
    Path(path).write_text(json.dumps({**older, "levels": 3}))
    with pytest.raises(StrategyError, match=r"`tuning`. Received: \['levels'\]"):
        CollectiveTuning.load(path)
