"""What the Slurm jobs of tests/launch/emit/test_slurm_cluster.py run (each task imports this file by path).

A Slurm job runs in its own directory with a bare environment, where the ``tests`` package cannot be
imported: the task bodies and data other tests share are loaded from tests/support by path.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "support")


def _support(name: str) -> Any:
    """The module tests/support/NAME.py, loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"_support_{name}", os.path.join(SUPPORT, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_result(root: str, value: dict[str, Any]) -> None:
    """Writes ``value`` (plus this task's identity) to ``root/result-TASK-RESTART.json``."""
    import json
    import os
    import time

    task, restart = os.environ["TFDIST_TASK"], os.environ.get("TFDIST_RESTART", "0")
    env = {
        k: os.environ.get(k)
        for k in (
            "TF_CONFIG",
            "TF_CPP_MIN_LOG_LEVEL",
            "TF_USE_LEGACY_KERAS",
            "SLURM_PROCID",
            "SLURM_STEP_ID",
            "SLURM_JOB_ID",
        )
    }
    path = os.path.join(root, f"result-{task.replace(':', '-')}-{restart}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(dict(value, task=task, restart=int(restart), env=env, end=time.time()), f)
    os.replace(path + ".tmp", path)


def slurm_mwms(root: str, epochs: int, crash_epoch: int = -1) -> dict[str, Any]:
    """MWMS fit under Slurm: BackupAndRestore + ckpt-{epoch} in ``root``; worker:1 may crash once.

    The evaluator task runs the side-car on the checkpoints instead. Results go to files in ``root``.
    """
    import os

    import tfdist
    from tfdist import keras

    shared = _support("cluster_tasks")
    spec = tfdist.ClusterSpec.from_tf_config()
    if spec.task_type == "evaluator":
        keras.utils.set_random_seed(1)
        model = shared._small_model(keras)
        keras.sidecar_evaluate(
            model, shared._regression_dataset(), checkpoint_dir=os.path.join(root, "ckpt"), epochs=epochs
        )
        _write_result(root, {"evaluated": True})
        return {}
    strategy = tfdist.build_strategy("auto", communication="ring")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = shared._small_model(keras)
    begun: list[int] = []
    marker = os.path.join(root, "crashed")

    def _epoch_end(epoch: int, logs: Any) -> None:
        if spec.task_type == "worker" and spec.task_id == 1 and epoch == crash_epoch and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)

    callbacks = keras.cluster_callbacks(
        backup_dir=os.path.join(root, "backup"), checkpoint_dir=os.path.join(root, "ckpt")
    )
    callbacks.append(
        keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: begun.append(epoch), on_epoch_end=_epoch_end)
    )
    model.fit(shared._regression_dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    _write_result(
        root,
        {
            "epochs_begun": begun,
            "weights": shared._flat_weights(model).tolist(),
            "replicas": strategy.num_replicas_in_sync,
        },
    )
    return {}


def slurm_ps(root: str) -> dict[str, Any]:
    """The parameter-server fit on the chief; records when the coordinator finished."""
    result = _support("cluster_tasks").ps_fit(epochs=2, steps=5)
    _write_result(root, {"is_ps": result["is_ps"], "loss": result["loss"]})
    return {}


def slurm_elastic(root: str, epochs: int, pause_epoch: int, pause_batch: int) -> dict[str, Any]:
    """Elastic MWMS fit under Slurm, counted: records what each membership saw in ``root``.

    The fit is tests/support/exact_tasks.py's: 480 records in ``root/data/part-*`` (the test writes them),
    global batch 24, a ``counts`` weight the backup restores with the model, ``BackupAndRestore`` every 4
    batches with ``ResumeInput``. In membership 0 (before any requeue) every task stops after batch
    ``pause_batch`` of epoch ``pause_epoch`` (mid-epoch, after a backup): worker 0 writes ``root/paused`` (the
    test's trigger to fail the node) and all wait there to be killed by Slurm.
    """
    import json
    import logging
    import os
    import time

    import tensorflow as tf

    import tfdist
    from tfdist import keras
    from tfdist.keras import elastic

    exact = _support("exact_tasks")
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)  # "Input resumes at ..." is what the test looks for.
    task, generation = os.environ["TFDIST_TASK"], elastic.membership()
    strategy = tfdist.build_strategy("auto", communication="ring")
    keras.utils.set_random_seed(1)
    tf.config.experimental.enable_op_determinism()
    with strategy.scope():
        model = exact.counted_model()
    record: dict[str, Any] = {
        "task": task,
        "generation": generation,
        "world_size": elastic.world_size(),
        "replicas": strategy.num_replicas_in_sync,
        "slurm_restart": os.environ.get("SLURM_RESTART_COUNT"),
        "per_replica_batch": keras.per_replica_batch(exact.GLOBAL_BATCH, strategy.num_replicas_in_sync),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "epochs_begun": [],
        "steps": {},
        "logged_world_size": [],
    }
    path = os.path.join(root, f"elastic-{task.replace(':', '-')}-g{generation}.json")

    def _save() -> None:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    def _epoch_end(epoch: int, logs: Any) -> None:
        record["logged_world_size"].append(logs.get("world_size"))
        _save()

    def _batch_end(batch: int, logs: Any) -> None:
        epoch = record["epochs_begun"][-1]
        record["steps"][str(epoch)] = record["steps"].get(str(epoch), 0) + 1
        if generation == 0 and (epoch, batch) == (pause_epoch, pause_batch):
            _save()
            if task == "worker:0":
                open(os.path.join(root, "paused"), "w").close()
            time.sleep(300)  # Slurm kills this task when the test fails the node; never reached in a passing run.
            os._exit(4)

    pipeline = exact.pipeline(os.path.join(root, "data", "part-*"))
    backup_dir = os.path.join(root, "backup")
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir, save_freq=4),
        keras.ResumeInput(pipeline, backup_dir=backup_dir),
        keras.ElasticEpochs(),
        keras.callbacks.LambdaCallback(
            on_epoch_begin=lambda epoch, logs: record["epochs_begun"].append(epoch),
            on_train_batch_end=_batch_end,
            on_epoch_end=_epoch_end,
        ),
    ]
    _save()
    history = model.fit(pipeline.dataset(), epochs=epochs, verbose=0, callbacks=callbacks)
    record.update(
        done=True,
        loss=history.history["loss"],
        weights=[float(v) for w in model.dense.weights for v in w.numpy().ravel()],
        counts=[int(c) for c in model.counts.numpy()],
    )
    _save()
    return {}
