"""Benchmark: parameter-server fit records/s, claimed steps (the default) vs order="buffer" vs TF's tutorial style.

    .venv/bin/python scripts/bench_ps_input.py [--sizes 64,224] [--num 6000] [--batch 64] [--rounds 3]
                                               [--steps 40] [--epochs 3] [--shuffle-buffer 64] [--variants ...]
                                               [--steps-per-execution 1] [--alone] [--workdir DIR]

One cluster (chief, 2 workers, 1 ps; ``tfdist.launch.run_function``, the local engine) fits a tiny conv net
(Conv2D 8 filters 5x5 stride 4, ReLU, global average pooling, Dense over the 8 classes; SGD, softmax
cross-entropy), so the input path is what is measured, on ``--num`` synthetic JPEGs per size
(scripts/make_synthetic_images.py, 8 classes whose frequencies halve), decoded and resized to ``scale`` x
size, written in 16 files and again with ``partition_by="label"`` (16 files per class). Variants, one fit each
of ``--epochs`` epochs of ``--steps`` steps of global batch ``--batch`` (``--steps-per-execution`` of them per
closure: TF's PS tutorial compiles with 10), every one shuffling by
``--shuffle-buffer`` (the tutorial's ``shuffle(64)``) and reading endlessly:

  default        ``fit_input(TFRecordPipeline(...))``: each worker claims the next global step from the
                 ledger on the ps (tfdist.data.order.claims, ledger.py) and reads that step's records;
  buffer         the same pipeline with ``order="buffer"``: every worker reads all of the data through
                 TF's readers and shuffle buffer (a ``DatasetCreator`` over ``pipeline.dataset_fn``);
  tutorial       TF's PS tutorial: a tf-keras ``DatasetCreator`` over plain tf.data (``TFRecordDataset``,
                 shuffle, repeat, shard, one parse-and-decode map, batch, ``prefetch(2)``);
  default_sqrt   ``default`` with ``class_weights="sqrt"`` on the partitioned files: claimed stratified
                 draws (tfdist.data.order.claimed_draws);
  buffer_sqrt    the same in ``order="buffer"`` (the buffer sampler on every worker).

Where the claims' time goes:

  tutorial_serial  the tutorial style with nothing read ahead of a step, as under claims: a serial map, no
                   prefetch, tfdist's ``claim_options`` and ``claim_input_options`` (no per-worker buffer);
  default_noread   ``default`` without the ledger's closure hooks (no ``begin`` in the closures' function, no
                   read before a closure: what a failed closure gives back is then unknown; fine in a benchmark);
  default_read     ``default`` with the hooks before fde6e8a: the coordinator reads the ledger's claim counts
                   on the ps before each closure (``StepLedger.started``), no ``begin``.

``--alone`` also times every reader alone in the launching process before the cluster starts (no model, no
cluster; the claimed ones claim from a ledger in that process), and in the chief before the fits the claimed
readers with their ledger on the ps (``default@ps``: each claim a call to the ps, as from a worker) and the
claims alone (``claims@ps``): wall and CPU ms per step.

The tutorial style has no stratified form; ``default_sqrt`` is also compared to its plain run. Records/s of a
fit: the records of epochs 2.. over the time from the end of the first epoch to the end of the last (PS fit
joins the closures at each epoch end). The rounds alternate: the variants of a size run one after the
other, in reverse order every other round. The ratios are medians of the per-round ratios (each pairs two
fits of one round). In the chief, ``StepLedger.closure_started`` (the coordinator's hook before each closure
under claimed steps; it reads the ps only when it does not know the closures begun) is timed over the fits'
epochs 2..: median, 90th percentile and count.
Prints a Markdown table (for BENCHMARKS.md), then everything as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DIAGNOSTICS = ("tutorial_serial", "default_noread")
WITH_HOOKS = {"default": "begin", "default_sqrt": "begin", "default_read": "read"}  # Variant -> its closure hooks.
# The run order of a round (reversed every other round): each ratio's two variants run next to each other.
ORDER = (
    "tutorial_serial",
    "tutorial",
    "buffer",
    "default",
    "default_noread",
    "default_read",
    "default_sqrt",
    "buffer_sqrt",
)
RATIOS = {  # name -> (numerator, denominator, goal); the tutorial style has no stratified form: its plain.
    "default/buffer": ("default", "buffer", 0.95),
    "default_sqrt/buffer_sqrt": ("default_sqrt", "buffer_sqrt", 0.95),
    "default/tutorial": ("default", "tutorial", None),
    "default_sqrt/tutorial": ("default_sqrt", "tutorial", None),
    "default_sqrt/default": ("default_sqrt", "default", None),
    "tutorial_serial/tutorial": ("tutorial_serial", "tutorial", None),  # What reading nothing ahead costs.
    "default_noread/tutorial_serial": ("default_noread", "tutorial_serial", None),  # The claims, but the read.
    "default/default_noread": ("default", "default_noread", None),  # The closures' hooks (begin).
    "default/default_read": ("default", "default_read", None),  # begin against a read before each closure.
}
CLASSES = 8


def _write(work: str, num: int, size: int) -> tuple[list[str], str]:
    """The 16 plain files and the partitioned prefix of ``size`` px images (written once per workdir)."""
    import tensorflow as tf
    from make_synthetic_images import examples

    from tfdist.data import write_tfrecords

    plain, part = os.path.join(work, f"plain{size}-{num}"), os.path.join(work, f"part{size}-{num}")
    if not tf.io.gfile.glob(plain + "-0*"):
        data = list(examples(num, CLASSES, size, "long-tail", 0))
        write_tfrecords(data, plain, num_shards=16)
        write_tfrecords(data, part, num_shards=16, partition_by="label")
    return sorted(tf.io.gfile.glob(plain + "-0*")), part + "-*"


def _sources(files: list[str], part: str, size: int, settings: dict[str, Any]) -> dict[str, Any]:
    """Each variant's input: a ``TFRecordPipeline``, or (the tutorial style) a dataset function."""
    import functools

    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    out = round(size * settings["scale"])
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def pipeline(paths: Any, **options: Any) -> Any:
        return TFRecordPipeline(
            files=paths,
            features=spec,
            batch_size=settings["batch"],
            image_key="image",
            image_size=(out, out),
            label_key="label",
            as_supervised=True,
            num_epochs=None,
            shuffle_buffer=settings["shuffle"],
            seed=0,
            **options,
        )

    tutorial = functools.partial(_tutorial, files, spec, out, settings["batch"], settings["shuffle"])
    streams = {"order_streams": settings["streams"]} if settings.get("streams") else {}
    return {
        "tutorial": tutorial,
        "tutorial_serial": functools.partial(tutorial, serial=True),
        "buffer": pipeline(files, order="buffer"),
        "default": pipeline(files, **streams),
        "default_noread": pipeline(files, **streams),
        "default_read": pipeline(files, **streams),
        "default_sqrt": pipeline(part, class_weights="sqrt", **streams),
        "buffer_sqrt": pipeline(part, class_weights="sqrt", order="buffer"),
    }


