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

Where the wire is the limit: on simulated hosts (the launcher's network namespaces on a private bridge, links
shaped with tc's token bucket: bandwidth only, no latency or loss), the ResNet-50 list only:

    .venv/bin/python scripts/bench_allreduce.py --simulate-hosts 2 --link 1gbit --link 10gbit --link none \
        --repeats 3 --torch-python PYTHON_WITH_TORCH --json bench-out/allreduce-links.json

For each link in turn: TF's default, tfdist tuned (fp32, bf16, fp16), PowerSGD rank 1/2/4 and top-k 1%
(each also without its collectives), local SGD k=4 (fit's averaging every 4 steps, in the tuned packs: its
time / 4), the host's rates as tfdist doctor --measure-host measures them (tfdist's packs, and TF's one
pack), and torch gloo fp32 in DDP's buckets with the TCP limit (both hosts swapping the list's bytes), every
process on its simulated host. The table puts each variant beside its wire limit (its bytes each way at the
link's rate; unshaped, at the rate TCP reached) and the planner's prediction at that rate with those host
rates (unshaped, with the wire's share taken out of the collectives' rates at TCP's rate, as tfdist doctor
--measure-link does), and the planner's choice (tfdist plan --link RATE --choose) beside the fastest
measured. Every variant on any number of hosts; the TCP limit only on 2 (unshaped needs it). --from-json
reports an earlier run's measurements again.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    from tfdist.comm.host_probe import stream_seconds

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
    out["stream"] = {"resnet50": stream_seconds(resnet, repeats)}  # as doctor --measure-host does
    return out


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
def _gloo_times(rank: int, world: int, init_method: str, repeats: int, sizes: list[int]) -> dict[str, float]:
    """Median seconds of gloo's all_reduce per size and of the ResNet-50 list (in DDP's buckets; with sizes,
    one all_reduce per tensor too), float32."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    out: dict[str, float] = {}
    for size in sizes:
        tensor = torch.ones(size // 4)
        out[str(size)] = _median_time(functools.partial(dist.all_reduce, tensor), repeats, before=dist.barrier)
    total = sum(math.prod(s) for s in resnet50_shapes())
    buckets = [torch.ones(min(DDP_BUCKET_BYTES // 4, total - i)) for i in range(0, total, DDP_BUCKET_BYTES // 4)]
    out["resnet50"] = _median_time(lambda: [dist.all_reduce(b) for b in buckets], repeats, before=dist.barrier)
    if sizes:
        tensors = [torch.ones(math.prod(s)) for s in resnet50_shapes()]
        out["resnet50_per_tensor"] = _median_time(
            lambda: [dist.all_reduce(t) for t in tensors], repeats, before=dist.barrier
        )
    dist.destroy_process_group()
    return out


def _gloo_child(rank: int, port: int, repeats: int) -> None:
    out = _gloo_times(rank, 2, f"tcp://127.0.0.1:{port}", repeats, SIZES)
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


# ----------------------------------------------------------------------------- simulated hosts (--simulate-hosts)
LOCAL_SGD_PERIOD = 4


def tf_link_worker(repeats: int, link_bandwidth: float | None) -> dict[str, Any]:
    """Median seconds per variant on the ResNet-50 list between simulated hosts: TF's default, tuned (the
    autotuner's pack, tuned with bf16) in fp32, bf16 and fp16, PowerSGD, top-k (each with its arithmetic
    alone) and local SGD's averaging (in the tuned packs). And the host's rates as ``tfdist
    doctor --measure-host`` measures them on a link of ``link_bandwidth`` (bytes/s; None: unshaped)."""
    import tfdist

    strategy = tfdist.build_strategy("multi_worker_mirrored", communication="ring")
    from tfdist._compat.distribute import communication_options
    from tfdist.comm import CollectiveConfig, all_reduce_timer, autotune_collectives, measure_host_rates
    from tfdist.comm.host import RATE_NAMES

    resnet = resnet50_shapes()

    def median(once: Callable[[], float]) -> float:
        return statistics.median(once() for _ in range(repeats))

    out: dict[str, Any] = {"default": median(all_reduce_timer(strategy, resnet, None))}
    pack = autotune_collectives(strategy, resnet, compression="bf16", repeats=3).bytes_per_pack
    out["bytes_per_pack"] = pack
    for name, compression in (("tuned_fp32", "none"), ("tuned_bf16", "bf16"), ("tuned_fp16", "fp16")):
        config = CollectiveConfig(compression=compression, bytes_per_pack=pack, split_bytes=pack)
        out[name] = median(all_reduce_timer(strategy, resnet, config))
    for name, config in _compressed_variants(pack).items():
        out[name] = median(compressed_timer(strategy, resnet, config))
        out[f"{name}_compute"] = median(compressed_timer(strategy, resnet, config, local=True))
    options = communication_options(strategy)
    options.bytes_per_pack = pack  # As under build_strategy(tuning=...): the averaging traced in packs.
    out["local_sgd_averaging"] = median(averaging_timer(strategy, resnet))
    options.bytes_per_pack = 0
    host = measure_host_rates(strategy, link_bandwidth=link_bandwidth, repeats=repeats)
    out.update({f"host_{name}": getattr(host, name) for name in RATE_NAMES})
    one_pack = measure_host_rates(strategy, link_bandwidth=link_bandwidth, repeats=repeats, bytes_per_pack=0)
    out["host_one_pack_bandwidth"] = one_pack.collective_bandwidth
    return out


def averaging_timer(strategy: Any, shapes: list[tuple[int, ...]]) -> Callable[[], float]:
    """Local SGD's averaging as ``fit`` runs it every period (``tfdist.keras.local_sgd``, slots left out): TF's
    all-reduce of the mean of weights of ``shapes``, assigned on every replica. Each call runs it once."""
    import tensorflow as tf

    from tfdist.keras.averaging import _Averaging

    with strategy.scope():
        weights = [tf.Variable(tf.ones(s)) for s in shapes]
    averaging = _Averaging(types.SimpleNamespace(weights=weights, optimizer=None), strategy, False)

    def once() -> float:
        start = time.perf_counter()
        averaging()
        weights[-1].numpy()
        return time.perf_counter() - start

    once()
    return once


def _gloo_task(prefix: str, repeats: int) -> None:
    """A simulated host's torch peer, started by the launcher (TF_CONFIG names the hosts): on 2 hosts first the
    TCP limit (both swap the ResNet-50 list's float32 bytes at once), then gloo; prints its medians."""
    spec = json.loads(os.environ["TF_CONFIG"])
    me, workers = spec["task"]["index"], spec["cluster"]["worker"]
    out: dict[str, float] = {}
    if len(workers) == 2:
        nbytes = 4 * sum(math.prod(s) for s in resnet50_shapes())
        host, port = workers[1].rsplit(":", 1)
        buffers = _buffers([nbytes])
        if me == 1:
            with socket.create_server((host, int(port))) as server:
                conn, _ = server.accept()
        else:
            conn = _connect(host, int(port))
        with conn:
            out["tcp_exchange"] = _median_time(functools.partial(_exchange, conn, nbytes, buffers), repeats)
    out.update(_gloo_times(me, len(workers), f"tcp://{workers[0]}", repeats, []))
    sys.stdout.write(prefix + json.dumps(out) + "\n")


def _connect(host: str, port: int, seconds: float = 60.0) -> socket.socket:
    """A connection to ``host:port``, retried while the peer starts."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return socket.create_connection((host, port), timeout=seconds)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def on_hosts(hosts: int, rate: str, repeats: int, torch_python: str | None) -> dict[str, Any]:
    """Measures every variant between ``hosts`` simulated hosts whose links run at ``rate`` ('none': unshaped);
    per variant the slowest host's median."""
    from tfdist import testing
    from tfdist.launch import Link

    network: dict[str, Any] = {"simulate_hosts": hosts, "links": () if rate == "none" else (rate,)}
    env = {"PYTHONPATH": os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)}
    link = None if rate == "none" else Link.parse(rate).bits_per_second / 8
    run = testing.run_cluster(
        "bench_allreduce:tf_link_worker",
        workers=hosts,
        timeout=900,
        args=[repeats, link],
        env=env,
        **network,
    )
    if not run.ok:
        raise RuntimeError(run.result.summary() + "\n" + run.output("worker:0")[-3000:])
    measured: dict[str, Any] = {"link": rate, "hosts": hosts, "tf": _slowest(run.values)}
    if torch_python:
        command = [torch_python, __file__, "--gloo-task", testing.RESULT_PREFIX, "--repeats", str(repeats)]
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # the simulated host's link (gloo would look up the machine's name)
        run = testing.run_cluster(command, workers=hosts, timeout=600, env=env, **network)
        if not run.ok:
            raise RuntimeError(run.result.summary() + "\n" + run.output("worker:0")[-3000:])
        measured["gloo"] = _slowest(run.values)
    return measured


