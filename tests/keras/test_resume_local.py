"""ResumeInput in one process: a crash between two fits, the callback order, a changed order, finite epochs."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests.support import exact_tasks
from tfdist import keras
from tfdist.data import TFRecordPipeline
from tfdist.errors import DataError

FEATURES = {
    "id": tf.io.FixedLenFeature([], tf.int64),
    "x": tf.io.FixedLenFeature([exact_tasks.FEATURES_DIM], tf.float32),
    "y": tf.io.FixedLenFeature([], tf.float32),
}


class _Crash(Exception):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    prefix = str(tmp_path_factory.mktemp("local") / "part")
    exact_tasks.write_data(prefix)
    return prefix


def _model() -> Any:
    return exact_tasks.counted_model()


class _CrashAt(keras.callbacks.Callback):
    def __init__(self, epoch: int, batch: int) -> None:
        super().__init__()
        self.at, self.epoch = (epoch, batch), 0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if (self.epoch, batch) == self.at:
            raise _Crash


def _fit(data: str, backup: str, callbacks: list[Any], *, pipeline: TFRecordPipeline, **fit: Any) -> Any:
    model = _model()
    model.fit(pipeline.dataset(), epochs=3, verbose=0, callbacks=callbacks, **fit)
    return model


def _crash(data: str, backup: str, pipeline: TFRecordPipeline, at: tuple[int, int], **fit: Any) -> None:
    """A fit with BackupAndRestore (every 4 batches) and ResumeInput that crashes at (epoch, batch)."""
    callbacks = [
        keras.callbacks.BackupAndRestore(backup, save_freq=4),
        keras.ResumeInput(pipeline, backup_dir=backup),
        _CrashAt(*at),
    ]
    with pytest.raises(_Crash):
        _fit(data, backup, callbacks, pipeline=pipeline, **fit)


def _pipeline(data: str, **options: Any) -> TFRecordPipeline:
    return TFRecordPipeline(files=data + "-*", features=FEATURES, batch_size=24, shuffle_buffer=64, seed=3, **options)


@pytest.mark.parametrize(("num_epochs", "steps"), [(1, None), (None, 20)])
def test_a_crash_between_two_fits_trains_each_record_once_per_epoch(data, tmp_path: Path, num_epochs, steps) -> None:
    backup = str(tmp_path / "backup")
    _crash(data, backup, _pipeline(data, num_epochs=num_epochs), (1, 10), steps_per_epoch=steps)
    again = _pipeline(data, num_epochs=num_epochs)
    model = _fit(
        data,
        backup,
        [keras.callbacks.BackupAndRestore(backup, save_freq=4), keras.ResumeInput(again, backup_dir=backup)],
        pipeline=again,
        steps_per_epoch=steps,
    )
    assert collections.Counter(model.counts.numpy().tolist()) == {3.0: exact_tasks.RECORDS}
    assert again.cursor.position == keras.input_position(1, 8, epochs_per_iteration=num_epochs, steps_per_epoch=steps)


def test_preemption_safe_backup_takes_the_pipeline_and_a_finite_epoch_resumes(data, tmp_path: Path) -> None:
    backup = str(tmp_path / "backup")
    first = _pipeline(data)
    with pytest.raises(_Crash):
        _fit(
            data, backup, [keras.PreemptionSafeBackup(backup, save_freq=4, data=first), _CrashAt(2, 3)], pipeline=first
        )
    again = _pipeline(data)
    model = _fit(data, backup, [keras.PreemptionSafeBackup(backup, save_freq=4, data=again)], pipeline=again)
    assert collections.Counter(model.counts.numpy().tolist()) == {3.0: exact_tasks.RECORDS}
    # Without data= the backup still resumes a finite epoch (tf-keras alone fails with a TypeError there).
    plain = _pipeline(data)
    with pytest.raises(_Crash):
        _fit(data, backup, [keras.PreemptionSafeBackup(backup, save_freq=4), _CrashAt(1, 5)], pipeline=plain)
    _fit(data, backup, [keras.PreemptionSafeBackup(backup, save_freq=4)], pipeline=_pipeline(data))


def test_resume_input_before_the_backup_works_and_a_changed_order_stops_clearly(data, tmp_path: Path) -> None:
    backup = str(tmp_path / "backup")
    _crash(data, backup, _pipeline(data), (1, 2))
    changed = _pipeline(data, order_block=64)
    with pytest.raises(DataError, match="order_block 256 then, 64 now") as caught:
        _fit(
            data,
            backup,
            [keras.callbacks.BackupAndRestore(backup, save_freq=4), keras.ResumeInput(changed, backup_dir=backup)],
            pipeline=changed,
        )
    assert (caught.value.field, caught.value.value) == ("order_block", 64)
    # Before the backup callback in the list: linked all the same, when fit loads the restored counters.
    before = _pipeline(data)
    model = _fit(
        data,
        backup,
        [keras.ResumeInput(before), keras.callbacks.BackupAndRestore(backup, save_freq=4)],
        pipeline=before,
    )
    assert collections.Counter(model.counts.numpy().tolist()) == {3.0: exact_tasks.RECORDS}
    assert before.cursor.position == keras.input_position(1, 0, epochs_per_iteration=1, steps_per_epoch=None)
    with pytest.raises(DataError, match="`pipeline`. Received: 'list'"):
        keras.ResumeInput([])  # type: ignore[arg-type]  # A wrong type on purpose.


_EDGES = [240, 360, 440]  # Labels 0-3 by id: 240, 120, 80 and 40 records.


@pytest.fixture(scope="module")
def strata(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The counted records with a skewed label (240, 120, 80 and 40 records), written per class."""
    from tfdist.data import write_tfrecords

    prefix = str(tmp_path_factory.mktemp("strata") / "part")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(exact_tasks.RECORDS, exact_tasks.FEATURES_DIM)).astype("float32")
    y = x.sum(axis=1)

    def example(i: int) -> tf.train.Example:
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].tolist())),
            "y": tf.train.Feature(float_list=tf.train.FloatList(value=[float(y[i])])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(np.searchsorted(_EDGES, i, "right"))])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    write_tfrecords((example(i) for i in range(exact_tasks.RECORDS)), prefix, num_shards=2, partition_by="label")
    return prefix


