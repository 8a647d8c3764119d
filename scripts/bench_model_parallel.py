"""Benchmark: what a process holds and how fast a step runs with the model split over 2 processes.

    .venv/bin/python scripts/bench_model_parallel.py [--rounds 3] [--steps 12] [--json PATH]
    .venv/bin/python scripts/bench_model_parallel.py --pipeline [--rounds 3] [--steps 12] [--json PATH]

One model that fits both ways, an MLP over token embeddings (Embedding 4096x256 -> Flatten -> Dense 2048 ->
Dense 2048 -> Dense 10, about 9.4M parameters, Adam), trained on 2 local processes (127.0.0.1, one core
each here) from the same TFRecords, global batch 64, in three ways per round, alternating:

  model2   tfdist-launch --mesh model=2: shard_model splits the embedding and the Dense pair over the
           two processes (each holds half), DTensor all-reduces activations
  batch2   tfdist-launch --mesh batch=2: DTensor data parallel (each holds everything)
  mwms     MultiWorkerMirroredStrategy data parallel, tfdist's usual path (each holds everything)

Reported: bytes of weights and optimizer state per process (``sharding_report``; for mwms the variables'
sizes), the planner's estimate for model2 (``Plan.state_bytes`` / 2: the goal of issue 25 is the
measurement within 20% of it and at most 0.55x data parallel), and the median step time (steps after the
first 3, the slower process, median over rounds) with the ratio model2 / mwms.

``--pipeline``: two stages of 3 Dense 1024 layers (tanh) on 2 worker tasks, driven by the chief
(``tfdist-launch --chief --workers 2 --run-on chief``), global batch 256, for M = 1, 4 and 8
micro-batches (alternating per round). Each stage's forward and backward pass is also timed alone on its
task with the whole batch; the ideal step is ``max(stage) * (M + S - 1) / M`` (GPipe's schedule, no
overhead). Reported: median step time per M, its ratio to the ideal (goal of issue 25: M=4 within 1.5x),
and M=4 / M=1 (goal: below 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

VOCAB, WIDTH, TOKENS, HIDDEN, CLASSES, BATCH, RECORDS = 4096, 256, 8, 2048, 10, 64, 4096
WARMUP = 3


def _records(directory: str) -> str:
    import numpy as np
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(RECORDS, TOKENS))

    def example(i: int) -> Any:
        feature = {
            "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens[i].tolist())),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(tokens[i, 0] % CLASSES)])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    write_tfrecords((example(i) for i in range(RECORDS)), os.path.join(directory, "tokens"), num_shards=4)
    return os.path.join(directory, "tokens-*")


def _pipeline(files: str) -> Any:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    spec = {"tokens": tf.io.FixedLenFeature([TOKENS], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: Any) -> Any:
        example = tf.io.parse_single_example(record, spec)
        return example["tokens"], example["label"]

    return TFRecordPipeline(files=files, batch_size=BATCH, parse_fn=parse, num_epochs=None, drop_remainder=True)


def _model() -> Any:
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    inputs = tf_keras.Input((TOKENS,), dtype="int64", name="bench_tokens")
    x = tf_keras.layers.Embedding(VOCAB, WIDTH, name="bench_embed")(inputs)
    x = tf_keras.layers.Flatten(name="bench_flat")(x)
    x = tf_keras.layers.Dense(HIDDEN, activation="relu", name="bench_up")(x)
    x = tf_keras.layers.Dense(HIDDEN, activation="relu", name="bench_down")(x)
    outputs = tf_keras.layers.Dense(CLASSES, name="bench_out")(x)
    return tf_keras.Model(inputs, outputs, name="bench_mlp")


def task(mode: str, files: str, steps: int) -> dict[str, Any]:
    """One way of training, in one process of the launch: step times and the bytes held here."""
    import tf_keras

    times: list[float] = []

    class Clock(tf_keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.start)

    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if mode == "mwms":
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = _model()
            model.compile(optimizer=tf_keras.optimizers.Adam(1e-3), loss=loss)
        model.fit(_pipeline(files).dataset(), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Clock()])
        variables = list(model.variables) + list(model.optimizer.variables())
        held = sum(int(v.shape.num_elements() or 1) * v.dtype.size for v in variables)
        return {"times": times, "bytes_here": held, "bytes_whole": held}
    from tfdist import keras as tk
    from tfdist.parallel import build_mesh

    mesh = build_mesh()
    model = tk.shard_model(_model, mesh)
    model.compile(optimizer=tk.mesh_optimizer("adam", mesh, learning_rate=1e-3), loss=loss)
    model.fit(
        tk.fit_input(_pipeline(files), mesh=mesh), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Clock()]
    )
    report = tk.sharding_report(model)
    return {"times": times, "bytes_here": report.local_bytes, "bytes_whole": report.global_bytes}


PIPE_WIDTH, PIPE_BATCH, PIPE_LAYERS = 1024, 1024, 3


def pipeline_task(steps: int, counts: list[int]) -> dict[str, Any]:
    """On the chief: step times for each micro-batch count, and each stage's time alone."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tfdist import keras as tk
    from tfdist.parallel import connect_stages

    stages = connect_stages()

    def layers() -> Any:
        return tf_keras.Sequential(
            [tf_keras.layers.Dense(PIPE_WIDTH, activation="tanh", name=f"p{i}") for i in range(2 * PIPE_LAYERS)]
        )

    rng = np.random.default_rng(0)
    x = rng.standard_normal((PIPE_BATCH * 4, PIPE_WIDTH)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :PIPE_WIDTH])).batch(PIPE_BATCH, drop_remainder=True).repeat()
    out: dict[str, Any] = {}

    class Clock(tf_keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.times.append(time.perf_counter() - self.start)

    for count in counts:
        clock = Clock()
        model = tk.stage_model(layers, stages, input_shape=(PIPE_WIDTH,), micro_batches=count)
        model.compile(optimizer=tf_keras.optimizers.SGD(1e-3), loss="mse")
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
        out[str(count)] = statistics.median(clock.times[WARMUP:])
        if count == counts[0]:
            out["stages"] = [_stage_time(model, s, x[:PIPE_BATCH]) for s in range(len(stages))]
    return out


def _stage_time(model: Any, stage: int, batch: Any) -> float:
    import tensorflow as tf

    variables = [v for layer in model.stage_layers[stage] for v in layer.trainable_variables]
    with tf.device(model.devices[stage]):
        start = tf.identity(tf.constant(batch))

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            out = model._stage(stage, start, True)
            with tf.device(model.devices[stage]):
                total = tf.reduce_sum(out)
        return [tf.reduce_sum(g) for g in tape.gradient(total, variables)]

    times = []
    for _ in range(WARMUP + 9):
        begin = time.perf_counter()
        [float(v) for v in step()]
        times.append(time.perf_counter() - begin)
    return statistics.median(times[WARMUP:])


def pipeline_main(args: argparse.Namespace) -> int:
    from tfdist import testing

    counts = [1, 4, 8]
    rounds: dict[str, list[float]] = {str(c): [] for c in counts}
    stage_times: list[list[float]] = []
    for number in range(args.rounds):
        order = counts if number % 2 == 0 else counts[::-1]
        run = testing.run_cluster(
            pipeline_task,
            workers=2,
            chief=True,
            run_on="chief",
            args=[args.steps, order],
            threads_per_task=1,
            timeout=900,
        )
        if not run.ok:
            raise SystemExit(f"pipeline failed: {run.result.summary()}")
        values = run.values["chief:0"]
        for c in counts:
            rounds[str(c)].append(values[str(c)])
        stage_times.append(values["stages"])
        sys.stderr.write(f"round {number + 1}: {values}\n")
    stages = [statistics.median(t[s] for t in stage_times) for s in range(2)]
    result: dict[str, Any] = {"stage_s": stages, "step_s": {}, "ideal_s": {}, "vs_ideal": {}}
    for c in counts:
        step = statistics.median(rounds[str(c)])
        ideal = max(stages) * (c + len(stages) - 1) / c
        result["step_s"][str(c)], result["ideal_s"][str(c)], result["vs_ideal"][str(c)] = step, ideal, step / ideal
        sys.stdout.write(f"M={c}: step {step * 1e3:7.1f} ms, ideal {ideal * 1e3:7.1f} ms, {step / ideal:.2f}x ideal\n")
    result["m4_vs_m1"] = result["step_s"]["4"] / result["step_s"]["1"]
    sys.stdout.write(
        f"stages alone: {[round(s * 1e3, 1) for s in stages]} ms; M=4 / M=1: {result['m4_vs_m1']:.2f} "
        "(goals: M=4 within 1.5x of ideal, and below M=1)\n"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


MODES: dict[str, dict[str, Any]] = {"model2": {"mesh": "model=2"}, "batch2": {"mesh": "batch=2"}, "mwms": {}}


def _launch(mode: str, files: str, steps: int) -> dict[str, Any]:
    from tfdist import testing

    run = testing.run_cluster(task, workers=2, args=[mode, files, steps], timeout=600, **MODES[mode])
    if not run.ok:
        raise SystemExit(f"{mode} failed: {run.result.summary()}")
    values = list(run.values.values())
    per_process = [statistics.median(v["times"][WARMUP:]) for v in values]
    return {
        "step_s": max(per_process),
        "bytes_here": max(v["bytes_here"] for v in values),
        "bytes_whole": values[0]["bytes_whole"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--json", default=None)
    parser.add_argument("--pipeline", action="store_true", help="time pipeline stages instead of the mesh")
    args = parser.parse_args()
    if args.pipeline:
        return pipeline_main(args)
    from tfdist.plan import Plan

    with tempfile.TemporaryDirectory(prefix="tfdist-bench-mp-") as tmp:
        files = _records(tmp)
        rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for number in range(args.rounds):
            order = list(MODES) if number % 2 == 0 else list(reversed(MODES))  # Alternate, so drift cancels.
            for mode in order:
                rounds[mode].append(_launch(mode, files, args.steps))
                sys.stderr.write(f"round {number + 1} {mode}: {rounds[mode][-1]}\n")
    step = {mode: statistics.median(r["step_s"] for r in runs) for mode, runs in rounds.items()}
    held = {mode: runs[0]["bytes_here"] for mode, runs in rounds.items()}
    params = (
        (VOCAB * WIDTH) + (TOKENS * WIDTH * HIDDEN + HIDDEN) + (HIDDEN * HIDDEN + HIDDEN) + (HIDDEN * CLASSES + CLASSES)
    )
    estimate = Plan(params=params, workers=2, bandwidth=1e9, latency=1e-5).state_bytes / 2
    result = {
        "params": params,
        "step_s": step,
        "bytes_per_process": held,
        "model2_vs_data_parallel_bytes": held["model2"] / held["mwms"],
        "planner_estimate_model2_bytes": estimate,
        "measured_vs_estimate": held["model2"] / estimate,
        "model2_vs_mwms_step": step["model2"] / step["mwms"],
        "batch2_vs_mwms_step": step["batch2"] / step["mwms"],
    }
    for mode in MODES:
        sys.stdout.write(f"{mode:8s} step {step[mode] * 1e3:8.1f} ms   held per process {held[mode] / 1e6:8.1f} MB\n")
    sys.stdout.write(
        f"model2 / data parallel bytes: {result['model2_vs_data_parallel_bytes']:.3f} (goal <= 0.55); "
        f"measured / planner estimate: {result['measured_vs_estimate']:.3f} (goal within 0.8-1.2)\n"
        f"step time model2 / mwms: {result['model2_vs_mwms_step']:.2f}x, batch2 / mwms: "
        f"{result['batch2_vs_mwms_step']:.2f}x\n"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
