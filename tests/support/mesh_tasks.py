"""Model-parallel training on a DTensor mesh, and the one-process reference it must equal.

``mesh_fit`` runs in every task of ``tfdist-launch --mesh`` (through ``tfdist.testing.run_cluster``);
``reference_fit`` replays the same weights and batches with plain tf-keras in one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

VOCAB, TOKENS, CLASSES, RECORDS, BATCH = 64, 8, 4, 512, 32
MIN_ELEMENTS = 1024  # Small enough that the test model's embedding and hidden Dense pair are split.


def write_records(directory: str) -> str:
    """512 examples (tokens int64[8], label = first token mod 4, id) in 4 files; returns the file pattern."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data import write_tfrecords

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(RECORDS, TOKENS))

    def example(i: int) -> Any:
        feature = {
            "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens[i].tolist())),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(tokens[i, 0] % CLASSES)])),
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    write_tfrecords((example(i) for i in range(RECORDS)), os.path.join(directory, "tokens"), num_shards=4)
    return os.path.join(directory, "tokens-*")


def pipeline(files: str, *, with_id: bool = False, num_epochs: int | None = 3) -> Any:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    features = {
        "tokens": tf.io.FixedLenFeature([TOKENS], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    if with_id:
        return TFRecordPipeline(files=files, batch_size=BATCH, features=features, num_epochs=1, drop_remainder=True)

    def parse(record: Any) -> Any:
        example = tf.io.parse_single_example(record, features)
        return example["tokens"], example["label"]

    return TFRecordPipeline(
        files=files,
        batch_size=BATCH,
        parse_fn=parse,
        num_epochs=num_epochs,
        shuffle_buffer=64,
        seed=3,
        drop_remainder=True,
    )


def build_model() -> Any:
    import tf_keras

    tf_keras.utils.set_random_seed(0)
    inputs = tf_keras.Input((TOKENS,), dtype="int64", name="mp_tokens")
    x = tf_keras.layers.Embedding(VOCAB, 32, name="mp_embed")(inputs)
    x = tf_keras.layers.Flatten(name="mp_flat")(x)
    x = tf_keras.layers.Dense(128, activation="relu", name="mp_up")(x)
    x = tf_keras.layers.Dense(64, activation="relu", name="mp_down")(x)
    outputs = tf_keras.layers.Dense(CLASSES, name="mp_out")(x)
    return tf_keras.Model(inputs, outputs, name="mp_model")


def mesh_fit(files: str, steps: int, workdir: str) -> dict[str, Any]:
    """Trains ``steps`` steps on this launch's mesh; returns losses, layouts, bytes and the ids each step saw."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from tensorflow.experimental import dtensor

    from tfdist import keras as tk
    from tfdist.errors import StrategyError
    from tfdist.parallel import build_mesh

    mesh = build_mesh()
    model = tk.shard_model(build_model, mesh, min_elements=MIN_ELEMENTS)
    full = {v.name: _full(v, mesh, dtensor).tolist() for v in model.trainable_variables}
    if os.environ.get("DTENSOR_CLIENT_ID", "0") == "0":
        with open(os.path.join(workdir, "init.json"), "w") as f:
            json.dump(full, f)
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=tk.mesh_optimizer("adam", mesh, learning_rate=1e-2), loss=loss)
    history = model.fit(tk.fit_input(pipeline(files), mesh=mesh), epochs=steps, steps_per_epoch=1, verbose=0)
    report = tk.sharding_report(model)
    ids, local_ids = [], []
    batches = iter(tk.fit_input(pipeline(files, with_id=True), mesh=mesh))
    for _ in range(RECORDS // BATCH):  # Not to the end: an end of input cancels a multi-client context.
        batch = next(batches)["id"]
        ids.append(sorted(int(i) for i in _full(batch, mesh, dtensor)))
        local_ids.append(sorted({int(i) for c in dtensor.unpack(batch) for i in c.numpy()}))
    final = {v.name: _full(v, mesh, dtensor) for v in model.trainable_variables}
    model.save_weights(os.path.join(workdir, "weights", "ckpt"))  # TF format: the same path on every process.
    model.save(os.path.join(workdir, "saved_model"))  # A SavedModel: its variables merged as the weights are.
    if os.environ.get("DTENSOR_CLIENT_ID", "0") == "0":
        np.savez(os.path.join(workdir, "final.npz"), **{k.replace("/", "|"): v for k, v in final.items()})
    refusals = {}
    tokens = np.zeros((BATCH, TOKENS), "int64")
    attempts = {
        "fit_numpy": lambda: model.fit(tokens, np.zeros(BATCH, "int64"), verbose=0),
        "evaluate_dataset": lambda: model.evaluate(tf.data.Dataset.from_tensors((tokens, tokens[:, 0]))),
        "save_keras": lambda: model.save(os.path.join(workdir, "m.keras")),
        "save_weights_h5": lambda: model.save_weights(os.path.join(workdir, "w.h5")),
        "powersgd": lambda: tk.with_communication(tf_keras.optimizers.SGD(0.1), compression="powersgd"),
        "topk_mesh_optimizer": lambda: tk.with_communication(tk.mesh_optimizer("sgd", mesh), compression="topk"),
        "local_sgd": lambda: tk.local_sgd(model, period=4),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            refusals[name] = "not refused"
        except StrategyError as err:
            refusals[name] = f"{err.field}: {err}"
    value = {
        "refusals": refusals,
        "mesh": [list(mesh.dim_names), list(mesh.shape())],
        "local_devices": len(mesh.local_device_ids()),
        "losses": [float(x) for x in history.history["loss"]],
        "layouts": {s.name: list(s.specs) for s in report.shards if not s.optimizer},
        "bytes": [[s.name, s.global_bytes, s.local_bytes, list(s.specs), s.optimizer] for s in report.shards],
        "local_bytes": report.local_bytes,
        "global_bytes": report.global_bytes,
        "ids": ids,
        "local_ids": local_ids,
        "final": {k: float(np.abs(v).sum()) for k, v in final.items()},
    }
    # Also as a file: Slurm merges the tasks' output, and a line over 4 KB (this one) may arrive cut into
    # another task's (the Slurm mesh test reads these files).
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task")
    if task:
        with open(os.path.join(workdir, f"mesh-result-{task['type']}-{task['index']}.json"), "w") as out:
            json.dump(value, out)
    return value


def _full(variable: Any, mesh: Any, dtensor: Any) -> Any:
    import tensorflow as tf

    replicated = dtensor.Layout.replicated(mesh, rank=len(variable.shape))
    return dtensor.unpack(dtensor.relayout(tf.convert_to_tensor(variable), replicated))[0].numpy()


def reference_losses(files: str, steps: int, workdir: str | Path, replicas: int = 1) -> list[float]:
    """``reference_fit``'s per-step losses, from a fresh process (no TF_CONFIG, no DTensor client).

    ``workdir`` is the mesh run's: client 0 wrote the initial weights there (``init.json``).
    """
    code = (
        "import json, sys; from tests.support import mesh_tasks; "
        f"print(json.dumps(mesh_tasks.reference_fit({files!r}, {steps}, {str(workdir)!r}, {replicas})))"
    )
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["losses"]
    return losses


def reference_fit(files: str, steps: int, workdir: str, replicas: int = 1) -> dict[str, Any]:
    """The same model, weights, optimizer and batches in one process without DTensor.

    The mesh's global batch is ``replicas`` consecutive per-replica batches of the pipeline, joined.
    """
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from tfdist.keras.parallel.mesh_input import replica_batches

    class DenseAdam(tf_keras.optimizers.Adam):
        def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            dense = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v) for g, v in grads_and_vars]
            return super().apply_gradients(dense, *args, **kwargs)

    model = build_model()
    with open(os.path.join(workdir, "init.json")) as f:
        init = json.load(f)
    for variable in model.trainable_variables:
        variable.assign(np.array(init[variable.name], dtype="float32"))
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=DenseAdam(learning_rate=1e-2), loss=loss)
    batches = replica_batches(pipeline(files), replicas)
    history = model.fit(batches, epochs=steps, steps_per_epoch=1, verbose=0)
    final = {v.name: float(np.abs(v.numpy()).sum()) for v in model.trainable_variables}
    return {"losses": [float(x) for x in history.history["loss"]], "final": final}


def mesh_backup_fit(files: str, steps: int, workdir: str) -> dict[str, Any]:
    """``mesh_fit``'s training with BackupAndRestore and ResumeInput: killed mid-run, it goes on from the backup.

    Prints ``MESH STEP k`` after step k's backup is written (the fault tests' trigger). Returns the loss of
    each step this attempt trained, by step.
    """
    import sys

    import tf_keras

    from tfdist import keras as tk
    from tfdist.parallel import build_mesh

    mesh = build_mesh()
    model = tk.shard_model(build_model, mesh, min_elements=MIN_ELEMENTS)
    init = {v.name: _full(v, mesh, _dtensor()).tolist() for v in model.trainable_variables}  # Every client: collective.
    if os.environ.get("DTENSOR_CLIENT_ID", "0") == "0" and not os.path.exists(os.path.join(workdir, "init.json")):
        with open(os.path.join(workdir, "init.json"), "w") as f:
            json.dump(init, f)
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=tk.mesh_optimizer("adam", mesh, learning_rate=1e-2), loss=loss)
    data = pipeline(files, num_epochs=None)
    losses: dict[int, float] = {}

    class Steps(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            losses[epoch] = float(logs["loss"])
            sys.stdout.write(f"MESH STEP {epoch + 1}\n")
            sys.stdout.flush()

    backup = os.path.join(workdir, "backup")
    callbacks = [tf_keras.callbacks.BackupAndRestore(backup), tk.ResumeInput(data, backup_dir=backup), Steps()]
    model.fit(tk.fit_input(data, mesh=mesh), epochs=steps, steps_per_epoch=1, verbose=0, callbacks=callbacks)
    return {"losses": losses, "restart": int(os.environ.get("TFDIST_RESTART", "0"))}


def _dtensor() -> Any:
    from tensorflow.experimental import dtensor

    return dtensor


def mesh_load(source: str) -> dict[str, Any]:
    """Loads ``mesh_fit``'s saved weights (from another mesh shape) on this launch's mesh; the largest difference."""
    import numpy as np

    from tfdist import keras as tk
    from tfdist.parallel import build_mesh

    mesh = build_mesh()
    model = tk.shard_model(build_model, mesh, min_elements=MIN_ELEMENTS)
    model.load_weights(os.path.join(source, "weights", "ckpt")).assert_existing_objects_matched()
    saved = np.load(os.path.join(source, "final.npz"))
    dtensor = _dtensor()
    diffs = {
        v.name: float(np.abs(_full(v, mesh, dtensor) - saved[v.name.replace("/", "|")]).max())
        for v in model.trainable_variables
    }
    layouts = {v.name: list(dtensor.fetch_layout(v).sharding_specs) for v in model.trainable_variables}
    return {"mesh": [list(mesh.dim_names), list(mesh.shape())], "diffs": diffs, "layouts": layouts}


def _counting_model() -> Any:
    """``build_model``'s network in a model whose train_step counts every record it trains on, by id."""
    import tensorflow as tf
    import tf_keras

    class Counting(tf_keras.Model):
        counts: Any = None

        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(y, self(x["tokens"], training=True))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
            self.counts.assign_add(tf.reduce_sum(tf.one_hot(x["id"], RECORDS), axis=0))
            return {"loss": loss}

    plain = build_model()
    return Counting(plain.inputs, plain.outputs, name="mp_counting")


def mesh_count_fit(files: str, epochs: int) -> dict[str, Any]:
    """Trains ``epochs`` epochs on this launch's mesh, counting each record in a variable; returns the counts."""
    import tensorflow as tf
    import tf_keras

    from tfdist import keras as tk
    from tfdist.data import TFRecordPipeline
    from tfdist.parallel import build_mesh

    mesh = build_mesh()
    dtensor = _dtensor()
    model = tk.shard_model(_counting_model, mesh, min_elements=MIN_ELEMENTS)
    model.counts = dtensor.DVariable(
        dtensor.call_with_layout(tf.zeros, dtensor.Layout.replicated(mesh, 1), [RECORDS]), trainable=False
    )
    loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=tk.mesh_optimizer("adam", mesh, learning_rate=1e-2), loss=loss)
    features = {
        "tokens": tf.io.FixedLenFeature([TOKENS], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    data = TFRecordPipeline(
        files=files,
        batch_size=BATCH,
        features=features,
        label_key="label",
        as_supervised=True,
        num_epochs=None,
        shuffle_buffer=64,
        seed=5,
        drop_remainder=True,
    )
    model.fit(tk.fit_input(data, mesh=mesh), epochs=epochs, steps_per_epoch=RECORDS // BATCH, verbose=0)
    return {"counts": [int(c) for c in _full(model.counts, mesh, dtensor)]}
