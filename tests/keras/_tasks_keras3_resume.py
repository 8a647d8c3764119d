"""What the tasks of tests/keras/test_keras3_resume.py run (each task imports this file by path).

:func:`resumed_fit` trains a Keras 3 model that counts every record it trains (tests/keras/_tasks_keras3.py's
``_counted_model``) for 3 epochs of a ``TFRecordPipeline`` (tests/support/exact_tasks.py's records: 20 global
steps of 24 per epoch) under MultiWorkerMirroredStrategy, with ``PreemptionSafeBackup(save_freq=4,
data=pipeline)``, ``ElasticEpochs`` and ``LinearScaling``. The leader prints ``STEP epoch batch`` after each
step, for the test's progress trigger. In its first attempt worker 1 sends itself SIGTERM after step 9 of
epoch 0 (the preemption); the test SIGKILLs it in the next attempt (the crash) after the leader printed step 10
of epoch 1 and waits there, so the kill lands at that step however fast the steps run. The attempt that finishes
then checks, on the same processes, what else Keras 3 models get from tfdist: fit, evaluate and predict equal
to one process on 2 workers, the communication options, gradient accumulation, the refusals, and the start of
an epoch at a step, against plain runs.

Every task runs as where tf-keras is not installed (TensorFlow 2.22 has none): :func:`hide_tf_keras` runs
before anything imports ``tfdist.keras``, so all of the above runs without tf_keras, and the finishing attempt
also returns what the tf-keras names and helpers raise there (:func:`_without_tf_keras`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
import time
from typing import Any

EPOCHS = 3


class _NoTfKeras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import tf_keras`` (and its submodules) fails with the error of a stack without tf-keras.

    Its spec has no origin and its loader refuses, rather than ``find_spec`` raising: TensorFlow's own import
    (2.22) asks ``importlib.util.find_spec("tf_keras")``, and skips a spec without an origin as it skips none.
    """

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.machinery.ModuleSpec(name, self) if name.partition(".")[0] == "tf_keras" else None

    def create_module(self, spec: Any) -> Any:
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)

    def exec_module(self, module: Any) -> None:
        raise AssertionError("create_module refused it")


def hide_tf_keras() -> None:
    """From here on this process imports as if tf-keras were not installed.

    The launcher sets TF_USE_LEGACY_KERAS=1 where tf-keras is installed, so the fork server the task was forked
    from has imported tf_keras there: its modules leave ``sys.modules``. No module of ``tfdist.keras`` is
    imported yet (checked), so each imports what a stack without tf-keras gives it.
    """
    imported = [name for name in sys.modules if name.startswith("tfdist.keras")]
    assert not imported, f"imported before tf_keras was hidden: {imported}"
    for name in [name for name in sys.modules if name.partition(".")[0] == "tf_keras"]:
        del sys.modules[name]
    sys.meta_path.insert(0, _NoTfKeras())


def _flat(model: Any) -> list[float]:
    import numpy as np

    return np.concatenate([np.ravel(w) for w in model.get_weights()]).tolist()