def _tutorial(
    files: list[str], spec: Any, out: int, batch: int, shuffle: int, input_context: Any, *, serial: bool = False
) -> Any:
    """TF's PS tutorial's dataset function, with a parse-and-decode map; ``serial``: nothing read ahead of a step,
    as under claims (a serial map, no prefetch, tfdist's ``claim_options``)."""
    import tensorflow as tf

    from tfdist.data.order.claims import claim_options

    def parse(record: Any) -> Any:
        features = tf.io.parse_single_example(record, spec)
        image = tf.image.resize(tf.io.decode_jpeg(features["image"], channels=3), (out, out)) / 255.0
        return {"image": image}, features["label"]

    dataset = tf.data.TFRecordDataset(files)
    dataset = (dataset.shuffle(shuffle) if shuffle else dataset).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.map(parse, num_parallel_calls=None if serial else tf.data.AUTOTUNE)
    dataset = dataset.batch(input_context.get_per_replica_batch_size(batch))
    return dataset.with_options(claim_options()) if serial else dataset.prefetch(2)


def _chief(data: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Runs in the chief: every round's fits; records/s per size and variant, and the ledger's reads."""
    import logging
    import time

    import tensorflow as tf

    import tfdist
    from tfdist import _compat, keras
    from tfdist.data import TFRecordPipeline
    from tfdist.data.order.claims import claim_input_options
    from tfdist.data.order.ledger import StepLedger
    from tfdist.keras.inputs import fit_input

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    strategy = tfdist.build_strategy("auto")
    assert isinstance(strategy, tf.distribute.ParameterServerStrategy), type(strategy)
    batch, steps, epochs = settings["batch"], settings["steps"], settings["epochs"]

    reads: list[tuple[float, float]] = []  # (start, seconds) of each StepLedger.closure_started call.
    timing = [""]  # The fit running's closure hooks: "begin" (the ledger's), "read" (before fde6e8a), "" none.
    started, hooks = StepLedger.closure_started, StepLedger.hooks

    def timed_started(self: StepLedger, worker: int) -> int | None:
        begin = time.perf_counter()
        try:
            return started(self, worker)
        finally:
            reads.append((begin, time.perf_counter() - begin))

    def kept_hooks(self: StepLedger) -> Any:
        # default_noread's closures run no hooks: nothing read before them, no begin in their function.
        if timing[0] == "begin":
            return hooks(self)
        if timing[0] == "read":
            return _compat.ClosureHooks(
                started=self.started, failed=lambda worker, since: self.failed(worker, since)[0]
            )
        return _compat.ClosureHooks(started=lambda worker: None, failed=lambda worker, token: None)

    StepLedger.closure_started = timed_started  # type: ignore[method-assign]
    StepLedger.hooks = kept_hooks  # type: ignore[method-assign]

    def made(source: Any, name: str) -> Any:
        if isinstance(source, TFRecordPipeline):
            return lambda: fit_input(source, strategy=strategy, steps_per_epoch=steps)
        options = claim_input_options() if name == "tutorial_serial" else None  # No per-worker buffer either.
        return lambda: keras.utils.experimental.DatasetCreator(source, input_options=options)

    def fit(make_input: Any, out: int, timed: str) -> tuple[float, list[float]]:
        with strategy.scope():
            image = keras.Input((out, out, 3), name="image")
            hidden = keras.layers.Conv2D(8, 5, strides=4, activation="relu")(image)
            logits = keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(hidden))
            model = keras.Model({"image": image}, logits)
            model.compile(
                optimizer=keras.optimizers.SGD(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                steps_per_execution=settings["steps_per_execution"],
            )
        ends: list[float] = []
        busy: list[tuple[int, int]] = []

        def ended(epoch: int, logs: Any) -> None:
            ends.append(time.perf_counter())
            busy.append(_machine_cpu())

        record = keras.callbacks.LambdaCallback(on_epoch_end=ended)
        reads.clear()
        timing[0] = timed
        model.fit(make_input(), epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=[record])
        timing[0] = ""
        rate = (epochs - 1) * steps * batch / (ends[-1] - ends[0])
        shares[0] = (busy[-1][0] - busy[0][0]) / max(1, busy[-1][1] - busy[0][1])
        return rate, [seconds * 1e3 for begin, seconds in reads if begin > ends[0]]

    sources = {size: _sources(files, part, int(size), settings) for size, (files, part) in data.items()}
    inputs = {size: {name: made(source, name) for name, source in by.items()} for size, by in sources.items()}
    remote = {size: _per_step(_on_the_ps(by, strategy, settings), settings) for size, by in sources.items()}
    names = [name for name in ORDER if name in settings["variants"]]
    rates: dict[str, dict[str, list[float]]] = {size: {name: [] for name in names} for size in data}
    read_ms: dict[str, dict[str, list[float]]] = {size: {name: [] for name in names} for size in data}
    busy_share: dict[str, dict[str, list[float]]] = {size: {name: [] for name in names} for size in data}
    shares = [0.0]  # The last fit's share of the machine's CPU time busy over epochs 2.. (all tasks, all users).
    for round_ in range(settings["rounds"]):
        for size in data:
            for name in names if round_ % 2 == 0 else names[::-1]:
                out = round(int(size) * settings["scale"])
                rate, ms = fit(inputs[size][name], out, WITH_HOOKS.get(name, ""))
                rates[size][name].append(round(rate, 1))
                read_ms[size][name].extend(ms)
                busy_share[size][name].append(round(shares[0], 3))
                print(f"ROUND {round_} {size} px {name}: {rate:,.0f} records/s, cores busy {shares[0]:.0%}", flush=True)
    return {
        "rates": rates,
        "on_the_ps": remote if settings["alone"] else {},
        "ledger_reads": {s: {n: _spread(v) for n, v in by.items() if v} for s, by in read_ms.items()},
        "cores_busy": {s: {n: statistics.median(v) for n, v in by.items() if v} for s, by in busy_share.items()},
    }


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) clock ticks of this machine's CPUs since boot, from /proc/stat ((0, 0) elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:]]
    except OSError:
        return 0, 0
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return sum(ticks) - idle, sum(ticks)


def _on_the_ps(sources: dict[str, Any], strategy: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """With ``alone``, in the chief: the claimed readers read there with their ledger on the ps (every claim a
    call to the ps, as from a worker), and the claims alone (``claims@ps``)."""
    if not settings["alone"]:
        return {}
    names = [name for name in ("default", "default_sqrt") if name in settings["variants"]]
    makers: dict[str, Any] = {
        f"{name}@ps": lambda name=name: sources[name].claimed_dataset_fn(strategy)(None) for name in names
    }
    if names:

        def claims() -> Any:
            import tensorflow as tf

            sources[names[0]].claimed_dataset_fn(strategy)
            return sources[names[0]].claims_ledger().steps_for(tf.constant(0, tf.int64))

        makers["claims@ps"] = claims
    return makers


def _alone(data: dict[str, Any], settings: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Each variant's reader alone in this process (no cluster, no model), the claimed ones on a local ledger."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    found = {}
    for size, (files, part) in data.items():
        sources = _sources(files, part, int(size), settings)
        makers = {}
        for name in ORDER:
            if name not in settings["variants"] or name in ("default_noread", "default_read"):
                continue
            source = sources[name]
            if name.startswith("default"):  # The claimed reader, claiming from a ledger in this process.
                makers[name] = lambda source=source: source.claimed_dataset_fn(strategy)(None)
            elif name.startswith("buffer"):
                makers[name] = lambda source=source: source.dataset(tf.distribute.InputContext())
            else:
                makers[name] = lambda source=source: source(tf.distribute.InputContext())
        found[size] = _per_step(makers, settings)
    return found


ALONE_STEPS = 400  # Steps timed per reader alone: a prefetching reader drains what it read before the timer.


def _per_step(makers: dict[str, Any], settings: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Wall and CPU (this process, all threads) ms per step of each maker's dataset over :data:`ALONE_STEPS`
    steps after the first, medians of the rounds (alternating). A reader that prefetches (the buffer order,
    the tutorial style) computed its buffer before the timer started, and nothing consumes as fast as this
    loop: over 40 steps its CPU per step read 6.9 ms where 400 steps read 8.4-9.1."""
    import time

    names = list(makers)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(settings["rounds"]):
        for name in names if round_ % 2 == 0 else names[::-1]:
            iterator = iter(makers[name]())
            next(iterator)
            began, cpu_began = time.perf_counter(), time.process_time()
            for _ in range(ALONE_STEPS):
                next(iterator)
            wall[name].append((time.perf_counter() - began) * 1e3 / ALONE_STEPS)
            cpu[name].append((time.process_time() - cpu_began) * 1e3 / ALONE_STEPS)
            del iterator
    return {
        name: {"wall_ms": round(statistics.median(wall[name]), 2), "cpu_ms": round(statistics.median(cpu[name]), 2)}
        for name in names
    }


def _spread(ms: list[float]) -> dict[str, float]:
    """Median, 90th percentile and count of the ledger's read times (ms)."""
    ordered = sorted(ms)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "count": len(ordered),
    }


