"""Keras under both strategies: equivalence, cluster callbacks, PS with the evaluator side-car, fault tolerance."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.keras import _tasks_fit as fit_tasks
from tests.support import REPO
from tfdist import testing
from tfdist.launch.events import KillAt

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


class TestDataParallel:
    def test_two_workers_equal_one_process_with_two_replicas(self) -> None:
        mwms = testing.run_cluster(fit_tasks.equivalence_mwms, workers=2, timeout=180, args=[64, 3])
        mirrored = testing.run_cluster(fit_tasks.equivalence_mirrored, workers=1, timeout=180, args=[64, 3])
        assert mwms.ok, mwms.result.summary()
        assert mirrored.ok, mirrored.result.summary()
        reference = mirrored.values["worker:0"]
        assert (reference["replicas"], mwms.values["worker:0"]["replicas"]) == (2, 2)
        for task in ("worker:0", "worker:1"):
            np.testing.assert_allclose(mwms.values[task]["weights"], reference["weights"], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(mwms.values["worker:0"]["weights"], mwms.values["worker:1"]["weights"])

    def test_cluster_callbacks_under_mwms(self, tmp_path: Path) -> None:
        root = str(tmp_path)
        run = testing.run_cluster(fit_tasks.mwms_with_cluster_callbacks, workers=2, timeout=180, args=[root, 3])
        assert run.ok, run.result.summary()
        chief, other = run.values["worker:0"], run.values["worker:1"]
        assert "TensorBoard" in chief["callbacks"]
        assert "TensorBoard" not in other["callbacks"]  # TensorBoard on the chief only.
        assert sorted(os.listdir(os.path.join(root, "ckpt")))[:2] == ["checkpoint", "ckpt-1.data-00000-of-00001"]
        assert os.path.exists(os.path.join(root, "ckpt", "ckpt-3.index"))
        leftovers = glob.glob(os.path.join(root, "**", "workertemp_*"), recursive=True)
        assert leftovers == []  # Non-chief copies went to temporary directories, now removed.
        assert not os.path.exists(os.path.join(root, "backup", "chief"))  # Backup deleted after success.
        assert glob.glob(os.path.join(root, "tb", "train", "events.out.tfevents.*"))
        for value in (chief, other):
            assert len(value["throughput"]) == 3
            assert value["throughput"][-1]["examples_per_s"] > 0
        reports = sorted(os.listdir(os.path.join(root, "throughput")))
        assert reports == [f"throughput-worker-{w}-epoch{e}.json" for w in (0, 1) for e in range(3)]
        assert len(chief["stragglers"]) == 3  # The chief compared both workers every epoch.


class TestParameterServerKeras:
    def test_fit_input_callbacks_evaluator_sidecar_and_keras3_refused(self, tmp_path: Path) -> None:
        root = str(tmp_path)
        run = testing.run_cluster(
            fit_tasks.ps_full, workers=2, ps=1, chief=True, evaluator=True, timeout=240, args=[root, 4, 20, "", True]
        )
        assert run.ok, run.result.summary()
        chief = run.values["chief:0"]
        assert chief["loss"][-1] < chief["loss"][0]
        assert "PS fit cannot detect the end of an epoch" in chief["missing_steps_error"]
        assert "Each worker builds its own input" in chief["dataset_not_function_error"]
        assert "cannot fit under ParameterServerStrategy" in chief["keras3_error"]
        assert "Keras 3 has no fit that drives a ClusterCoordinator" in chief["keras3_error"]
        assert "from tfdist import keras" in chief["keras3_error"]
        assert run.values["evaluator:0"] == {"evaluated": True}  # Stopped by itself after ckpt-4.
        evaluations = [line for line in run.output("evaluator:0").splitlines() if "- loss:" in line]
        assert len(evaluations) >= 1  # It may skip checkpoints saved while it evaluated.
        assert glob.glob(os.path.join(root, "tb", "eval", "**", "events.out.tfevents.*"), recursive=True)

    def test_killed_ps_is_recovered_from_the_backup(self, tmp_path: Path) -> None:
        root = str(tmp_path)
        statuses: list[str] = []
        # Kill the ps once the chief has backed up epoch 2 (a log line, not a clock: issue #11).
        run = testing.run_cluster(
            fit_tasks.ps_full,
            workers=2,
            ps=1,
            chief=True,
            timeout=240,
            max_restarts=1,
            kills=(KillAt(task="ps:0", after="^EPOCH_END 2$"),),
            on_status=statuses.append,
            args=[root, 6, 20],
        )
        assert run.ok, run.result.summary()
        assert len([s for s in statuses if "fault injection: SIGKILL ps:0 after chief:0" in s]) == 1
        restarts = {t.task: t.restarts for t in run.result.tasks}
        assert restarts["ps:0"] == 1
        assert restarts["chief:0"] == 1  # A lost ps restarts the group from the backup.
        resumed = run.values["chief:0"]
        assert resumed["restart"] == 1
        assert resumed["epochs_seen"][0] >= 3, resumed  # Resumed after the backed-up epoch 2.
        assert resumed["epochs_seen"][-1] == 5


def _demo_report() -> Any:
    spec = importlib.util.spec_from_file_location("demo_report", REPO / "scripts" / "demo_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestDemo:
    """scripts/demo.py over seeds under both strategies, and scripts/demo_report.py on what it wrote."""

    @pytest.fixture(scope="class")
    def data(self, tmp_path_factory: pytest.TempPathFactory) -> str:
        """The demo's images, made once for both tests by scripts/make_synthetic_images.py (forked from the
        session's fork server, which has imported TensorFlow)."""
        import sys

        root = str(tmp_path_factory.mktemp("demo-data"))
        make = [sys.executable, str(REPO / "scripts" / "make_synthetic_images.py"), "--classes", "4", "--size", "32"]
        for args in (
            ["--out", f"{root}/data/train", "--num", "800", "--partition", "--shards", "2"],
            ["--out", f"{root}/data/val", "--num", "200", "--skew", "uniform", "--seed", "1", "--shards", "2"],
        ):
            done = testing.run_python(make + args, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
        return f"{root}/data"

    def _demo(self, data: str, root: str, *args: str) -> list[str]:
        import sys

        return [
            sys.executable,
            str(REPO / "scripts" / "demo.py"),
            "--data",
            data,
            "--out",
            f"{root}/out",
            "--classes",
            "4",
            "--image-size",
            "32",
            "--batch",
            "32",
            *args,
        ]

    def test_demo_trains_each_seed_and_counts_records_under_mwms(self, data: str, tmp_path: Path) -> None:
        root = str(tmp_path)
        run = testing.run_cluster(self._demo(data, root, "--epochs", "2", "--seeds", "2"), workers=2, timeout=240)
        assert run.ok, run.result.summary()
        summary = json.loads(Path(f"{root}/out/summary.json").read_text())
        assert (summary["replicas"], summary["workers"], summary["sampling"], summary["seeds"]) == (
            2,
            2,
            "stratified",
            [0, 1],
        )
        assert summary["steps_per_epoch"] == 800 // 32
        # Each MWMS worker trains on half of every global batch, counted in its own train steps.
        half = summary["steps_per_epoch"] * 32 // 2
        for seed_run in summary["runs"]:
            assert seed_run["records_per_worker"] == [[half, half], [half, half]]
            assert sorted(seed_run["per_class_accuracy"]) == ["0", "1", "2", "3"]
        assert summary["records_per_worker_epoch"] == {
            "min": [half, half],
            "max": [half, half],
            "mean": [half, half],
        }
        assert "Input pipeline 0/2" in summary["input_pipelines"][0]  # The chief's share of two pipelines.
        # Distinct records an epoch trained, by id, summed over both workers' train steps: at most the data.
        for seed_run in summary["runs"]:
            assert all(0 < distinct <= 800 and draws == 800 for distinct, draws in seed_run["distinct_records"])
        first, second = summary["runs"]
        assert first["final_loss"] != second["final_loss"]  # The seed changes initialisation and order.
        accuracy = summary["per_class_accuracy"]["0"]
        values = [r["per_class_accuracy"]["0"] for r in summary["runs"]]
        assert (accuracy["min"], accuracy["max"]) == (min(values), max(values))
        for seed in (0, 1):
            assert glob.glob(f"{root}/out/seed-{seed}/tensorboard/train/events.out.tfevents.*")
        # The report: one column per run, and a PNG picture.
        report = _demo_report()
        picture = f"{root}/demo.png"
        report.draw([summary, summary], picture)
        assert Path(picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        text = report.table([summary], picture)
        assert (
            f"records each worker trained on per epoch (counted in the train step): worker 0 {half}, worker 1 {half}"
            in text
        )
        assert f"class 3 ({summary['train_class_counts']['3']} train)" in text
        assert f"picture: {picture}" in text

    def test_demo_counts_what_each_ps_worker_trains_on(self, data: str, tmp_path: Path) -> None:
        root = str(tmp_path)
        command = self._demo(data, root, "--epochs", "2", "--seeds", "1", "--sampling", "natural")
        run = testing.run_cluster(command, workers=2, ps=1, chief=True, timeout=240)
        assert run.ok, run.result.summary()
        summary = json.loads(Path(f"{root}/out/summary.json").read_text())
        assert (summary["strategy"], summary["workers"]) == ("ParameterServerStrategyV2", 2)
        # The coordinator hands each step (one global batch) to a free worker: the split varies, the sum does not.
        for epoch in summary["runs"][0]["records_per_worker"]:
            assert sum(epoch) == summary["steps_per_epoch"] * 32, epoch
        # The workers claim the steps of one pass: an epoch of 25 steps of 32 trains each of the 800 records once
        # (before, every worker read the same records in the same order: "identical" first batches).
        assert "Input pipeline under parameter servers: claimed steps: 800 records" in summary["input_pipelines"][0]
        assert summary["runs"][0]["distinct_records"] == [[800, 800], [800, 800]]
        text = _demo_report().table([summary], None)
        assert "natural: distinct records trained per epoch (counted in the train step): 800, of 800 trained" in text
        assert "identical" not in text


class TestPreemption:
    def test_sigterm_saves_and_the_rerun_resumes_there(self, tmp_path: Path) -> None:
        import signal
        import subprocess
        import sys
        import time

        root = str(tmp_path)
        log = os.path.join(root, "epochs")
        command = [
            sys.executable,
            "-m",
            "tfdist.cli.launch",
            "--workers",
            "2",
            "--grace",
            "30",
            "--timeout",
            "200",
            "--preload",
            "--",
            sys.executable,
            "-m",
            "tfdist.launch.tasks.function",
            "--file",
            fit_tasks.__file__,
            "preemptible_fit",
            json.dumps([os.path.join(root, "backup"), log, 12, 0.2]),
        ]
        first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # SIGTERM once a few epochs have run on worker 0.
            if os.path.exists(log + ".worker-0") and len(Path(log + ".worker-0").read_text().split()) >= 3 * 4:
                break
            time.sleep(0.2)
        signal_sent = time.monotonic()
        first.send_signal(signal.SIGTERM)
        Path(log + ".sigterm").touch()  # The workers wait at the end of each epoch from the fourth for this.
        output = first.communicate(timeout=120)[0]
        assert first.returncode == 143, output[-3000:]
        assert time.monotonic() - signal_sent < 25, "workers should save and exit, not wait for SIGKILL"
        before = [line.split() for line in Path(log + ".worker-0").read_text().splitlines()]
        second = subprocess.run(command, capture_output=True, text=True, timeout=240)
        assert second.returncode == 0, second.stdout[-3000:]
        after = [line.split() for line in Path(log + ".worker-0").read_text().splitlines()][len(before) :]
        last_epoch_before = int(before[-1][1])
        resumed_epoch, resumed_step = int(after[0][1]), int(after[0][2])
        assert resumed_epoch >= last_epoch_before  # Where SIGTERM stopped it, not from zero.
        assert resumed_step > int(before[-1][2]) - 1
        assert after[-1] == ["done", "12", str(12 * 8)]
