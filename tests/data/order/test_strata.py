"""Stratified draws under order='resumable': the graph draws what NumPy counts, and a resume replays the draws."""

from __future__ import annotations

import collections
import logging
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfdist import _compat
from tfdist.cluster.spec import ClusterSpec
from tfdist.data import DataPosition, TFRecordPipeline, write_tfrecords
from tfdist.data.order.strata import class_draws, draw_counts, graph_draws, thresholds
from tfdist.errors import DataError

LABELS = [0] * 200 + [1] * 100 + [2] * 50 + [3] * 25  # 375 records, skewed 8:4:2:1.
SPEC = {"id": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64)}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("strata") / "part")

    def example(i: int, label: int) -> tf.train.Example:
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        return tf.train.Example(features=tf.train.Features(feature=feature))

    write_tfrecords((example(i, y) for i, y in enumerate(LABELS)), out, num_shards=3, partition_by="label")
    return out


def _pipeline(prefix: str, **options: object) -> TFRecordPipeline:
    kwargs: dict = dict(
        files=prefix + "-*",
        features=SPEC,
        batch_size=25,
        label_key="label",
        class_weights="balanced",
        seed=3,
        shuffle_buffer=32,
        order="resumable",
    )
    kwargs.update(options)
    return TFRecordPipeline(**kwargs)


def _ids(dataset: tf.data.Dataset, steps: int | None = None) -> list[list[int]]:
    return [b["id"].numpy().tolist() for b in (dataset.take(steps) if steps is not None else dataset)]


def test_the_graph_draws_what_numpy_counts_and_the_mix_holds() -> None:
    mix = [0.5, 0.0, 0.3, 0.2]
    for worker, start in ((0, 0), (1, 12345), (3, (1 << 40) + 7)):
        graph = [int(c) for c in graph_draws(mix, seed=9, worker=worker, start=tf.constant(start, tf.int64)).take(3000)]
        assert graph == class_draws(mix, seed=9, worker=worker, start=start, count=3000).tolist()
    draws = class_draws(mix, seed=9, worker=0, start=0, count=200_000)
    share = np.bincount(draws, minlength=4) / len(draws)
    assert share[1] == 0 and np.abs(share - mix).max() < 0.005
    assert draw_counts(mix, seed=9, worker=0, upto=200_000).tolist() == np.bincount(draws, minlength=4).tolist()
    assert class_draws(mix, seed=9, worker=1, start=0, count=50).tolist() != draws[:50].tolist()  # Per pipeline.
    assert thresholds([0.0, 1.0]).tolist() == [0]  # A leading class of weight 0 is never drawn.


@pytest.mark.parametrize("num_epochs", [None, 1])
def test_a_resume_replays_the_same_draws(prefix: str, num_epochs: int | None) -> None:
    whole = _pipeline(prefix, num_epochs=num_epochs)
    assert whole.steps_per_epoch() is None
    dataset = whole.dataset()
    assert whole.steps_per_epoch() == 15  # 375 draws of 25.
    # The draws and the class readers (all but the parse map) are instantiated on one device (BENCHMARKS.md).
    marked = _compat.marked_single_device(dataset)
    ours = {k: v for k, v in marked.items() if "_parse_batch" not in k}
    assert any("draws" in k for k in ours) and set(ours.values()) == {True}, marked
    batches = _ids(dataset, 40)
    if num_epochs == 1:
        assert len(batches) == 15
        batches += _ids(dataset) + _ids(dataset)  # Each iteration is the next epoch of draws.
        assert len(batches) == 45 and batches[:15] != batches[15:30]
    labels = collections.Counter(LABELS[i] for batch in batches for i in batch)
    assert all(abs(labels[c] / sum(labels.values()) - 0.25) < 0.05 for c in range(4)), labels  # Balanced.
    assert collections.Counter(i for batch in batches[:15] for i in batch).most_common(1)[0][1] > 1  # Redrawn.
    whole.start_at(DataPosition(epoch=0, step=7))  # Back to an earlier position: counted again from draw 0.
    assert _ids(dataset, 8) == batches[7:15]
    for step in (0, 7, 15, 16, 33):
        resumed = _pipeline(prefix, num_epochs=num_epochs)
        epoch, at = (0, step) if num_epochs is None else divmod(step, 15)
        resumed.start_at(DataPosition(epoch=epoch, step=at))
        dataset = resumed.dataset()
        got = _ids(dataset, 40 - step) if num_epochs is None else _ids(dataset) + _ids(dataset)
        assert got[: len(batches) - step] == batches[step:][: len(got)], step
        assert len(got) >= 15 - at


def test_two_pipelines_draw_their_own_shares_and_a_changed_world_size_is_a_changed_order(prefix: str) -> None:
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    pipes = [_pipeline(prefix, num_epochs=None, batch_size=24) for _ in range(2)]
    firsts = []
    for index, pipe in enumerate(pipes):
        spec = ClusterSpec.from_tf_config({"cluster": cluster, "task": {"type": "worker", "index": index}})
        # model.fit takes global batches of 24 from each worker's dataset and trains 12 of them a step.
        firsts.append([i for batch in _ids(pipe.dataset(cluster=spec), 20) for i in batch])
        resumed = _pipeline(prefix, num_epochs=None, batch_size=24)
        resumed.start_at(DataPosition(epoch=0, step=9))  # 9 steps of 12 draws trained.
        again = [i for batch in _ids(resumed.dataset(cluster=spec), 10) for i in batch]
        assert again == firsts[-1][9 * 12 :][: len(again)] and len(again) >= 200
    assert firsts[0] != firsts[1]
    alone = _pipeline(prefix, num_epochs=None, batch_size=24)
    alone.dataset()
    assert pipes[0].fingerprint() != alone.fingerprint()  # 2 streams then, 1 now.
    many = {"worker": [f"127.0.0.1:{port}" for port in range(1, 31)]}  # 30 pipelines, class 3 has 25 records.
    spec = ClusterSpec.from_tf_config({"cluster": many, "task": {"type": "worker", "index": 0}})
    with pytest.raises(DataError, match="class '3' has 25"):
        _pipeline(prefix, num_epochs=None, batch_size=30).dataset(cluster=spec)


def test_natural_reads_each_record_once_and_what_cannot_replay_is_named(prefix: str, caplog) -> None:
    natural = _pipeline(prefix, class_weights="natural", shuffle_buffer=16)
    ids = [i for batch in _ids(natural.dataset()) for i in batch]
    assert sorted(ids) == list(range(len(LABELS)))  # The plain resumable order: each record once.
    variable = tf.Variable([1.0, 1.0, 1.0, 1.0])
    with pytest.raises(DataError, match="`class_weights`. Received: 'a tf.Variable'"):
        _pipeline(prefix, class_weights=variable).dataset()
    with caplog.at_level(logging.INFO, logger="tfdist.data"):
        _pipeline(prefix, order="auto").dataset()
    assert "order='resumable' replays it" in caplog.text


def test_class_weights_without_class_groups_cannot_replay(tmp_path: Path) -> None:
    plain = str(tmp_path / "plain")
    write_tfrecords(
        (
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
                    }
                )
            )
            for i in range(40)
        ),
        plain,
        num_shards=2,
    )
    with pytest.raises(DataError, match="without class groups"):
        _pipeline(plain).dataset()