@pytest.mark.parametrize("num_epochs", [1, None])
def test_stratified_draws_resume_as_if_nothing_happened(strata: str, tmp_path: Path, num_epochs) -> None:
    def pipeline(weights: str = "sqrt") -> TFRecordPipeline:
        return TFRecordPipeline(
            files=strata + "-*",
            features={**FEATURES, "label": tf.io.FixedLenFeature([], tf.int64)},
            batch_size=24,
            shuffle_buffer=64,
            seed=3,
            label_key="label",
            class_weights=weights,
            order="resumable",
            num_epochs=num_epochs,
        )

    steps = None if num_epochs == 1 else 20
    whole = _fit(strata, "", [], pipeline=pipeline(), steps_per_epoch=steps)
    backup = str(tmp_path / "backup")
    _crash(strata, backup, pipeline(), (1, 10), steps_per_epoch=steps)
    again = pipeline()
    model = _fit(
        strata,
        backup,
        [keras.callbacks.BackupAndRestore(backup, save_freq=4), keras.ResumeInput(again, backup_dir=backup)],
        pipeline=again,
        steps_per_epoch=steps,
    )
    counts = model.counts.numpy()
    assert counts.tolist() == whole.counts.numpy().tolist()  # The same draws: each record as often.
    assert counts.sum() == 3 * exact_tasks.RECORDS and counts[:240].sum() < 0.45 * counts.sum()  # Drawn by sqrt.
    assert counts.max() > 3  # The small classes were redrawn.
    for mine, theirs in zip(model.get_weights(), whole.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    assert again.cursor.position == keras.input_position(1, 8, epochs_per_iteration=num_epochs, steps_per_epoch=steps)
    other = pipeline("balanced")  # Another mix draws other records: the backup's resume stops and says why.
    with pytest.raises(DataError, match="class_weights .* then, .* now") as caught:
        _fit(
            strata,
            backup,
            [keras.callbacks.BackupAndRestore(backup), keras.ResumeInput(other, backup_dir=backup)],
            pipeline=other,
            steps_per_epoch=steps,
        )
    assert caught.value.field == "class_weights"


def test_stratified_draws_go_on_after_a_world_size_change_and_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Each input pipeline draws its own sequence: a backup of 3 pipelines resumed by 2 goes on in the
    # sequences of 2 (one warning), and the order file then records 2, so the next resume is exact again.
    import json

    from tfdist.data.order.epoch import ORDER_VERSION
    from tfdist.data.pipeline.state import InputState
    from tfdist.keras.resume import ORDER_FILE

    class Order:  # What a build tells the input's state of the order it reads: here only its fingerprint.
        def __init__(self, fingerprint: dict[str, Any]) -> None:
            self.fingerprint = lambda: fingerprint

    def check(fingerprint: dict[str, Any]) -> None:  # The pipeline now reads the order of `fingerprint`.
        state.reading(Order(fingerprint), None)
        resume._check_order(fingerprint)

    backup = tmp_path / "backup"
    backup.mkdir()
    now = {"stratified": ["0", "1"], "mix": [0.5, 0.5], "seed": 3, "pipelines": 2, "window": 64, "order": ORDER_VERSION}
    (backup / ORDER_FILE).write_text(json.dumps({**now, "pipelines": 3}))
    state = InputState(epochs_per_iteration=1)  # A TFRecordPipeline's, without the build.
    resume = keras.ResumeInput(state, backup_dir=str(backup))
    with caplog.at_level("WARNING", logger="tfdist.data"):  # The input explains the change itself.
        check(now)
        check(now)
    warned = [r.getMessage() for r in caplog.records if "input pipelines drawing by class_weights" in r.getMessage()]
    assert len(warned) == 1 and "made by 3 input pipelines" in warned[0] and "2 draw now" in warned[0], warned
    assert json.loads((backup / ORDER_FILE).read_text()) == now
    # Another world size and another option: the option's change stops the resume, naming it.
    with pytest.raises(DataError, match=r"class_weights \[0.5, 0.5\] then, \[0.25, 0.75\] now.*cluster 2 then") as err:
        check({**now, "pipelines": 4, "mix": [0.25, 0.75]})
    assert err.value.field == "class_weights"
    with pytest.raises(DataError, match=r"cluster 2 then, 4 now, shuffle_buffer 64 then") as err:
        check({**now, "pipelines": 4, "window": 32})
    assert err.value.field == "cluster"
