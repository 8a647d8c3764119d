"""Benchmark: what the stall inspector's step watchdog costs a training step, and one look at the stacks.

    .venv/bin/python scripts/bench_stall_watch.py [--pairs 5] [--steps 3000]

Each run is a new interpreter that trains a small tf-keras model (8 -> 16 -> 1, batch 32, one process, the
default strategy) for STEPS steps and reports the median step time (``on_train_batch_end`` stamps, the first
200 steps left out). ``on`` runs with the watchdog (``TFDIST_STEP_WATCH`` set, started by
``tfdist.build_strategy``, as under ``--stall-seconds``), ``off`` without; the runs alternate, PAIRS of each.
A step of that model takes about a millisecond, mostly Python and TensorFlow's call overhead: the case where a
thread that takes the GIL ten times a second would show most. The ``on`` runs also time one look at the stacks
(``StackSampler.sample(sys._current_frames())``, the main thread inside a TensorFlow call) and one report write.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_WARMUP = 200


def _child(mode: str, steps: int) -> dict[str, float]:
    import tfdist

    tfdist.build_strategy("default")  # starts the watchdog when TFDIST_STEP_WATCH is set
    import numpy as np
    import tensorflow as tf

    from tfdist import keras

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32 * 100, 8)).astype("float32"), rng.normal(size=(32 * 100, 1)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    stamps: list[float] = []
    stamp = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: stamps.append(time.perf_counter()))
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[stamp])
    gaps = [b - a for a, b in zip(stamps[_WARMUP:], stamps[_WARMUP + 1 :])]
    result = {"step_ms": statistics.median(gaps) * 1e3}
    if mode == "on":
        result.update(_look_and_report())
    return result


def _look_and_report() -> dict[str, float]:
    """Microseconds of one look at the stacks (while a thread is inside a TF call) and of one report."""
    import threading

    import tensorflow as tf

    from tfdist.runtime import watchdog

    stop = threading.Event()

    @tf.function
    def busy(x: tf.Tensor) -> tf.Tensor:
        return tf.linalg.matmul(x, x)

    def loop() -> None:
        x = tf.ones((256, 256))
        while not stop.is_set():
            busy(x)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.5)
    sampler = watchdog.StackSampler(thread.ident or 0)
    start = time.perf_counter()
    for _ in range(2000):
        sampler.sample(sys._current_frames())
    look = (time.perf_counter() - start) / 2000
    stop.set()
    thread.join()
    target = watchdog.WatchTarget.from_env(os.environ[watchdog.WATCH_VAR])
    assert target is not None and watchdog._running is not None
    start = time.perf_counter()
    for _ in range(200):
        watchdog._running._report(time.monotonic())
    report = (time.perf_counter() - start) / 200
    return {"look_us": look * 1e6, "report_us": report * 1e6}


def _run(mode: str, steps: int, directory: str) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("TFDIST_STEP_WATCH", None)
    if mode == "on":
        env["TFDIST_STEP_WATCH"] = json.dumps({"directory": directory, "task": "worker:0", "attempt": 0})
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--steps", str(steps)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.steps)))
        return 0
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as directory:
        for pair in range(args.pairs):
            for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                results[mode].append(_run(mode, args.steps, directory))
                print(f"{mode}: {results[mode][-1]}", flush=True)
    off = statistics.median(r["step_ms"] for r in results["off"])
    on = statistics.median(r["step_ms"] for r in results["on"])
    look = statistics.median(r["look_us"] for r in results["on"])
    report = statistics.median(r["report_us"] for r in results["on"])
    print(f"median step: off {off:.3f} ms, on {on:.3f} ms ({on / off:.3f}x); {args.pairs} pairs of {args.steps} steps")
    print(f"one look at the stacks {look:.1f} us (10/s), one report {report:.1f} us (2/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
