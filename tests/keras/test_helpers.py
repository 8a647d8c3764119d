"""Keras helpers without a cluster: straggler naming, pipeline slots, fit_input errors."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from tfdist import ClusterSpec, StrategyError
from tfdist.data.pipeline import _context


def test_chief_names_the_slow_worker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tfdist.keras.cluster_aware import ThroughputLogger

    spec = ClusterSpec.local(workers=3).with_task("worker", 0)
    report_dir = str(tmp_path)
    for worker, step_s in ((1, 0.010), (2, 0.031)):
        with open(os.path.join(report_dir, f"throughput-worker-{worker}-epoch0.json"), "w") as f:
            json.dump({"task": f"worker:{worker}", "epoch": 0, "step_s": step_s}, f)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TF_CONFIG", json.dumps(spec.to_tf_config()))
        logger = ThroughputLogger(64, report_dir=report_dir)
    logger._steps = [0.011] * 5
    with caplog.at_level(logging.WARNING, logger="tfdist.keras"):
        logger.on_epoch_end(0)
    warnings = [
        r.getMessage() for r in caplog.records if r.name.startswith("tfdist.keras") and r.levelno >= logging.WARNING
    ]
    assert logger.stragglers == [["worker:2"]]
    assert warnings, "ThroughputLogger logged no warning"
    assert "stragglers" in warnings[0]
    assert logger.history[0]["examples_per_s"] == pytest.approx(64 / 0.011, abs=0.5e-3)


def test_collective_clusters_split_by_tf_config_and_ps_clusters_do_not() -> None:
    mwms = ClusterSpec.local(workers=2, chief=True)
    ps = ClusterSpec.local(workers=2, ps=1, chief=True)
    cases = [
        (mwms.to_tf_config("chief", 0), (0, 3)),
        (mwms.to_tf_config("worker", 1), (2, 3)),
        (ps.to_tf_config("chief", 0), (0, 1)),
        (None, (0, 1)),
    ]
    for config, expected in cases:
        with pytest.MonkeyPatch.context() as patch:
            if config is None:
                patch.delenv("TF_CONFIG", raising=False)
            else:
                patch.setenv("TF_CONFIG", json.dumps(config))
            where = _context.slot(None, 64)
        assert (where.index, where.count, where.batch_size, where.per_replica) == (*expected, 64, False)


def test_dataset_function_under_mirrored_needs_steps() -> None:
    import tensorflow as tf

    from tfdist.keras import fit_input

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with pytest.raises(StrategyError, match="Keras cannot size an epoch of a distributed dataset"):
        fit_input(lambda ctx: tf.data.Dataset.range(4).batch(2), strategy=strategy)
    dataset = fit_input(lambda ctx: tf.data.Dataset.range(4).batch(2), strategy=strategy, steps_per_epoch=2)
    assert isinstance(dataset, tf.distribute.DistributedDataset)


def test_default_strategy_gets_the_plain_dataset() -> None:
    import tensorflow as tf

    from tfdist.keras import fit_input

    dataset = fit_input(lambda ctx: tf.data.Dataset.range(4).batch(ctx.get_per_replica_batch_size(2)))
    assert [list(b.numpy()) for b in dataset] == [[0, 1], [2, 3]]


def test_linear_scaling_needs_a_finite_rate() -> None:
    import math

    from tfdist.keras.elastic import LinearScaling

    bad: Any  # Hostile values of several types.
    for bad in (math.nan, math.inf, 0, -0.1, True, "0.1"):
        with pytest.raises(StrategyError, match="`base_learning_rate`"):
            LinearScaling(bad, reference_world_size=2)
    assert LinearScaling(0.1, reference_world_size=2).base_learning_rate == 0.1


def test_elastic_epochs_records_each_boundary_after_every_callback_of_its_epoch(tmp_path: Path) -> None:
    # A real one-process fit: the boundary of epoch e appears only once the callbacks after ElasticEpochs have
    # run (the launcher restarts the group as soon as it reads one), the last one is marked last, an early stop
    # is marked last too, and the leader announces itself as fit begins.
    import numpy as np

    from tfdist import keras
    from tfdist.cluster import elastic
    from tfdist.keras import ElasticEpochs

    directory = str(tmp_path)
    seen_at_epoch_end: list[list[str]] = []

    def _boundaries() -> list[str]:
        return sorted(n for n in os.listdir(directory) if n.startswith("epoch-"))

    env = {elastic.ELASTIC_DIR_VAR: directory, elastic.MEMBERSHIP_VAR: "3", elastic.WORLD_SIZE_VAR: "2"}
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    later = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen_at_epoch_end.append(_boundaries()))
    history = model.fit(x, y, epochs=3, verbose=0, callbacks=[ElasticEpochs(env=env), later])
    assert seen_at_epoch_end == [
        [],
        ["epoch-g0003-e000000.json"],
        ["epoch-g0003-e000000.json", "epoch-g0003-e000001.json"],
    ]
    records = elastic.read_boundaries(directory, set())
    assert [(r["generation"], r["epoch"], r["world_size"], r.get("last", False)) for r in records] == [
        (3, 0, 2, False),
        (3, 1, 2, False),
        (3, 2, 2, True),
    ]
    assert elastic.announced(directory) and os.path.exists(os.path.join(directory, "leader-g0003.json"))
    assert history.history["world_size"] == [2.0, 2.0, 2.0]

    stopped = str(tmp_path / "early")
    os.makedirs(stopped)
    stop = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: setattr(model, "stop_training", epoch == 1))
    env[elastic.ELASTIC_DIR_VAR] = stopped
    model.fit(x, y, epochs=5, verbose=0, callbacks=[ElasticEpochs(env=env), stop])
    records = elastic.read_boundaries(stopped, set())
    assert [(r["epoch"], r.get("last", False)) for r in records] == [(0, False), (1, True)]


def test_cluster_callbacks_and_resume_input_given_a_keras3_model_name_what_works_with_it(tmp_path: Path) -> None:
    """(issue 51) cluster_callbacks' callbacks and ResumeInput are tf-keras callbacks: Keras 3's fit hands them its
    model, and each raises a StrategyError naming what a Keras 3 model uses instead (not tf-keras' AttributeError)
    before anything is written. A tf-keras model trains with the same callbacks, and they write."""
    import keras as keras3
    import numpy as np

    from tests.support import exact_tasks
    from tfdist import keras

    dirs = {name: str(tmp_path / name) for name in ("backup", "ckpt", "tb")}
    callbacks = keras.cluster_callbacks(
        backup_dir=dirs["backup"], checkpoint_dir=dirs["ckpt"], tensorboard_dir=dirs["tb"]
    )
    assert [type(c).__name__ for c in callbacks] == ["BackupAndRestore", "ModelCheckpoint", "TensorBoard"]
    exact_tasks.write_data(str(tmp_path / "part"))
    resume = keras.ResumeInput(exact_tasks.pipeline(str(tmp_path / "part-*")), backup_dir=dirs["backup"])
    instead = "tfdist.keras.PreemptionSafeBackup(backup_dir, save_freq=..., data=pipeline)"
    own = (
        "With a Keras 3 model, pass Keras 3's own keras.callbacks.BackupAndRestore, ModelCheckpoint and TensorBoard "
        f"(under a strategy of tfdist.build_strategy they write from the chief only) and {instead}, instead of "
        "cluster_callbacks."
    )
    refusals = [
        *((c, f"{type(c).__name__} of cluster_callbacks(...)", own) for c in callbacks),
        (resume, "ResumeInput", f"With a Keras 3 model use {instead}, whose backups carry the input position."),
    ]
    model = keras3.Sequential([keras3.Input((2,)), keras3.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    for callback, name, hint in refusals:
        with pytest.raises(StrategyError) as err:
            model.fit(x, y, epochs=1, verbose=0, callbacks=[callback])
        text = str(err.value)
        assert f"tfdist's {name} is a tf-keras callback, and the model is a keras." in text, text
        assert f"(Keras 3, keras {keras3.__version__})" in text and text.endswith(hint), text
        assert (err.value.field, err.value.fix) == ("model", "from tfdist import keras")
    assert not [d for d in dirs.values() if os.path.exists(d)]  # Refused before anything was written.
    tf_keras_model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    tf_keras_model.compile(optimizer="sgd", loss="mse")
    tf_keras_model.fit(x, y, epochs=2, verbose=0, callbacks=callbacks)
    assert {"ckpt-1.index", "ckpt-2.index"} <= set(os.listdir(dirs["ckpt"])) and os.listdir(dirs["tb"])
