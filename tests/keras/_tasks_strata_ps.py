"""The chief of ParameterServerStrategy fits over stratified draws, counted (tests/keras/test_strata_ps.py).

The data is tests/support/exact_tasks.py's 480 records written per class (240, 120, 80 and 40 records).
Each weighting is one fit from ``fit_input(pipeline)`` with a fresh counted model, one after the other on
the same cluster; a fit's result is kept in WORKDIR/TAG.json, so a restarted chief goes on with the fits
not done yet (the one the crash cut resumes from its backup). After the fits the chief computes two
references in this process: the same pipeline read by one process for ``epochs * steps`` batches, and
the same draws in NumPy (the classes from :func:`~tfdist.data.order.strata.class_draws`, each class's
records from :class:`~tfdist.data.order.epoch.EpochOrder`'s Python order, the ids from TensorFlow's own
TFRecord reader): neither runs the graph code the workers run.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from tests.support import exact_tasks

# The class mixes by tag: every form class_weights takes (the dict's keys are labels).
WEIGHTS: dict[str, Any] = {
    "natural": "natural",
    "sqrt": "sqrt",
    "balanced": "balanced",
    "dict": {0: 1.0, 1: 2.0, 2: 2.0, 3: 5.0},
}
SEED = 3
SHUFFLE = 64


def _pipeline(prefix: str, tag: str, **options: Any) -> Any:
    import tensorflow as tf

    features = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "x": tf.io.FixedLenFeature([exact_tasks.FEATURES_DIM], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    return exact_tasks.pipeline(
        prefix + "-*",
        features=features,
        label_key="label",
        class_weights=WEIGHTS[tag],
        num_epochs=None,
        seed=SEED,
        shuffle_buffer=SHUFFLE,
        **options,
    )


def one_process_counts(prefix: str, tag: str, batches: int) -> list[int]:
    """Per-record counts of the pipeline read by one input pipeline in this process for ``batches`` batches."""
    import itertools

    import numpy as np
    import tensorflow as tf

    reader = _pipeline(prefix, tag, order="resumable")
    counts = np.zeros(exact_tasks.RECORDS, np.int64)
    for batch in itertools.islice(reader.dataset(tf.distribute.InputContext()), batches):
        np.add.at(counts, batch["id"].numpy(), 1)
    return counts.tolist()


def numpy_counts(prefix: str, tag: str, draws: int) -> list[int]:
    """Per-record counts of the first ``draws`` stratified draws of one pipeline, without the pipeline."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data.order import splitmix
    from tfdist.data.order.epoch import EpochOrder
    from tfdist.data.order.strata import class_draws

    ids: list[list[list[int]]] = []  # Per class, per file, the ids in file order.
    for label in range(len(exact_tasks.LABEL_EDGES) + 1):
        files = sorted(glob.glob(f"{prefix}-label={label}-*.tfrecord"))
        spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
        ids.append(
            [[int(tf.io.parse_single_example(r, spec)["id"]) for r in tf.data.TFRecordDataset(f)] for f in files]
        )
    sizes = np.asarray([sum(len(f) for f in files) for files in ids], np.float64)
    weights = WEIGHTS[tag]
    if weights == "sqrt":
        mix = np.sqrt(sizes)
    elif weights == "balanced":
        mix = np.ones_like(sizes)
    else:
        mix = np.asarray([weights[c] for c in range(len(sizes))], np.float64)
    mix = (mix / mix.sum()).tolist()
    taken = np.bincount(class_draws(mix, seed=SEED, worker=0, start=0, count=draws), minlength=len(sizes))
    counts = np.zeros(exact_tasks.RECORDS, np.int64)
    for c, held in enumerate(ids):
        order = EpochOrder(
            counts=tuple(len(f) for f in held),
            block=256,
            streams=1,
            window=SHUFFLE,
            seed=splitmix.key(SEED, c) >> 1,
        )
        left, epoch = int(taken[c]), 0
        while left > 0:
            for file, record in list(order.stream_records(epoch=epoch, stream=0))[:left]:
                counts[held[file][record]] += 1
            left, epoch = left - order.num_records, epoch + 1
    return counts.tolist()


def stratified_ps_fits(workdir: str, prefix: str, options: dict[str, Any]) -> dict[str, Any]:
    """Fits ``options["tags"]`` (each ``[tag, epochs, steps_per_epoch]``) one after the other; ``backup``:
    BackupAndRestore + ResumeInput per fit. Returns per tag the counts, the steps claimed, the optimizer's
    iterations, the chief's restart, and the two references (``numpy`` for stratified draws only)."""
    import logging

    import tensorflow as tf

    import tfdist
    from tfdist import keras
    from tfdist.keras.inputs import fit_input

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    strategy = tfdist.build_strategy("auto")
    assert isinstance(strategy, tf.distribute.ParameterServerStrategy), type(strategy)
    results: dict[str, Any] = {}
    for tag, epochs, steps in options["tags"]:
        done = os.path.join(workdir, f"{tag}.json")
        if os.path.exists(done):  # Fitted before this chief's restart.
            with open(done) as f:
                results[tag] = json.load(f)
            continue
        data = _pipeline(prefix, tag)
        with strategy.scope():
            model = exact_tasks.counted_model(print_steps=True, step_tag=tag)

        class Progress(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs: Any = None, tag: str = tag) -> None:
                print(f"EPOCH {tag} {epoch}", flush=True)

        callbacks: list[Any] = [Progress()]
        if options.get("backup"):
            backup = os.path.join(workdir, f"backup-{tag}")
            callbacks = [keras.callbacks.BackupAndRestore(backup), keras.ResumeInput(data), *callbacks]
        x = fit_input(data, strategy=strategy, steps_per_epoch=steps)
        model.fit(x, epochs=epochs, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        results[tag] = {
            "counts": [int(c) for c in model.counts.numpy()],
            "claimed": data.claimed_steps(),
            "iterations": int(model.optimizer.iterations.numpy()),
            "restart": int(os.environ.get("TFDIST_RESTART", "0")),
        }
        with open(done, "w") as f:
            json.dump(results[tag], f)
    for tag, epochs, steps in options["tags"]:
        results[tag]["one_process"] = one_process_counts(prefix, tag, epochs * steps)
        if tag != "natural":
            results[tag]["numpy"] = numpy_counts(prefix, tag, epochs * steps * exact_tasks.GLOBAL_BATCH)
    return results
