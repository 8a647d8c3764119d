"""The cost model and `tfdist plan`: units, formulas, recommendations, JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tfdist import testing
from tfdist.plan import Plan, PlanError, parse_quantity

GBPS10 = 1.25e9


@pytest.mark.parametrize(
    "text,kind,expected",
    [
        pytest.param("25.6M", "count", 25.6e6, id="count_m"),
        pytest.param("7G", "count", 7e9, id="count_g"),
        pytest.param("7B", "count", 7e9, id="count_b"),
        pytest.param("1.5B", "count", 1.5e9, id="count_b_fraction"),
        pytest.param("70b", "count", 70e9, id="count_b_70"),
        pytest.param("1000", "count", 1e3, id="count_plain"),
        pytest.param("10Gbps", "bandwidth", 1.25e9, id="gbps"),
        pytest.param("100Mbit/s", "bandwidth", 12.5e6, id="mbit"),
        pytest.param("1.25GB/s", "bandwidth", 1.25e9, id="gbyte_s"),
        pytest.param("16GiB", "bytes", 16 * 2**30, id="gib"),
        pytest.param("80GB", "bytes", 80e9, id="gb"),
        pytest.param("50us", "time", 50e-6, id="us"),
        pytest.param("2ms", "time", 2e-3, id="ms"),
        pytest.param("0.1s", "time", 0.1, id="s"),
    ],
)
def test_units_parse(text: str, kind: str, expected: float) -> None:
    assert parse_quantity(text, kind) == pytest.approx(expected, abs=expected * 1e-9)


@pytest.mark.parametrize(
    "text,kind,message",
    [
        pytest.param("10 gigabits", "bandwidth", "a bandwidth such as '10Gbps'", id="bandwidth"),
        pytest.param("50", "time", "a time such as '50us'", id="time"),
        pytest.param("lots", "count", "a count such as '25.6M'", id="count"),
    ],
)
def test_bad_units(text: str, kind: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_quantity(text, kind)


def test_formulas() -> None:
    plan = Plan(params=25.6e6, workers=4, bandwidth=GBPS10, latency=50e-6, ps_shards=2)
    assert plan.ring_allreduce_s == pytest.approx(6 * 50e-6 + 1.5 * 102.4e6 / GBPS10, abs=0.5e-7)
    assert plan.tree_allreduce_s == pytest.approx(4 * 50e-6 + 2 * 102.4e6 / GBPS10, abs=0.5e-7)
    assert plan.ps_s == pytest.approx(2 * 50e-6 + 2 * 4 * 102.4e6 / (2 * GBPS10), abs=0.5e-7)
    assert plan.memory_per_replica_bytes == 25.6e6 * 4 * 4  # weights, gradients, two Adam slots
    assert Plan(params=1e6, workers=1, bandwidth=1e9, latency=1e-5).ring_allreduce_s == 0.0
    half = Plan(params=25.6e6, workers=4, bandwidth=GBPS10, latency=50e-6, bytes_per_value=2)
    assert half.gradient_bytes == pytest.approx(plan.gradient_bytes / 2, abs=0.5e-7)


@pytest.mark.parametrize(
    "fields,expected",
    [
        pytest.param(
            dict(params=25.6e6, workers=4, device_memory=16 * 2**30), "data_parallel", id="fits_and_allreduce_wins"
        ),
        pytest.param(dict(params=7e9, workers=8, device_memory=16 * 2**30), "model_parallel", id="too_big"),
        # Dense gradients: each worker pushes and pulls all of them (2S/B), more than ring's 2(N-1)/N S/B,
        # however many ps shards there are. PS wins on sparse updates (embeddings), not modelled here yet.
        pytest.param(
            dict(params=25.6e6, workers=2, ps_shards=16, compute_s=0.001), "data_parallel", id="dense_many_ps_shards"
        ),
    ],
)
def test_recommendation(fields: dict, expected: str) -> None:
    plan = Plan(bandwidth=GBPS10, latency=50e-6, **fields)
    assert plan.recommendation == expected
    assert plan.reasons


def test_embeddings_make_parameter_servers_win() -> None:
    dense = Plan(params=321e6, workers=4, bandwidth=GBPS10, latency=50e-6)
    sparse = Plan(
        params=321e6, workers=4, bandwidth=GBPS10, latency=50e-6, embedding_values=320e6, embedding_touched=16e3
    )
    assert dense.recommendation == "data_parallel"
    assert sparse.recommendation == "parameter_server"
    assert sparse.ps_s == pytest.approx(2 * 50e-6 + 2 * (1e6 + 16e3) * 4 / GBPS10, abs=0.5e-7)
    assert sparse.ring_allreduce_s == dense.ring_allreduce_s
    with pytest.raises(PlanError, match=r"`embedding_touched`.*Received: 0"):
        Plan(params=1e6, workers=2, bandwidth=1e9, latency=1e-5, embedding_values=1e5)
    with pytest.raises(PlanError, match=r"`embedding_values`.*Received: 2000000.0"):
        Plan(params=1e6, workers=2, bandwidth=1e9, latency=1e-5, embedding_values=2e6, embedding_touched=1)


def test_invalid() -> None:
    with pytest.raises(PlanError, match="did you mean 'adam'"):
        Plan(params=1e6, workers=2, bandwidth=1e9, latency=1e-5, optimizer="adan")
    with pytest.raises(PlanError, match="`workers`. Received: 0"):
        Plan(params=1e6, workers=0, bandwidth=1e9, latency=1e-5)


def test_cli_json_and_errors() -> None:
    done = testing.run_python(
        [
            sys.executable,
            "-m",
            "tfdist.cli.main",
            "plan",
            "--params",
            "25.6M",
            "--workers",
            "4",
            "--bandwidth",
            "10Gbps",
            "--latency",
            "50us",
            "--device-memory",
            "16GiB",
            "--optimizer",
            "adam",
            "--json",
        ],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in (
        "ring_allreduce_s",
        "tree_allreduce_s",
        "ps_s",
        "memory_per_replica_bytes",
        "recommendation",
        "reasons",
    ):
        assert key in data
    assert data["recommendation"] == "data_parallel"
    bad = testing.run_python(
        [
            sys.executable,
            "-m",
            "tfdist.cli.main",
            "plan",
            "--params",
            "25.6M",
            "--workers",
            "4",
            "--bandwidth",
            "fast",
            "--latency",
            "50us",
        ],
        timeout=60,
    )
    assert bad.returncode == 2
    assert "a bandwidth such as '10Gbps'" in bad.stderr


def test_cli_errors_name_flags_and_devices_count() -> None:
    """The CLI speaks in flags (never Plan's fields or Python), and --gpus-per-worker shows in the answer."""

    def plan(*extra: str) -> subprocess.CompletedProcess[str]:
        base = ["--workers", "4", "--bandwidth", "10Gbps", "--latency", "50us"]
        argv = [sys.executable, "-m", "tfdist.cli.main", "plan", *base, *extra]
        return testing.run_python(argv, timeout=60)

    for extra, flag, fix in (
        (("--params", "0"), "`--params`", "Pass e.g. --params 7B."),
        (("--params", "lots"), "`--params`", "a count such as '25.6M' or '7B'"),
        (("--params", "7B", "--compute", "0s"), "`--compute`", "Pass e.g. --compute 120ms."),
        (("--params", "7B", "--device-memory", "lots"), "`--device-memory`", "a size such as '16GiB'"),
        (("--params", "7B", "--embedding-values", "1", "--embedding-touched", "x"), "`--embedding-touched`", ""),
    ):
        done = plan(*extra)
        assert done.returncode == 2, done.stderr
        assert f"Invalid value for {flag}" in done.stderr
        assert fix in done.stderr
        for python in ("parse_quantity", "or None", "`count`", "`time`", "`bytes`", "compute_s"):
            assert python not in done.stderr
    one, eight = (json.loads(plan("--params", "7B", "--gpus-per-worker", g, "--json").stdout) for g in "18")
    assert (one["replicas"], eight["replicas"]) == (4, 32)
    assert one["gradient_bytes"] == 28e9  # 7B parameters in fp32
    assert any("4 machines x 8 devices = 32 replicas" in r for r in eight["reasons"]), eight["reasons"]
    assert (
        "replicas:                  32 (4 machines x 8 devices)"
        in plan("--params", "7B", "--gpus-per-worker", "8").stdout
    )


def test_cli_embedding_traffic() -> None:
    base = [
        sys.executable,
        "-m",
        "tfdist.cli.main",
        "plan",
        "--params",
        "321M",
        "--workers",
        "2",
        "--bandwidth",
        "10Gbps",
        "--latency",
        "50us",
    ]
    done = testing.run_python(base + ["--embedding-values", "320M", "--embedding-touched", "16k", "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["embedding_ps_bytes"] == 2 * 16e3 * 4
    assert data["embedding_allreduce_bytes"] == 320e6 * 4
    assert data["embedding_ratio"] == 10000.0
    assert data["recommendation"] == "parameter_server"  # Dense all-reduce of 320M values loses.
    assert "embedding rows a batch touches" in " ".join(data["reasons"])
    text = testing.run_python(base + ["--embedding-values", "320M", "--embedding-touched", "16k"], timeout=60)
    assert "as ps rows" in text.stdout
    half = testing.run_python(base + ["--embedding-values", "320M"], timeout=60)
    assert half.returncode == 2
    assert "Expected both" in half.stderr


def test_compressed_traffic_formulas() -> None:
    from tfdist.comm import HostRates, PowerSGD, compressed_traffic

    shapes = [(2048, 1000), (1000,), (3, 3, 64, 64)]  # 2048000 + 1000 + 36864 values
    link: dict[str, Any] = {"workers": 4, "bandwidth": 1e9, "latency": 1e-4}
    ring = lambda b: 2 * 3 * 1e-4 + 2 * 3 / 4 * b / 1e9  # noqa: E731
    power = compressed_traffic(shapes=shapes, compression="powersgd", rank=4, **link)
    p, q, whole = 4 * (2048 + 576), 4 * (1000 + 64), 1000  # The kernel as [576, 64]; the bias whole.
    # After the warm-up, the P factors' all-reduce carries one value of its plain sum (ended).
    assert power.bytes_per_step == 4 * (p + q + whole + 1)
    assert power.seconds_per_step == pytest.approx(ring(4 * (p + 1)) + ring(4 * (q + whole)))
    assert power.fewer_bytes == pytest.approx(4 * 2085864 / power.bytes_per_step)
    # Its first 25 steps sum the matrices whole beside the factors.
    assert (power.warmup_steps, power.warmup_bytes_per_step) == (25, 4 * (p + 2084864 + q + whole))
    assert power.warmup_seconds_per_step == pytest.approx(ring(4 * (p + 2084864)) + ring(4 * (q + whole)))
    cold = compressed_traffic(shapes=shapes, compression=PowerSGD(rank=4, warmup_steps=0), **link)
    assert cold.bytes_per_step == 4 * (p + q + whole) and cold.warmup_steps == 0
    assert cold.seconds_per_step == pytest.approx(ring(4 * p) + ring(4 * (q + whole)))
    top = compressed_traffic(shapes=shapes, compression="topk", density=0.01, **link)
    k = 20480 + 10 + 369  # ceil(1% of each)
    assert top.bytes_per_step == 8 * k
    assert top.seconds_per_step == pytest.approx(2 * (3 * 1e-4 + 3 * 4 * k / 1e9))  # Two all-gathers.
    local = compressed_traffic(shapes=shapes, compression="local_sgd", period=8, **link)
    assert local.bytes_per_step == 4 * 2085864 / 8 and local.fewer_bytes == 8
    assert local.seconds_per_step == pytest.approx(ring(4 * 2085864) / 8)
    one = compressed_traffic(shapes=shapes, compression="powersgd", workers=1, bandwidth=1e9, latency=1e-4)
    assert one.seconds_per_step == 0.0
    with pytest.raises(PlanError, match="`shapes`"):
        compressed_traffic(shapes=[(0, 3)], compression="topk", **link)
    with pytest.raises(PlanError, match="`compression`. Received: 'dgc'"):
        compressed_traffic(shapes=shapes, compression="dgc", **link)
    assert power.arithmetic_seconds is None and power.total_seconds is None  # No memory bandwidth given.
    # With one: the passes over the values each streams (PowerSGD its matrices, top-k everything), and what is
    # no stream at the host's other rates, their defaults: PowerSGD's 4 thin products at 3.5 GB/s (6 passes
    # left at the memory bandwidth), top-k's selection scanning every value once at 600 MB/s and its scatter of
    # every worker's entries at 12 MB/s (11 passes left).
    fast = {**link, "memory_bandwidth": 2e10}
    matrices = 2048000 + 36864
    power = compressed_traffic(shapes=shapes, compression="powersgd", rank=4, **fast)
    assert power.arithmetic_seconds == pytest.approx(6 * 4 * matrices / 2e10 + 4 * 4 * matrices / 3.5e9)
    assert power.total_seconds == pytest.approx(power.seconds_per_step + (power.arithmetic_seconds or 0.0))
    assert power.to_dict()["total_seconds"] == power.total_seconds
    top = compressed_traffic(shapes=shapes, compression="topk", **fast)
    entries = link["workers"] * k  # Every worker's entries, scattered into the sum.
    assert top.arithmetic_seconds == pytest.approx(11 * 4 * 2085864 / 2e10 + 4 * 2085864 / 0.6e9 + 4 * entries / 12e6)
    # Every rate from the host's record: the selection, the scatter and the products at theirs; the rank in
    # the products' price only as rank 1 (matrix-vector products) or more.
    host = HostRates(
        memory_bandwidth=2e10, select_bandwidth=5e8, scatter_bandwidth=2e7, matmul_bandwidth=1e10, matvec_bandwidth=2e10
    )
    slow_select = compressed_traffic(shapes=shapes, compression="topk", host=host, **link)
    assert slow_select.arithmetic_seconds == pytest.approx(
        11 * 4 * 2085864 / 2e10 + 4 * 2085864 / 5e8 + 4 * entries / 2e7
    )
    for rank, products in ((1, 2e10), (2, 1e10), (4, 1e10)):
        ranked = compressed_traffic(shapes=shapes, compression="powersgd", rank=rank, host=host, **link)
        assert ranked.arithmetic_seconds == pytest.approx(6 * 4 * matrices / 2e10 + 4 * 4 * matrices / products)
    with pytest.raises(PlanError, match="`memory_bandwidth`. Received: 20000000000.0. Expected None with `host`"):
        compressed_traffic(shapes=shapes, compression="topk", host=host, **fast)
    local = compressed_traffic(shapes=shapes, compression="local_sgd", period=8, **fast)
    assert local.arithmetic_seconds == pytest.approx(3 * 4 * 2085864 / 8 / 2e10)
    bad_bandwidths: list[Any] = [0, -1.0, float("inf"), True, "15GB/s"]
    for bad_bandwidth in bad_bandwidths:
        with pytest.raises(PlanError, match="`memory_bandwidth`"):
            compressed_traffic(shapes=shapes, compression="topk", memory_bandwidth=bad_bandwidth, **link)


def test_cli_compressed_plan_from_shapes_and_its_errors(tmp_path: Path) -> None:
    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        base = [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--bandwidth", "1.25GB/s"]
        return testing.run_python([*base, "--latency", "50us", *args], timeout=60)

    shapes = tmp_path / "shapes.json"
    shapes.write_text("[[2048, 1000], [1000]]")
    done = plan("--compression", "powersgd", "--rank", "4", "--shapes", str(shapes), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["compressed"]["bytes_per_step"] == 4 * (4 * 3048 + 1000 + 1)  # The warm-up's end: one value.
    assert data["compressed"]["warmup_steps"] == 25
    assert data["compressed"]["warmup_bytes_per_step"] == 4 * (4 * 3048 + 2048000 + 1000)
    assert data["gradient_bytes"] == 4 * 2049000  # Params from the shapes.
    # The warm-up and the rate are flags of their own, from PowerSGD's config.
    cold = plan("--compression", "powersgd", "--warmup-steps", "0", "--shapes", str(shapes), "--json")
    assert json.loads(cold.stdout)["compressed"]["bytes_per_step"] == 4 * (4 * 3048 + 1000)
    rate = plan("--compression", "powersgd", "--min-compression-rate", "200", "--shapes", str(shapes), "--json")
    assert json.loads(rate.stdout)["compressed"]["bytes_per_step"] == 4 * 2049000  # 168x is not 200x: whole.
    low = plan("--compression", "powersgd", "--min-compression-rate", "0.5", "--shapes", str(shapes))
    assert low.returncode == 2 and "Invalid value for `--min-compression-rate`. Received: 0.5" in low.stderr
    text = plan("--compression", "local-sgd", "--period", "8", "--shapes", "[[2048, 1000], [1000]]")
    assert text.returncode == 0, text.stderr
    assert "local-sgd:" in text.stdout and "8.0x fewer bytes" in text.stdout
    assert "add --memory-bandwidth" in text.stdout
    costed = plan("--compression", "powersgd", "--shapes", str(shapes), "--memory-bandwidth", "20GB/s")
    assert costed.returncode == 0, costed.stderr
    # The 2048x1000 matrix's 8.192 MB: 6 passes at 20 GB/s and its 4 thin products at the default 3.5 GB/s.
    assert "+ compute:" in costed.stdout and "11.82 ms/step" in costed.stdout
    # Products as fast as the stream: the 10 passes at 20 GB/s, 4.10 ms.
    stream = plan(
        "--compression",
        "powersgd",
        "--shapes",
        str(shapes),
        "--memory-bandwidth",
        "20GB/s",
        "--matmul-bandwidth",
        "20GB/s",
    )
    assert "+ compute:" in stream.stdout and "4.10 ms/step" in stream.stdout
    # 8.245 MB per step while it warms up: the matrix whole, beside its factors and the bias.
    assert "first steps:" in costed.stdout and "8.245 MB/worker step for the first 25 (its warm-up)" in costed.stdout
    wrong = plan("--compression", "powersgd", "--shapes", str(shapes), "--memory-bandwidth", "fast")
    assert wrong.returncode == 2 and "`--memory-bandwidth`. Received: 'fast'" in wrong.stderr
    missing = plan("--compression", "topk", "--params", "25M")
    assert (
        missing.returncode == 2 and "`--compression`. Received: 'topk'. Expected --shapes or --model" in missing.stderr
    )
    bad = plan("--compression", "topk", "--shapes", "[[3, -1]]")
    assert bad.returncode == 2 and "Invalid value for `--shapes`" in bad.stderr
    # Each compressor's options are its own flags (from its config), refused with another compressor.
    other = plan("--compression", "topk", "--rank", "4", "--shapes", str(shapes))
    assert other.returncode == 2 and "`--rank`. Received: 4. Expected no `rank` with 'topk'" in other.stderr
    period = plan("--compression", "powersgd", "--period", "8", "--shapes", str(shapes))
    assert period.returncode == 2 and "`--period`" in period.stderr and "only with 'local_sgd'" in period.stderr
    zero = plan("--compression", "powersgd", "--rank", "0", "--shapes", str(shapes))
    assert zero.returncode == 2 and "tfdist plan: error: Invalid value for `--rank`. Received: 0" in zero.stderr
    dense = plan("--compression", "topk", "--density", "0.5", "--shapes", str(shapes), "--json")
    assert json.loads(dense.stdout)["compressed"]["bytes_per_step"] == 8 * (1024000 + 500)
    neither = plan()
    assert neither.returncode == 2 and "`--params`" in neither.stderr


def test_cli_compressed_plan_from_a_keras_application() -> None:
    done = testing.run_python(
        [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--bandwidth", "1.25GB/s", "--latency"]
        + ["50us", "--compression", "powersgd", "--model", "ResNet50", "--json"],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["gradient_bytes"] == 4 * 25_583_592  # tf_keras' ResNet50: its trainable weights.
    assert 50 < data["compressed"]["fewer_bytes"] < 80  # Rank 4: convs and the classifier as factors.
    wrong = testing.run_python(
        [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--bandwidth", "1GB/s", "--latency"]
        + ["50us", "--compression", "topk", "--model", "ResNet51"],
        timeout=120,
    )
    assert wrong.returncode == 2 and "Invalid value for `--model`. Received: 'ResNet51'" in wrong.stderr


@pytest.mark.parametrize(
    ("params", "devices", "memory", "mesh"),
    [
        (1e8, (2, 1), 16 * 2**30, None),  # 1.6 GB per replica fits: data parallel, no mesh.
        (3e9, (4, 2), 16 * 2**30, (2, 4)),  # 44.7 GiB: 4 ways fit (11.2 GiB), 2 ways do not.
        (1e9, (2, 1), 10 * 2**30, (1, 2)),
        (5e10, (2, 2), 16 * 2**30, (0, 0)),  # 745 GiB cannot fit 4 devices of 16 GiB.
    ],
)
def test_a_replica_too_large_gets_the_smallest_model_axis_that_fits(
    params: float, devices: tuple[int, int], memory: float, mesh: tuple[int, int] | None
) -> None:
    plan = Plan(
        params=params, workers=devices[0], gpus_per_worker=devices[1], bandwidth=1e9, latency=1e-5, device_memory=memory
    )
    assert plan.mesh == mesh
    assert plan.recommendation == ("data_parallel" if mesh is None else "model_parallel")
    if mesh and mesh[1]:
        assert plan.memory_per_replica_bytes / mesh[1] <= memory < plan.memory_per_replica_bytes / (mesh[1] // 2 or 1)
        assert plan.to_dict()["mesh"] == f"batch={mesh[0]},model={mesh[1]}"
    elif mesh:
        assert "add devices" in plan.reasons[-1] and plan.to_dict()["mesh"] is None


def test_cli_prints_the_mesh_launch_command() -> None:
    argv = [
        "--params",
        "3e9",
        "--workers",
        "4",
        "--gpus-per-worker",
        "2",
        "--bandwidth",
        "10Gbit/s",
        "--latency",
        "50us",
        "--device-memory",
        "16GiB",
    ]
    done = testing.run_python([sys.executable, "-m", "tfdist.cli.main", "plan", *argv], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "launch:            tfdist-launch --workers 4 --mesh batch=2,model=4 -- python train.py" in done.stdout
    assert "11.2 GiB per device" in done.stdout
    assert "or 4 pipeline stages, one per task (tfdist-launch --chief --workers 4 --run-on chief)" in done.stdout


def test_cli_link_takes_the_launchers_rates_with_a_lan_latency() -> None:
    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--params", "25.6M", *args]
        return testing.run_python(argv, timeout=60)

    link = json.loads(plan("--link", "1gbit", "--json").stdout)
    same = json.loads(plan("--bandwidth", "1Gbps", "--latency", "50us", "--json").stdout)
    assert link["ring_allreduce_s"] == same["ring_allreduce_s"] == pytest.approx(2 * 50e-6 + 102.4e6 / 125e6)
    slow = json.loads(plan("--link", "100MBit", "--latency", "1ms", "--json").stdout)
    assert slow["ring_allreduce_s"] == pytest.approx(2 * 1e-3 + 102.4e6 / 12.5e6)
    for args, message in (
        (("--link", "1 gigabit"), "Invalid value for `--link`. Received: '1 gigabit'. Expected a RATE"),
        (("--link", "worker:1=1gbit"), "Pass e.g. --link 1gbit."),
        (("--link", "5bit"), "from 10kbit to 1tbit"),
        (
            ("--bandwidth", "1Gbps"),
            "Invalid value for `--latency`. Received: None. Expected a latency with --bandwidth",
        ),
        (("--link", "1gbit", "--bandwidth", "1Gbps"), "not allowed with argument"),
        ((), "one of the arguments --bandwidth --link is required"),
    ):
        done = plan(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


def test_cli_choose_prices_every_variant_and_picks_the_fastest(tmp_path: Path) -> None:
    def plan(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tfdist.cli.main", "plan", "--workers", "2", "--link", "1gbit", *args]
        return testing.run_python(argv, timeout=60)

    shapes = "[[2048, 1000], [1000], [3, 3, 256, 256]]"
    data = json.loads(plan("--shapes", shapes, "--choose", "--memory-bandwidth", "2GB/s", "--json").stdout)
    seconds = {v["variant"]: v["seconds"] for v in data["variants"]}
    assert list(seconds) == [
        "none",
        "bf16",
        "fp16",
        "powersgd rank=1",
        "powersgd rank=2",
        "powersgd rank=4",
        "topk density=0.01",
        "local_sgd period=4",
    ]
    assert data["choice"] == min(seconds, key=seconds.__getitem__)
    wire = {v["variant"]: v["wire_seconds"] for v in data["variants"]}
    on_host = {v["variant"]: v["host_seconds"] for v in data["variants"]}
    assert wire["bf16"] == pytest.approx(wire["none"] / 2, rel=0.01)
    assert on_host["bf16"] == pytest.approx(on_host["none"] / 2, rel=0.01)  # Half the bytes through the host too.
    assert data["host"] == {
        "collective_bandwidth": 300e6,
        "memory_bandwidth": 2e9,
        "select_bandwidth": 0.6e9,
        "scatter_bandwidth": 12e6,
        "matmul_bandwidth": 3.5e9,
        "matvec_bandwidth": 4.5e9,
        "overlap": 0.25,
    }
    # top-k's selection at its own rate: a slower one adds its scan of every value, the others unchanged.
    slower = json.loads(
        plan(
            "--shapes", shapes, "--choose", "--memory-bandwidth", "2GB/s", "--select-bandwidth", "0.3GB/s", "--json"
        ).stdout
    )
    again = {v["variant"]: v["seconds"] for v in slower["variants"]}
    values = 2048000 + 1000 + 3 * 3 * 256 * 256
    assert again["topk density=0.01"] - seconds["topk density=0.01"] == pytest.approx(4 * values / 0.6e9, rel=1e-6)
    assert {k: v for k, v in again.items() if k != "topk density=0.01"} == {
        k: v for k, v in seconds.items() if k != "topk density=0.01"
    }
    text = plan("--shapes", shapes, "--choose")
    assert text.returncode == 0, text.stderr
    assert (
        "host:              collectives 300MB/s, memory 10GB/s, top-k selection 600MB/s and scatter 12MB/s, thin "
        "products 3.5GB/s (rank 1: 4.5GB/s), 25% of the shorter" in text.stdout
    )
    assert "(defaults measured on 2 CPU cores: tfdist doctor --measure-host measures yours)" in text.stdout
    assert "  powersgd rank=4 " in text.stdout
    assert "choice:            powersgd rank=1 (accuracy not priced" in text.stdout
    # The host's rates as tfdist doctor --measure-host prints them: the fast host leaves bf16 its wire time.
    host = ("--collective-bandwidth", "100GB/s", "--memory-bandwidth", "9.61GB/s", "--select-bandwidth", "1.2GB/s")
    products = ("--scatter-bandwidth", "20MB/s", "--matmul-bandwidth", "5GB/s", "--matvec-bandwidth", "8GB/s")
    measured = plan("--shapes", shapes, "--choose", *host, *products)
    assert (
        "collectives 100GB/s, memory 9.61GB/s, top-k selection 1.2GB/s and scatter 20MB/s, thin products 5GB/s "
        "(rank 1: 8GB/s)" in measured.stdout
    )
    assert "defaults measured" not in measured.stdout
    assert "defaults measured" in plan("--shapes", shapes, "--choose", *host).stdout  # One rate left at its default.
    slow = plan("--shapes", shapes, "--choose", "--collective-bandwidth", "slow")
    assert slow.returncode == 2 and "Invalid value for `--collective-bandwidth`. Received: 'slow'" in slow.stderr
    missing = plan("--params", "1M", "--choose")
    assert missing.returncode == 2 and "`--choose`. Received: True. Expected --shapes or --model" in missing.stderr