def _summary(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Per variant the median, min and max records/s; per ratio the median of the per-round ratios."""
    out: dict[str, Any] = {
        "records_per_s": {
            name: {"median": round(statistics.median(v)), "min": round(min(v)), "max": round(max(v)), "runs": v}
            for name, v in rates.items()
        },
        "ratios": {},
    }
    for name, (top, bottom, goal) in RATIOS.items():
        if top in rates and bottom in rates:
            paired = [a / b for a, b in zip(rates[top], rates[bottom])]
            median = statistics.median(paired)
            out["ratios"][name] = {
                "median": round(median, 3),
                "min": round(min(paired), 3),
                "max": round(max(paired), 3),
                "goal": goal,
                "met": goal is not None and median >= goal,
            }
    return out


def _table(report: dict[str, Any]) -> str:
    """Markdown, one row per size and input (plain, stratified): records/s of each variant, the ratios, and
    the ledger's read per closure (for BENCHMARKS.md)."""

    def cell(numbers: dict[str, Any], name: str) -> str:
        if name not in numbers:
            return "-"
        got = numbers[name]
        if "goal" in got:
            text = f"{got['median']:.3f}x ({got['min']:.2f}-{got['max']:.2f})"
            return f"**{text}**" if got["met"] else text
        if "median_ms" in got:
            return f"{got['median_ms']:.2f} ms ({got['p90_ms']:.2f}; {got['count']})"
        return f"{got['median']:,} ({got['min']:,}-{got['max']:,})"

    rows = [
        '| input | default (claimed) | `order="buffer"` | tutorial style | default / buffer (goal >= 0.95) | '
        "default / tutorial | ledger read per closure (p90; reads) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, numbers in report["sizes"].items():
        rates, ratios, reads = numbers["records_per_s"], numbers["ratios"], numbers["ledger_reads"]
        for kind, suffix in (("plain", ""), ('`class_weights="sqrt"`', "_sqrt")):
            cells = [
                cell(rates, "default" + suffix),
                cell(rates, "buffer" + suffix),
                cell(rates, "tutorial") if not suffix else "no stratified form",
                cell(ratios, f"default{suffix}/buffer{suffix}"),
                cell(ratios, f"default{suffix}/tutorial"),
                cell(reads, "default" + suffix),
            ]
            rows.append(f"| {size} px, {kind} | " + " | ".join(cells) + " |")
    where = [
        f"{size} px: "
        + "; ".join(f"{name} {cell(numbers['records_per_s'], name)}" for name in DIAGNOSTICS)
        + "; "
        + "; ".join(f"{name} {cell(numbers['ratios'], name)}" for name in list(RATIOS)[-3:])
        for size, numbers in report["sizes"].items()
        if all(name in numbers["records_per_s"] for name in DIAGNOSTICS)
    ]
    where += [
        f"{size} px alone, ms per step (CPU ms): "
        + "; ".join(
            f"{name} {got['wall_ms']:.1f} ({got['cpu_ms']:.1f})" for name, got in numbers["alone_ms_per_step"].items()
        )
        for size, numbers in report["sizes"].items()
        if "alone_ms_per_step" in numbers
    ]
    return (
        "records/s after the first epoch, median (min-max) of the rounds; ratios: median (min-max) of the "
        "per-round ratios (bold: the goal is met)\n\n" + "\n".join(rows + [""] + where) + "\n\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,224", help="JPEG sizes (px), comma-separated")
    parser.add_argument("--scale", type=float, default=0.75, help="decode and resize to this fraction of the size")
    parser.add_argument("--num", type=int, default=6000, help="JPEGs per size")
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per fit (the first is not measured)")
    parser.add_argument("--shuffle-buffer", type=int, default=64, help="records; 0: no shuffling")
    parser.add_argument(
        "--steps-per-execution", type=int, default=1, help="fit's steps per closure (TF's PS tutorial: 10)"
    )
    parser.add_argument(
        "--variants", default=",".join(ORDER), help="comma-separated, of: " + ", ".join(ORDER) + " (default: all)"
    )
    parser.add_argument(
        "--order-streams", type=int, default=None, help="order_streams of the claimed variants (default: tfdist's)"
    )
    parser.add_argument("--workdir", default=None, help="keep the written files here (reused when present)")
    parser.add_argument("--alone", action="store_true", help="also time each reader alone in this process")
    parser.add_argument("--log-dir", default=None, help="one log file per task here (the chief's: ROUND lines)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for the whole cluster run")
    args = parser.parse_args(argv)
    chosen = args.variants.split(",")
    positive = min(args.rounds, args.steps, args.batch, args.num, args.steps_per_execution)
    if args.epochs < 2 or positive < 1 or args.steps % args.steps_per_execution or not set(chosen) <= set(ORDER):
        parser.error(
            "--epochs must be at least 2; --rounds, --steps, --batch, --num, --steps-per-execution positive, "
            "the last dividing --steps; --variants known"
        )
    import tensorflow as tf

    from tfdist.launch import run_function

    work = args.workdir or tempfile.mkdtemp(prefix="tfdist-bench-ps-")
    data = {str(size): _write(work, args.num, int(size)) for size in args.sizes.split(",")}
    settings = {
        "batch": args.batch,
        "steps": args.steps,
        "epochs": args.epochs,
        "shuffle": args.shuffle_buffer,
        "scale": args.scale,
        "rounds": args.rounds,
        "variants": chosen,
        "alone": args.alone,
        "steps_per_execution": args.steps_per_execution,
        "streams": args.order_streams,
    }
    alone = _alone(data, settings) if args.alone else {}
    run = run_function(
        _chief, workers=2, ps=1, chief=True, timeout=args.timeout, args=[data, settings], log_dir=args.log_dir
    )
    if not run.ok:
        sys.stderr.write(run.result.summary() + "\n" + run.output("chief:0")[-5000:] + "\n")
        return 1
    value = run.values["chief:0"]
    report = {
        "cluster": "chief, 2 workers, 1 ps (local engine)",
        "tensorflow": tf.__version__,
        "settings": vars(args),
        "sizes": {
            f"{size}->{round(int(size) * args.scale)}": {
                **_summary(value["rates"][size]),
                "ledger_reads": value["ledger_reads"][size],
                "cores_busy": value["cores_busy"][size],
                **({"alone_ms_per_step": {**alone[size], **value["on_the_ps"][size]}} if alone else {}),
            }
            for size in data
        },
    }
    sys.stdout.write(_table(report) + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    from tfdist import exit_cleanly

    exit_cleanly(main)
