"""Benchmark: all-reduce time between 2 local processes (RING over gRPC), and the cost model fitted to it.

    .venv/bin/python scripts/bench_allreduce.py [--repeats 5]

Each worker all-reduces float32 tensors of 4 KB .. 64 MB inside a tf.function under MultiWorkerMirroredStrategy
(RING, TF's default packing) and reports the median time per size. The script then fits the ring model
t = 2(N-1) latency + 2(N-1)/N bytes / bandwidth (tfdist.plan.fit_ring) and prints predicted vs measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def measure(repeats: int) -> dict[str, Any]:
    """Runs in each worker task: median all-reduce seconds per size."""
    import tfdist

    strategy = tfdist.build_strategy("multi_worker_mirrored", communication="ring")
    import tensorflow as tf

    out = {}
    for size in SIZES:
        value = strategy.experimental_distribute_values_from_function(
            lambda context, n=size // 4: tf.ones([n], tf.float32))

        device = strategy.extended.worker_devices[0]

        def replica_fn(t: Any) -> Any:
            # ReplicaContext.all_reduce sends the result to the tensor's own device; in a tf.function an
            # unplaced tensor has none ("destinations can not be empty"), so place it first.
            with tf.device(device):
                t = tf.identity(t)
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, t)

        @tf.function
        def step(x: Any) -> Any:
            return strategy.run(replica_fn, args=(x,))

        step(value)  # Trace and warm up (group set-up happens here).
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = step(value)
            strategy.experimental_local_results(result)[0].numpy()  # Wait for the result.
            times.append(time.perf_counter() - start)
        out[str(size)] = statistics.median(times)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from tfdist import testing
    from tfdist.plan import Plan, fit_ring

    run = testing.run_cluster("bench_allreduce:measure", workers=2, timeout=900, args=[args.repeats],
                              env={"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))})
    if not run.ok:
        sys.stderr.write(run.result.summary() + "\n")
        return 1
    measured = {int(k): max(run.values[w][k] for w in run.values) for k in run.values["worker:0"]}
    latency, bandwidth = fit_ring(sorted(measured.items()), workers=2)
    rows = []
    for size, seconds in sorted(measured.items()):
        predicted = Plan(params=size / 4, workers=2, bandwidth=bandwidth, latency=latency).ring_allreduce_s
        rows.append({"bytes": size, "measured_ms": round(seconds * 1e3, 3), "predicted_ms": round(predicted * 1e3, 3),
                     "error": round(predicted / seconds - 1, 3)})
    report = {"fitted_latency_us": round(latency * 1e6, 1), "fitted_bandwidth_MBps": round(bandwidth / 1e6, 1),
              "rows": rows, "max_abs_error": max(abs(r["error"]) for r in rows), "goal": "within 25%"}
    sys.stdout.write(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