def resumed_fit(workdir: str, prefix: str) -> dict[str, Any]:
    """The fit (see the module), then, in the attempt that finishes, the other checks."""
    hide_tf_keras()
    import logging

    import tensorflow as tf

    import tfdist
    from tests.keras._tasks_keras3 import _counted_model, trained_both_ways
    from tests.support import exact_tasks
    from tfdist.keras import ElasticEpochs, LinearScaling, PreemptionSafeBackup, fit_input

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)  # "Input resumes at ..." is what the test looks for.
    strategy = tfdist.build_strategy("auto", communication="ring")
    import keras  # Keras 3, fixed as it is imported.

    tf.config.experimental.enable_op_determinism()
    task, restart = os.environ.get("TFDIST_TASK", "worker:0"), int(os.environ.get("TFDIST_RESTART", "0"))

    def pipeline() -> Any:
        return exact_tasks.pipeline(prefix + "-*", num_epochs=1, label_key="y", as_supervised=True)

    data = pipeline()
    with strategy.scope():
        model = _counted_model(keras, exact_tasks.RECORDS)
    model.optimizer.learning_rate.assign(0.01)  # LinearScaling sets 0.05 = 0.025 x 2 replicas / 1.

    class Progress(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if task == "worker:0":
                print(f"STEP {self.epoch} {batch}", flush=True)
                if restart == 1 and (self.epoch, batch) == (1, 10):
                    time.sleep(120)  # Held (the group with it) until the kill this line triggers lands.
            if restart == 0 and task == "worker:1" and (self.epoch, batch) == (0, 9):
                os.kill(os.getpid(), signal.SIGTERM)  # The backup saves every worker at one step, and exits.

    scaling = LinearScaling(0.025, reference_world_size=1)
    callbacks = [
        PreemptionSafeBackup(os.path.join(workdir, "backup"), save_freq=4, data=data),
        ElasticEpochs(),
        scaling,
        Progress(),
    ]
    history = model.fit(fit_input(data, strategy=strategy), epochs=EPOCHS, verbose=0, callbacks=callbacks)
    with strategy.scope():
        counts = model.counts.numpy()  # The sum over every replica of every worker.
    reference = _counted_model(keras, exact_tasks.RECORDS)  # Uninterrupted, one process, the global batches.
    reference.fit(pipeline().dataset(cluster=tfdist.ClusterSpec.local(workers=1)), epochs=EPOCHS, verbose=0)
    return {
        "restart": restart,
        "counts": [int(c) for c in counts],
        "weights": [float(v) for v in _flat(model.dense)],
        "uninterrupted": [float(v) for v in _flat(reference.dense)],
        "world_size": history.history.get("world_size"),
        "learning_rate": [scaling.learning_rate, float(model.optimizer.learning_rate.numpy())],
        "one_process": trained_both_ways(keras, strategy, 2)[0],  # As in tests/keras/test_keras3.py (2 epochs).
        "communication": _communication(keras, strategy),
        "epoch_starts": _epoch_starts(keras),
        "without_tf_keras": _without_tf_keras(keras),
    }


def _without_tf_keras(keras: Any) -> dict[str, Any]:
    """What the tf-keras names and helpers raise without tf-keras (the error's class, field and message), and
    whether anything imported tf_keras in this process."""
    import tempfile

    import numpy as np

    import tfdist
    from tfdist import keras as tfdist_keras

    model = _small(keras, keras.optimizers.SGD(0.05))  # No strategy: refused before anything runs.
    data = (np.ones((8, 8), "float32"), np.ones((8, 1), "float32"))
    uses = {
        "Sequential": lambda: tfdist_keras.Sequential(),
        "layers.Dense": lambda: tfdist_keras.layers.Dense(1),
        "cluster_callbacks": lambda: tfdist_keras.cluster_callbacks(backup_dir=tempfile.mkdtemp()),
        "ThroughputLogger": lambda: model.fit(*data, verbose=0, callbacks=[tfdist_keras.ThroughputLogger(8)]),
    }
    raised: dict[str, Any] = {}
    for name, use in uses.items():
        try:
            use()
        except tfdist.Error as err:
            raised[name] = [type(err).__name__, err.field, err.fix, str(err)]
    return {"raised": raised, "tf_keras_imported": "tf_keras" in sys.modules}


def _communication(keras: Any, strategy: Any) -> dict[str, Any]:
    """One epoch of tests/keras/_tasks_keras3.py's model and global batches under the strategy: plain, packed,
    bf16 and fp16 on the wire, accumulated over 2 micro-batches; and what is refused, with its message."""
    import tfdist
    from tests.keras._tasks_keras3 import _data, _dataset
    from tfdist.keras import accumulate_gradients, with_communication

    x, y, _, _ = _data()
    keras.utils.set_random_seed(5)
    initial = _small(keras, keras.optimizers.SGD(0.05)).get_weights()
    results: dict[str, Any] = {}
    for name, options in (
        ("plain", None),
        ("packed", {"bytes_per_pack": 256, "split_bytes": 128}),
        ("bf16", {"compression": "bf16"}),
        ("fp16", {"compression": "fp16"}),
        ("accumulated", None),
    ):
        with strategy.scope():
            optimizer = keras.optimizers.SGD(0.05)
            optimizer = optimizer if options is None else with_communication(optimizer, **options)
            model = _small(keras, optimizer)
        if name == "accumulated":
            accumulate_gradients(model, steps=2)
        model.set_weights(initial)
        history = model.fit(_dataset(x, y), epochs=1, verbose=0)
        results[name] = {
            "weights": _flat(model),
            "loss": history.history["loss"],
            "bytes": getattr(model.optimizer, "communication_bytes_per_step", None),
        }
    refused: dict[str, str] = {}
    with strategy.scope():
        for compression in ("powersgd", "topk"):
            try:
                with_communication(keras.optimizers.SGD(0.05), compression=compression)
            except tfdist.StrategyError as err:
                refused[compression] = f"{err.field}|{err}"
        own = _small(keras, keras.optimizers.SGD(0.05, gradient_accumulation_steps=2))
    try:
        own.fit(_dataset(x, y), epochs=1, verbose=0)
    except tfdist.StrategyError as err:
        refused["gradient_accumulation_steps"] = f"{err.field}|{err}"
    results["refused"] = refused
    return results


def _small(keras: Any, optimizer: Any) -> Any:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _epoch_starts(keras: Any) -> dict[str, list[list[int]]]:
    """The steps each epoch of a one-process fit numbers when its first epoch starts at step 3
    (``tfdist._compat.keras3_resume.start_epoch_at``) and its input, as a seeked pipeline's, holds the records
    from step 3 on in its first iteration (12 of 32 records, batches of 4): an input of unknown length (whose
    epoch Keras 3 sizes when it runs out), and an endless one with ``steps_per_epoch=8``."""
    import numpy as np
    import tensorflow as tf

    from tfdist._compat.keras3_resume import start_epoch_at

    def dataset(endless: bool) -> Any:
        iterations: list[int] = []

        def records() -> Any:
            first = 12 if not iterations else 0  # The first iteration starts where step 3 does.
            iterations.append(first)
            for i in range(first, 10**6 if endless else 32):
                yield np.float32([i]), np.float32([i])

        spec = (tf.TensorSpec((1,), tf.float32), tf.TensorSpec((1,), tf.float32))
        return tf.data.Dataset.from_generator(records, output_signature=spec).batch(4)

    return {
        name: _steps_of_fit(keras, dataset(endless), steps, start_epoch_at)
        for name, endless, steps in (("unknown_length", False, None), ("steps_per_epoch", True, 8))
    }


def _steps_of_fit(keras: Any, dataset: Any, steps: int | None, start_epoch_at: Any) -> list[list[int]]:
    """The steps each of 3 epochs numbers, the first started at step 3."""
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    steps_of: list[list[int]] = []

    class Record(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if epoch == 0:
                start_epoch_at(self.model, 3)
            steps_of.append([])

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            steps_of[-1].append(batch)

    model.fit(dataset, epochs=3, steps_per_epoch=steps, verbose=0, callbacks=[Record()])
    return steps_of