def _slowest(values: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per case the slowest task's time: a collective ends when the slowest worker has its result."""
    return {case: max(v[case] for v in values.values()) for case in values["worker:0"]}


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
    from tfdist.comm.host import STREAM_PASSES

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
            costed = compressed_traffic(  # The collectives on 2 workers; the compute alone is one worker's.
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
                    matrices = config.compressor.streamed_values(resnet50_shapes())
                    floor = POWERSGD_FLOOR_PASSES * 4 * matrices / (stream or 1.0)
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


def _simulated(args: argparse.Namespace) -> int:
    """``--simulate-hosts``: measures each ``--link`` rate in turn (or reads ``--from-json``), then reports."""
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as f:
            measured = json.load(f)["measured"]
    else:
        torch_python = None if args.no_gloo else args.torch_python
        measured = [on_hosts(args.simulate_hosts, rate, args.repeats, torch_python) for rate in args.link or ["none"]]
    tables = [link_report(m) for m in measured]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps({"measured": measured, "tables": tables}, indent=1) + "\n")
    sys.stdout.write("\n".join(_markdown(table) for table in tables))
    return 0


# Each measured variant: its key in the measurements, its name in the table, the planner's variant it is.
_LINK_ROWS = (
    ("default", "TF default (fp32, one pack)", "none"),
    ("tuned_fp32", "tfdist tuned fp32", "none"),
    ("tuned_bf16", "tfdist tuned bf16", "bf16"),
    ("tuned_fp16", "tfdist tuned fp16", "fp16"),
    ("gloo", "gloo fp32, DDP buckets", "none"),
    ("powersgd_r1", "PowerSGD rank 1", "powersgd rank=1"),
    ("powersgd_r2", "PowerSGD rank 2", "powersgd rank=2"),
    ("powersgd_r4", "PowerSGD rank 4", "powersgd rank=4"),
    ("topk_1pct", "top-k 1%", "topk density=0.01"),
    ("local_sgd", f"local SGD k={LOCAL_SGD_PERIOD}", f"local_sgd period={LOCAL_SGD_PERIOD}"),
)


def _link_times(measured: dict[str, Any]) -> dict[str, float]:
    """Seconds per step of every variant measured: local SGD's averaging spread over its period."""
    times = {key: value for key, value in measured["tf"].items() if key != "bytes_per_pack"}
    if "local_sgd_averaging" in times:
        times["local_sgd"] = times["local_sgd_averaging"] / LOCAL_SGD_PERIOD
    if "gloo" in measured:
        times["gloo"] = measured["gloo"]["resnet50"]
    return times


def link_report(measured: dict[str, Any]) -> dict[str, Any]:
    """Each variant measured beside its wire limit (its bytes each way at the link's rate) and the planner's
    prediction at that rate (``tfdist plan --link RATE --choose`` with the host's rates measured in the run as
    ``tfdist doctor --measure-host`` measures them; unshaped, the rate TCP reached between the hosts), and the
    planner's choice against the fastest measured. TF's default sends one pack, which nothing overlaps: its
    prediction takes the rate measured for one pack, with overlap 0; gloo's host work is its sums ((N-1)/N of
    the values, 3 passes each). Unshaped, the tasks measured their collectives' rates before TCP's rate was
    known, wire included: the report takes the wire's share out at TCP's rate, as ``tfdist doctor
    --measure-link --measure-host`` does with the rate it measured."""
    from tfdist.comm import HostRates, NoCompression, combined_seconds, estimate_variants
    from tfdist.comm.host import PACKED_OVERLAP, RATE_NAMES, STREAM_PASSES, host_seconds
    from tfdist.launch import Link
    from tfdist.plan import LAN_LATENCY

    times, hosts, shapes = _link_times(measured), measured["hosts"], resnet50_shapes()
    fp32 = 4 * sum(math.prod(s) for s in shapes)
    if measured["link"] == "none":
        tcp = measured.get("gloo", {}).get("tcp_exchange")
        bandwidth = fp32 / tcp if tcp else None
    else:
        bandwidth = Link.parse(measured["link"]).bits_per_second / 8
    if measured["link"] == "none" and bandwidth is not None:
        for name, overlap in (("host_collective_bandwidth", PACKED_OVERLAP), ("host_one_pack_bandwidth", 0.0)):
            if name in times:  # Seconds per byte moved, measured with the wire in; the host's share of it.
                share = host_seconds(measured=1 / times[name], wire=1 / bandwidth, overlap=overlap)
                times[name] = 1 / share if share > 0 else times[name]
    # The host's rates as measured (a run from before a rate was measured: its default).
    host = HostRates(**{name: times[f"host_{name}"] for name in RATE_NAMES if f"host_{name}" in times})
    report: dict[str, Any] = {"link": measured["link"], "hosts": hosts, "bandwidth_MBps": bandwidth and bandwidth / 1e6}
    report["host_MBps"] = host.collective_bandwidth / 1e6
    report["host_one_pack_MBps"] = times.get("host_one_pack_bandwidth", host.collective_bandwidth) / 1e6
    report["memory_bandwidth_GBps"] = host.memory_bandwidth / 1e9
    report["select_bandwidth_GBps"] = host.select_bandwidth / 1e9
    report["scatter_bandwidth_MBps"] = host.scatter_bandwidth / 1e6
    report["matmul_bandwidth_GBps"] = host.matmul_bandwidth / 1e9
    report["matvec_bandwidth_GBps"] = host.matvec_bandwidth / 1e9
    if bandwidth is None:
        return report
    link = {"shapes": shapes, "workers": hosts, "bandwidth": bandwidth, "latency": LAN_LATENCY}
    predicted = {e.label: e for e in estimate_variants(host=host, **link)}
    # The compute alone runs without the other workers (its gathers return this worker's entries): one worker's.
    alone = {e.label: e for e in estimate_variants(host=host, **{**link, "workers": 1})}
    # TF's one pack at the rate measured for it (overlap 0).
    rate = times.get("host_one_pack_bandwidth", host.collective_bandwidth)
    one_host = dataclasses.replace(host, collective_bandwidth=rate, overlap=0.0)
    one_pack = estimate_variants(host=one_host, variants=[NoCompression()], **link)[0]
    without_host = {e.label: e.seconds for e in estimate_variants(memory_bandwidth=host.memory_bandwidth, **link)}
    sums = host.arithmetic_seconds(STREAM_PASSES * (hosts - 1) / hosts, fp32 / 4)
    gloo = combined_seconds(wire=predicted["none"].wire_seconds, host=sums, overlap=host.overlap)
    limit = {e.label: e.wire_seconds for e in estimate_variants(**{**link, "latency": 0.0})}
    rows = []
    for key, name, variant in _LINK_ROWS:
        if key not in times:
            continue
        seconds = {"default": one_pack.seconds, "gloo": gloo}.get(key, predicted[variant].seconds)
        row = {"variant": name, "ms": _ms(times[key]), "limit_ms": _ms(limit[variant])}
        row["over_limit"] = round(times[key] / limit[variant], 2)
        row["predicted_ms"] = _ms(seconds)
        row["error"] = round(seconds / times[key] - 1, 3)
        row["error_without_host"] = round(without_host[variant] / times[key] - 1, 3)
        if f"{key}_compute" in times:  # A compressor's compute alone, measured and as the planner prices it.
            row["compute_ms"] = _ms(times[f"{key}_compute"])
            row["predicted_compute_ms"] = _ms(alone[variant].arithmetic_seconds or 0.0)
        rows.append(row)
    report["rows"] = rows
    report.update(_link_goals(times, predicted))
    return report


def _link_goals(times: dict[str, float], predicted: dict[str, Any]) -> dict[str, Any]:
    """The planner's choice among the tfdist variants measured against the fastest of them, and the ratio the
    issue sets a goal on."""
    from tfdist.comm import choose_variant

    measured = {
        variant: times[key] for key, _, variant in _LINK_ROWS if key in times and key not in ("default", "gloo")
    }
    fastest = min(measured, key=measured.__getitem__)
    choice = choose_variant([predicted[variant] for variant in measured]).label
    goals: dict[str, Any] = {"choice": choice, "fastest_measured": fastest}
    goals["choice_over_fastest"] = round(measured[choice] / measured[fastest], 2)
    if "gloo" in times and "powersgd_r4" in times:
        goals["powersgd_r4_over_gloo"] = round(times["powersgd_r4"] / times["gloo"], 2)
    return goals


def _markdown(report: dict[str, Any]) -> str:
    """One link's table as BENCHMARKS.md shows it."""
    head = f"{report['hosts']} hosts, link {report['link']}"
    if "rows" not in report:
        return f"{head}: no rate to compare with (run gloo's peers for the TCP limit)\n"
    lines = [
        f"{head} ({report['bandwidth_MBps']:.0f} MB/s each way), host: collectives {report['host_MBps']:.0f} MB/s "
        f"(one pack {report['host_one_pack_MBps']:.0f}), memory {report['memory_bandwidth_GBps']:.1f} GB/s, top-k "
        f"selection {report['select_bandwidth_GBps']:.2f} GB/s and scatter {report['scatter_bandwidth_MBps']:.1f} MB/s, "
        f"thin products {report['matmul_bandwidth_GBps']:.1f} GB/s (rank 1: {report['matvec_bandwidth_GBps']:.1f})",
        "",
        "| variant | ms | wire limit ms | / limit | planner ms | planner error | compute alone ms (priced) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        compute = f"{row['compute_ms']:.1f} ({row['predicted_compute_ms']:.1f})" if "compute_ms" in row else ""
        lines.append(
            f"| {row['variant']} | {row['ms']:.1f} | {row['limit_ms']:.1f} | {row['over_limit']:.2f}x "
            f"| {row['predicted_ms']:.1f} | {row['error']:+.0%} | {compute} |"
        )
    extra = {
        k: v
        for k, v in report.items()
        if k not in ("rows", "link", "hosts", "bandwidth_MBps", "host_MBps", "host_one_pack_MBps")
        and not k.endswith(("_GBps", "_MBps"))
    }
    return "\n".join(lines) + "\n\n" + json.dumps(extra) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, choices=(2, 3, 4))
    parser.add_argument("--no-gloo", action="store_true", help="skip torch (when the bench extra is missing)")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument(
        "--simulate-hosts",
        type=int,
        default=0,
        choices=(0, 2, 3, 4),
        metavar="N",
        help="run the workers (and gloo's ranks) on N simulated hosts, the ResNet-50 list only",
    )
    parser.add_argument(
        "--link",
        action="append",
        default=None,
        metavar="RATE",
        help="with --simulate-hosts: the hosts' link rate, as tfdist-launch --link takes it (1gbit, 10gbit), or "
        "none (unshaped); repeat it for several rates, one after the other (default: none)",
    )
    parser.add_argument(
        "--torch-python", default=sys.executable, help="the Python that has torch, for gloo's ranks (default: this)"
    )
    parser.add_argument("--from-json", help="with --simulate-hosts: report the measurements of an earlier --json")
    parser.add_argument("--gloo-child", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--gloo-task", help=argparse.SUPPRESS)
    parser.add_argument("--loopback-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gloo_task is not None:
        _gloo_task(args.gloo_task, args.repeats)
        return 0
    if args.simulate_hosts:
        return _simulated(args)
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
