"""Benchmark: all-reduce between local processes, TF through tfdist vs TF defaults vs torch gloo vs loopback.

    .venv/bin/python scripts/bench_allreduce.py [--repeats 5] [--workers 2] [--no-gloo] [--json PATH]

With 2 workers (the default) one run measures, side by side:
  * tensor sizes 4 KB .. 64 MB and a ResNet-50-shaped gradient list (161 tensors, 25.6M floats);
  * TF RING all-reduce as TF does it by default (one pack, float32);
  * tfdist tuned: the pack size picked by tfdist's autotuner on the ResNet-50 list (with bf16), then
    float32, bf16 and fp16 on the wire;
  * torch.distributed gloo all_reduce on the same sizes, float32; the list both in DDP's 25 MB buckets
    and one all_reduce per tensor;
  * the loopback limit: both processes exchanging the same bytes over TCP at once (a 2-process ring
    moves each byte once in each direction), with no arithmetic;
  * the cost model (tfdist.plan) fitted to TF's default all-reduce, predicted vs measured;
  * PowerSGD (ranks 1, 2, 4) and top-k (1%) on the ResNet-50 list end to end (error added, compressed,
    communicated with the tuned packing, decompressed, new error and Q), with their wire bytes, the
    arithmetic alone, and the collectives' share against tfdist.comm.compressed_traffic's prediction.
With --workers 3 or 4 it measures only TF's default all-reduce and fits the cost model there.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
DDP_BUCKET_BYTES = 25 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def resnet50_shapes() -> list[tuple[int, ...]]:
    """Gradient shapes of ResNet-50 (torchvision layout: convs without bias, batch norm scale and offset)."""
    shapes: list[tuple[int, ...]] = [(7, 7, 3, 64), (64,), (64,)]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            shapes += [
                (1, 1, inplanes, width),
                (width,),
                (width,),
                (3, 3, width, width),
                (width,),
                (width,),
                (1, 1, width, 4 * width),
                (4 * width,),
                (4 * width,),
            ]
            if block == 0:
                shapes += [(1, 1, inplanes, 4 * width), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    return shapes + [(2048, 1000), (1000,)]


def _median_time(fn: Callable[[], Any], repeats: int, before: Callable[[], Any] = lambda: None) -> float:
    """Median seconds of ``fn`` after a warm-up run (tracing, collective set-up); ``before`` runs untimed."""
    before()
    fn()
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ----------------------------------------------------------------------------- TF (runs in each worker)
def tf_worker(repeats: int, full: bool) -> dict[str, Any]:
    """Median all-reduce seconds per case; with ``full`` also the autotuned and fp16 variants."""
    import tfdist

    strategy = tfdist.build_strategy("multi_worker_mirrored", communication="ring")
    from tfdist.comm import CollectiveConfig, all_reduce_timer, autotune_collectives

    def timer(shapes: list[tuple[int, ...]], config: CollectiveConfig | None) -> float:
        once = all_reduce_timer(strategy, shapes, config)  # None: TF's own all-reduce, as fit does it.
        return statistics.median(once() for _ in range(repeats))

    out: dict[str, Any] = {"default": {str(s): timer([(s // 4,)], None) for s in SIZES}}
    if not full:
        return out
    resnet = resnet50_shapes()
    tuning = autotune_collectives(strategy, resnet, compression="bf16", repeats=3)
    pack = tuning.bytes_per_pack
    out["tuning"] = {"bytes_per_pack": pack, "timings_ms": dict(tuning.timings_ms)}
    for name, compression in (("tuned_fp32", "none"), ("tuned_fp16", "fp16"), ("tuned_bf16", "bf16")):
        config = CollectiveConfig(compression=compression, bytes_per_pack=pack, split_bytes=pack)
        out[name] = {str(s): timer([(s // 4,)], config) for s in SIZES}
        out[name]["resnet50"] = timer(resnet, config)
    out["default"]["resnet50"] = timer(resnet, None)
    out["default_fp16"] = {"resnet50": timer(resnet, CollectiveConfig(compression="fp16"))}
    for name, config in _compressed_variants(pack).items():
        once = compressed_timer(strategy, resnet, config)
        out[name] = {"resnet50": statistics.median(once() for _ in range(repeats))}
        # The same arithmetic with no collective (each worker alone, both at once: what the cores cost).
        once = compressed_timer(strategy, resnet, config, local=True)
        out[f"{name}_compute"] = {"resnet50": statistics.median(once() for _ in range(repeats))}
    out["stream"] = {"resnet50": stream_seconds(resnet, repeats)}
    return out


STREAM_PASSES = 3  # stream_seconds' a + b: two reads and a write of every value.


def stream_seconds(shapes: list[tuple[int, ...]], repeats: int) -> float:
    """Seconds this worker takes to stream float32 tensors of ``shapes`` through memory (both workers at
    once, as in the runs above): ``a + b``, ``STREAM_PASSES`` passes."""
    import tensorflow as tf

    rng = tf.random.Generator.from_seed(1)
    a = [rng.normal(s) for s in shapes]
    b = [rng.normal(s) for s in shapes]

    @tf.function
    def add() -> Any:
        return [x + y for x, y in zip(a, b)]

    def once() -> None:
        add()[-1].numpy()

    return _median_time(once, max(repeats, 5))


def _compressed_variants(pack: int) -> dict[str, Any]:
    """PowerSGD at ranks 1, 2 and 4 and top-k at 1%, with the tuned packing for what they all-reduce. PowerSGD
    without its warm-up: the timed steps are the compressed ones that follow it."""
    from tfdist.comm import CollectiveConfig, PowerSGD, TopK

    variants = {
        f"powersgd_r{r}": CollectiveConfig(compression=PowerSGD(rank=r, warmup_steps=0), bytes_per_pack=pack)
        for r in (1, 2, 4)
    }
    variants["topk_1pct"] = CollectiveConfig(compression=TopK(density=0.01), bytes_per_pack=pack)
    return variants


def compressed_timer(
    strategy: Any, shapes: list[tuple[int, ...]], config: Any, *, local: bool = False
) -> Callable[[], float]:
    """A traced, warmed-up compressed step on float32 gradients of ``shapes``, end to end: error added,
    compressed, communicated, decompressed, new error and Q (the compressor's step, as ``with_communication``
    runs it). ``local``: the collectives replaced by identities (the arithmetic alone)."""
    import tensorflow as tf

    from tfdist.comm import CollectiveConfig, Collectives, all_reduce_sum

    compressor = config.compressor
    plain = CollectiveConfig(bytes_per_pack=config.bytes_per_pack)  # The factors: float32.
    rng = tf.random.Generator.from_seed(0)
    grads = [strategy.experimental_distribute_values_from_function(lambda context, s=s: rng.normal(s)) for s in shapes]
    slots = [compressor.state_slots(s) for s in shapes]
    device = strategy.extended.worker_devices[0]

    def replica_fn(*tensors: Any) -> Any:
        with tf.device(device):
            placed = [tf.identity(t) for t in tensors]
        context = tf.distribute.get_replica_context()
        alone = lambda ts: [tf.identity(t) for t in ts]  # noqa: E731
        # Errors start at zero; a warm-start Q at ones.
        states = [{slot.kind: (tf.ones if slot.seeded else tf.zeros)(slot.shape) for slot in own} for own in slots]
        collectives = Collectives(
            all_reduce=alone if local else lambda ts: all_reduce_sum(list(ts), plain),
            all_gather=alone if local else lambda ts: context.all_gather(list(ts), axis=0),
        )
        summed, new_states = compressor.step(placed, states, collectives)
        return summed, [list(state.values()) for state in new_states if state]

    @tf.function
    def step(*tensors: Any) -> Any:
        return strategy.run(replica_fn, args=tensors)

    def once() -> float:
        start = time.perf_counter()
        result = step(*grads)  # A function's outputs are all computed: the sums, the errors and the Qs.
        strategy.experimental_local_results(tf.nest.flatten(result)[0])[0].numpy()
        return time.perf_counter() - start

    once()
    return once


# ----------------------------------------------------------------------------- gloo and loopback peers
def _gloo_child(rank: int, port: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict[str, float] = {}
    for size in SIZES:
        tensor = torch.ones(size // 4)
        out[str(size)] = _median_time(functools.partial(dist.all_reduce, tensor), repeats, before=dist.barrier)
    total = sum(math.prod(s) for s in resnet50_shapes())
    buckets = [torch.ones(min(DDP_BUCKET_BYTES // 4, total - i)) for i in range(0, total, DDP_BUCKET_BYTES // 4)]
    out["resnet50"] = _median_time(lambda: [dist.all_reduce(b) for b in buckets], repeats, before=dist.barrier)
    tensors = [torch.ones(math.prod(s)) for s in resnet50_shapes()]
    out["resnet50_per_tensor"] = _median_time(
        lambda: [dist.all_reduce(t) for t in tensors], repeats, before=dist.barrier
    )
    dist.destroy_process_group()
    if rank == 0:
        sys.stdout.write(json.dumps(out) + "\n")


def gloo(repeats: int) -> dict[str, float]:
    """Runs two gloo ranks as processes; returns rank 0's medians."""
    from tfdist.cluster import free_ports

    port = free_ports(1)[0]
    cmd = [sys.executable, __file__, "--gloo-child", "{rank}", str(port), "--repeats", str(repeats)]
    procs = [subprocess.Popen([c.format(rank=r) for c in cmd], stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"gloo ranks failed: {[p.returncode for p in procs]}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def _buffers(sizes: list[int]) -> tuple[memoryview, memoryview]:
    """Send and receive buffers for the largest size, allocated (and touched) once, outside the timing."""
    largest = max(sizes)
    return memoryview(bytearray(b"\1" * largest)), memoryview(bytearray(b"\1" * largest))


def _exchange(sock: socket.socket, nbytes: int, buffers: tuple[memoryview, memoryview]) -> None:
    """Sends and receives ``nbytes`` at the same time (full duplex)."""
    payload, inbox = buffers[0][:nbytes], buffers[1]
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    sender.start()
    got = 0
    while got < nbytes:
        chunk = sock.recv_into(inbox[got:nbytes])
        if not chunk:
            raise ConnectionError(f"peer closed after {got} of {nbytes} bytes")
        got += chunk
    sender.join()


def _loopback_child(port: int, sizes: list[int], repeats: int) -> None:
    buffers = _buffers(sizes)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for size in sizes:
            for _ in range(repeats + 1):
                _exchange(sock, size, buffers)


def loopback(repeats: int, sizes: list[int]) -> dict[str, float]:
    """Seconds for two processes to swap ``size`` bytes each way over TCP on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--loopback-child",
                str(port),
                "--repeats",
                str(repeats),
                "--sizes",
                ",".join(map(str, sizes)),
            ]
        )
        buffers = _buffers(sizes)
        try:
            conn, _ = server.accept()
            with conn:
                return {
                    str(size): _median_time(functools.partial(_exchange, conn, size, buffers), repeats)
                    for size in sizes
                }
        finally:
            child.wait(timeout=120)


# ----------------------------------------------------------------------------- report
def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def cost_model(default: dict[str, float], workers: int) -> dict[str, Any]:
    """Fits the ring model to TF's default all-reduce times and compares prediction with measurement."""
    from tfdist.plan import Plan, fit_ring

    samples: list[tuple[float, ...]] = sorted((float(k), v) for k, v in default.items() if k.isdigit())
    latency, bandwidth = fit_ring(samples, workers=workers)
    rows = []
    for size, seconds in samples:
        predicted = Plan(params=size / 4, workers=workers, bandwidth=bandwidth, latency=latency).ring_allreduce_s
        rows.append(
            {
                "bytes": size,
                "measured_ms": _ms(seconds),
                "predicted_ms": _ms(predicted),
                "error": round(predicted / seconds - 1, 3),
            }
        )
    return {
        "workers": workers,
        "fitted_latency_us": round(latency * 1e6, 1),
        "fitted_bandwidth_MBps": round(bandwidth / 1e6, 1),
        "rows": rows,
        "max_abs_error": max(abs(r["error"]) for r in rows),
    }


def ratios(
    tf_times: dict[str, Any], gloo_times: dict[str, float], limit: dict[str, float], link: tuple[float, float]
) -> dict[str, Any]:
    """Speed-ups against TF's default, and times relative to gloo and to the loopback limit."""
    default = tf_times["default"]
    variants = ("tuned_fp32", "tuned_bf16", "tuned_fp16")
    rows = []
    for key in [str(s) for s in SIZES] + ["resnet50"]:
        row: dict[str, Any] = {"case": key, "tf_default_ms": _ms(default[key])}
        row.update({f"{v}_ms": _ms(tf_times[v][key]) for v in variants})
        row["limit_ms"] = _ms(limit[key])
        if key in gloo_times:
            row["gloo_fp32_ms"] = _ms(gloo_times[key])
        for v in variants:
            row[f"{v}_speedup_vs_tf_default"] = round(default[key] / tf_times[v][key], 2)
            if key in gloo_times:
                row[f"{v}_over_gloo"] = round(tf_times[v][key] / gloo_times[key], 2)
        row["gloo_over_limit"] = round(gloo_times[key] / limit[key], 2) if key in gloo_times else None
        rows.append(row)
    resnet, big = rows[-1], rows[SIZES.index(64 << 20)]
    goals = {
        "resnet50 speed-up vs TF default, tuned bf16 (goal >= 2.5)": resnet["tuned_bf16_speedup_vs_tf_default"],
        "resnet50 speed-up vs TF default, tuned fp16": resnet["tuned_fp16_speedup_vs_tf_default"],
        "resnet50 speed-up vs TF default, packing only (fp32)": resnet["tuned_fp32_speedup_vs_tf_default"],
    }
    if gloo_times:
        goals["resnet50 tuned bf16 / gloo DDP buckets (goal < 1)"] = resnet["tuned_bf16_over_gloo"]
        goals["resnet50 tuned bf16 / gloo per tensor"] = round(
            tf_times["tuned_bf16"]["resnet50"] / gloo_times["resnet50_per_tensor"], 2
        )
        goals["64MB tuned bf16 / gloo (goal <= 4)"] = big["tuned_bf16_over_gloo"]
        goals["64MB tuned fp16 / gloo (goal <= 4)"] = big["tuned_fp16_over_gloo"]
        goals["64MB TF default / gloo"] = round(default[str(64 << 20)] / gloo_times[str(64 << 20)], 2)
        goals["resnet50 TF default / gloo DDP buckets"] = round(default["resnet50"] / gloo_times["resnet50"], 2)
    from tfdist.comm import POWERSGD_FLOOR_PASSES, CollectiveConfig, PowerSGD, compressed_traffic, wire_bytes

    values = sum(math.prod(s) for s in resnet50_shapes())
    # Memory bandwidth per worker, both streaming at once (the slower worker's time).
    stream = STREAM_PASSES * 4 * values / tf_times["stream"]["resnet50"] if "stream" in tf_times else None

    float32 = types.SimpleNamespace(size=4)  # wire_bytes reads .shape and, uncompressed, .dtype.size.
    shapes = [types.SimpleNamespace(shape=s, dtype=float32) for s in resnet50_shapes()]
    compressed = []
    for name, config in _compressed_variants(0).items():
        if name not in tf_times:
            continue
        sent, full = wire_bytes(shapes, config), wire_bytes(shapes, CollectiveConfig())
        row = {
            "variant": name,
            "ms": _ms(tf_times[name]["resnet50"]),
            "wire_bytes": sent,
            "fewer_bytes_than_fp32": round(full / sent, 1),
            "speedup_vs_tf_default": round(default["resnet50"] / tf_times[name]["resnet50"], 2),
        }
        if f"{name}_compute" in tf_times:
            row["compute_ms"] = _ms(tf_times[f"{name}_compute"]["resnet50"])
            # The cost model (fitted to TF's default all-reduce above) against what the collectives took.
            row["comm_ms"] = _ms(tf_times[name]["resnet50"] - tf_times[f"{name}_compute"]["resnet50"])
            costed = compressed_traffic(
                shapes=resnet50_shapes(),
                workers=2,
                latency=link[0],
                bandwidth=link[1],
                compression=config.compressor,
                memory_bandwidth=stream,  # The arithmetic too, at the memory bandwidth measured in this run.
            )
            row["predicted_comm_ms"] = _ms(costed.seconds_per_step)
            if costed.arithmetic_seconds is not None:
                row["predicted_compute_ms"] = _ms(costed.arithmetic_seconds)
                row["predicted_ms"] = _ms(costed.total_seconds or 0.0)
                row["measured_over_predicted"] = round(tf_times[name]["resnet50"] / (costed.total_seconds or 1.0), 2)
                if isinstance(config.compressor, PowerSGD):
                    # The physical limit: PowerSGD perfectly fused (7 passes) plus the collectives' prediction.
                    floor = POWERSGD_FLOOR_PASSES * costed.arithmetic_seconds / PowerSGD.arithmetic_passes
                    row["floor_ms"] = _ms(floor + costed.seconds_per_step)
                    if gloo_times:
                        row["floor_over_gloo_ddp"] = round(
                            (floor + costed.seconds_per_step) / gloo_times["resnet50"], 2
                        )
        if gloo_times:
            row["over_gloo_ddp"] = round(tf_times[name]["resnet50"] / gloo_times["resnet50"], 2)
        compressed.append(row)
    if gloo_times and "powersgd_r4" in tf_times:
        goals["resnet50 PowerSGD r4 / gloo DDP buckets fp32 (goal <= 0.5)"] = round(
            tf_times["powersgd_r4"]["resnet50"] / gloo_times["resnet50"], 2
        )
    report = {"rows": rows, "compressed": compressed, "goals": goals}
    if stream:
        report["memory_bandwidth_GBps"] = round(stream / 1e9, 2)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, choices=(2, 3, 4))
    parser.add_argument("--no-gloo", action="store_true", help="skip torch (when the bench extra is missing)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--gloo-child", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loopback-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gloo_child:
        rank, port = args.gloo_child
        _gloo_child(rank, port, args.repeats)
        return 0
    if args.loopback_child:
        _loopback_child(args.loopback_child, [int(s) for s in args.sizes.split(",")], args.repeats)
        return 0

    from tfdist import testing

    full = args.workers == 2
    run = testing.run_cluster(
        "bench_allreduce:tf_worker",
        workers=args.workers,
        timeout=1200,
        args=[args.repeats, full],
        env={"PYTHONPATH": HERE},
    )
    if not run.ok:
        sys.stderr.write(run.result.summary() + "\n" + run.output("worker:0")[-3000:] + "\n")
        return 1
    # A collective ends when the slowest worker has its result: take the slower worker's time per case.
    tf_times = {
        variant: {
            case: max(run.values[w][variant][case] for w in run.values) for case in run.values["worker:0"][variant]
        }
        for variant in run.values["worker:0"]
        if variant != "tuning"
    }
    report: dict[str, Any] = {"cost_model": cost_model(tf_times["default"], args.workers)}
    if full:
        limit_sizes = SIZES + [4 * sum(math.prod(s) for s in resnet50_shapes())]
        limit = loopback(args.repeats, limit_sizes)
        limit["resnet50"] = limit.pop(str(limit_sizes[-1]))
        gloo_times = {} if args.no_gloo else gloo(args.repeats)
        report["tuning"] = run.values["worker:0"]["tuning"]
        fitted = report["cost_model"]
        link = (fitted["fitted_latency_us"] * 1e-6, fitted["fitted_bandwidth_MBps"] * 1e6)
        report.update(ratios(tf_times, gloo_times, limit, link))
    text = json.dumps(report, indent=1)
    sys.stdout.write(text + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
