"""Recommendation workload: click generator, hash sharding by user, embedding layout, PS training with a kill."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.processes import assert_all_gone
from tfdist import testing
from tfdist.plan import PlanError, embedding_traffic

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--users", "3000", "--items", "400", "--events", "60000", "--shards", "4"]


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make_clicks(out: str) -> dict[str, Any]:
    done = testing.run_python(
        [sys.executable, str(REPO / "scripts" / "make_synthetic_clicks.py"), "--out", out, *SMALL], timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(Path(out, "clicks.json").read_text())


def test_hot_cold_split_and_one_eval_event_per_user() -> None:
    gen = _script("make_synthetic_clicks")
    data = gen.generate(users=1000, items=100, events=40000, hot_fraction=0.3, hot_share=0.85, item_zipf=1.0, seed=0)
    assert data["n_hot"] == 300
    hot_share = data["hot"].mean()
    assert hot_share == pytest.approx(0.85, abs=0.03)
    assert np.bincount(data["user"][data["is_eval"]], minlength=1000).tolist() == [1] * 1000
    assert np.all(np.bincount(data["user"], minlength=1000) >= 2)
    items = np.bincount(data["item"], minlength=100)
    assert items[0] > 5 * items[50]  # Zipf popularity.
    assert 0.2 < data["label"].mean() < 0.6


def test_train_recsys_runs_without_data(tmp_path: Path) -> None:
    # Issue 11: `tfdist-launch --chief --workers 2 --ps 2 -- python scripts/train_recsys.py` runs as it is: the
    # chief writes the synthetic logs to recsys-out/clicks, or reuses them when they are already there.
    train = _script("train_recsys")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        gen = _script("make_synthetic_clicks")
        summary = gen.write_dataset(train.DEFAULT_DATA, users=500, items=50, events=4000, shards=2)
        assert json.loads(Path(train.DEFAULT_DATA, "clicks.json").read_text()) == summary
        assert len(list(Path(train.DEFAULT_DATA).glob("train-*-of-00002.tfrecord"))) == 2
        before = {p: p.stat().st_mtime_ns for p in Path(train.DEFAULT_DATA).iterdir()}
        assert train._default_data() == train.DEFAULT_DATA  # Present: reused, nothing rewritten.
        assert {p: p.stat().st_mtime_ns for p in Path(train.DEFAULT_DATA).iterdir()} == before
    finally:
        os.chdir(cwd)
    help_text = testing.run_python([sys.executable, str(REPO / "scripts" / "train_recsys.py"), "--help"], timeout=120)
    assert help_text.returncode == 0, help_text.stderr
    assert "default: generate" in help_text.stdout


def test_auc_matches_the_pairwise_definition() -> None:
    auc = _script("train_recsys").auc
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.4
    scores = np.round(rng.random(300), 1)  # Many ties.
    pos, neg = scores[labels], scores[~labels]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (
        len(pos) * len(neg)
    )
    assert auc(labels, scores) == pytest.approx(pairwise, abs=0.5e-12)
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0


def test_each_user_on_exactly_one_worker_and_every_record_once(tmp_path: Path) -> None:
    import tensorflow as tf

    from tfdist.data import TFRecordPipeline

    root = str(tmp_path)
    meta = _make_clicks(root)
    spec = {k: tf.io.FixedLenFeature([], tf.int64) for k in ("user_id", "item_id", "label", "hot")}
    pipeline = TFRecordPipeline(
        files=os.path.join(root, "train-*"),
        batch_size=512,
        features=spec,
        shard_policy="hash",
        shard_key="user_id",
        drop_remainder=False,
    )
    users, counts = [], 0
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=2)
        ids = np.concatenate([b["user_id"].numpy() for b in pipeline.dataset(context)])
        users.append(set(ids.tolist()))
        counts += ids.size
    assert counts == meta["train_records"]
    assert not users[0] & users[1]
    assert len(users[0] | users[1]) == meta["users"]
    assert min(len(u) for u in users) > 0.4 * meta["users"]


def test_traffic_rejects_bad_inputs() -> None:
    with pytest.raises(PlanError, match=r"`workers`.*Received: 1"):
        embedding_traffic(table_values=10, values_touched_per_step=1, workers=1)
    with pytest.raises(PlanError, match=r"`values_touched_per_step`.*Received: 0"):
        embedding_traffic(table_values=10, values_touched_per_step=0, workers=2)


def test_layout_of_an_unsharded_model() -> None:
    import tf_keras

    from tfdist.keras import embedding_layout

    ids = tf_keras.Input((), dtype="int64")
    out = tf_keras.layers.Dense(1)(tf_keras.layers.Embedding(50, 4, name="users")(ids))
    tables = embedding_layout(tf_keras.Model(ids, out))
    assert [t.to_dict()["shards"] for t in tables] == [1]
    assert (tables[0].name, tables[0].rows, tables[0].dim) == ("users", 50, 4)


@pytest.mark.multiprocess
@pytest.mark.timeout(420)
def test_train_with_a_killed_worker_beats_the_popularity_baseline(tmp_path: Path) -> None:
    """One PS cluster run (chief, 2 workers, 2 ps) checks layout, learning and a worker kill."""
    root = str(tmp_path)
    _make_clicks(os.path.join(root, "data"))
    summary_path = os.path.join(root, "summary.json")
    command = [
        sys.executable,
        str(REPO / "scripts" / "train_recsys.py"),
        "--data",
        os.path.join(root, "data"),
        "--epochs",
        "10",
        "--compare",
        "--summary",
        summary_path,
    ]
    statuses: list[str] = []
    # The kill lands while the model trains by construction: when the chief starts epoch 3 of the first fit.
    run = testing.run_cluster(
        command,
        chief=True,
        workers=2,
        ps=2,
        timeout=300,
        max_restarts=1,
        kills=("worker:1@after=^Epoch 3/10$",),
        on_status=statuses.append,
    )
    assert run.ok, run.result.summary() + run.output("chief:0")[-3000:]
    assert len([s for s in statuses if "fault injection: SIGKILL worker:1 after chief:0" in s]) == 1
    restarts = {t.task: t.restarts for t in run.result.tasks}
    assert restarts == {"chief:0": 0, "worker:0": 0, "worker:1": 1, "ps:0": 0, "ps:1": 0}
    assert run.output("chief:0").count("Epoch 10/10") == 2  # Both fits ran to the end.
    assert_all_gone([t.pid for t in run.result.tasks])
    summary = json.loads(Path(summary_path).read_text())
    for table in ("user_embedding", "item_embedding", "item_bias"):
        layout = summary["embedding_shards"][table]
        assert layout["shards"] == 2, layout
        assert sorted(layout["tasks"]) == ["ps:0", "ps:1"], layout
    assert summary["embedding_shards"]["user_embedding"]["rows"] == 3000
    assert summary["auc"] > summary["baseline_auc"] + 0.02, summary
    assert summary["unweighted"]["auc"] > summary["baseline_auc"] + 0.02, summary
    for key in ("auc_hot", "auc_cold", "baseline_auc_cold", "steps_per_s", "cold_weight"):
        assert key in summary
    assert summary["bytes_per_step"]["ratio"] > 1.0
