"""``tfdist data-report`` and ``skew_report`` (issue 26 item 9): plot, sizes, advice, errors, progress, corrupt files."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.support.records import example
from tfdist import DataError
from tfdist.cli.main import main
from tfdist.data import SkewReport, write_tfrecords
from tfdist.data.report import ScanProgress, skew_report

_PAD = b"x" * 1000  # ~1 KB per record: the sizes show in the table's MB column.


def _labels(n: int = 1000) -> list[int]:
    """90/9/1 classes."""
    return [0] * (n * 90 // 100) + [1] * (n * 9 // 100) + [2] * (n - n * 99 // 100)


def _cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """Runs ``tfdist data-report ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["data-report", *argv])
    return code, out.getvalue(), err.getvalue()


def _all_row(text: str) -> list[str]:
    return next(line for line in text.splitlines() if line.startswith("all ")).split()


# Plot.


def test_log_axis_labelled_and_divergence_drawn(tmp_path: Path) -> None:
    # The reporter's numbers: tail classes of 31 and 62 records beside 2,011.
    report = SkewReport(
        policy="file",
        reason="3 files over 2 workers",
        label_key="y",
        worker_records=(2042, 62),
        worker_bytes=(2000, 100),
        worker_classes=({"0": 2011, "1": 31}, {"2": 62}),
    )
    fig = report.figure()
    counts, _, divergence = fig.axes
    assert counts.get_yscale() == "log"
    assert counts.get_ylabel() == "records (log scale)"
    heights = [round(bar.get_height(), 6) for bar in divergence.patches]
    assert heights == [round(tv, 6) for tv in report.class_divergence]
    assert heights[1] > 0.9  # Worker 1 holds only class 2.
    assert "total variation" in divergence.get_ylabel()
    assert [line.get_ydata()[0] for line in divergence.get_lines()] == [0.05]  # The advice threshold.
    png = os.path.join(tmp_path, "skew.png")
    report.plot(png)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10_000


# Sizes.


def test_all_row_is_the_size_on_disk(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "d")
    paths = write_tfrecords([example(i, y, pad=_PAD) for i, y in enumerate(_labels())], prefix, num_shards=4)
    on_disk = sum(os.path.getsize(p) for p in paths)
    assert on_disk > 1_000_000
    everyone = skew_report(f"{prefix}-*", label_key="label", num_workers=2, shard_policy="data")
    assert (everyone.dataset_bytes, everyone.worker_bytes) == (on_disk, (on_disk, on_disk))
    text = everyone.to_text()
    assert _all_row(text)[:3] == ["all", "1000", f"{on_disk / 1e6:.2f}"]  # Not twice the size.
    assert "MB read" in text
    assert f"the dataset's size on disk ({on_disk / 1e6:.2f} MB, read 2.0x over)" in text
    assert everyone.to_dict()["dataset_bytes"] == on_disk
    by_file = skew_report(f"{prefix}-*", label_key="label", num_workers=2, shard_policy="file")
    assert sum(by_file.worker_bytes) == on_disk
    assert _all_row(by_file.to_text())[2] == f"{on_disk / 1e6:.2f}"


# Advice.


def test_per_class_files_are_not_told_to_write_per_class_groups(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "p")
    write_tfrecords([example(i, y) for i, y in enumerate(_labels())], prefix, num_shards=1, partition_by="label")
    report = skew_report(f"{prefix}-*", label_key="label", num_workers=3, shard_policy="file")
    assert report.class_groups == 3
    assert max(report.class_divergence) > 0.5
    advice = " ".join(report.advice())
    assert "3 per-class shard groups of 'label'" in advice
    assert "class_weights='natural'" in advice
    assert "partition_by" not in advice


def test_mixed_files_are_told_to_write_per_class_groups(tmp_path: Path) -> None:
    root = str(tmp_path)
    for y in range(3):  # One class per file, in names that are not class groups.
        write_tfrecords([example(i, y) for i in range(100 * (y + 1))], os.path.join(root, f"d{y}"), num_shards=1)
    report = skew_report(os.path.join(root, "d*.tfrecord"), label_key="label", num_workers=3, shard_policy="file")
    assert report.class_groups == 0
    assert max(report.class_divergence) > 0.5
    assert "write_tfrecords(partition_by='label')" in " ".join(report.advice())


# A missing label key.


@pytest.fixture
def keyed_data(tmp_path: Path) -> str:
    """Two shards of 20 records with features id, label and pad; returns their pattern."""
    prefix = os.path.join(tmp_path, "k")
    write_tfrecords([example(i, i % 2, pad=b"ab") for i in range(20)], prefix, num_shards=2)
    return f"{prefix}-*"


def test_python_names_the_field_and_the_features(keyed_data: str) -> None:
    with pytest.raises(DataError) as caught:
        skew_report(keyed_data, label_key="lable", num_workers=2)
    err = caught.value
    assert (err.field, err.value) == ("label_key", "lable")
    message = str(err)
    assert "has: id (int64), label (int64), pad (bytes)" in message
    assert "Did you mean label_key='label'?" in message
    assert "ParseExample" not in message


def test_cli_speaks_in_flags(keyed_data: str) -> None:
    code, out, err = _cli([keyed_data, "--label-key", "lable", "--workers", "2"])
    assert (code, out) == (2, "")
    assert re.search(r"^tfdist data-report: error: Invalid value for `--label-key`. Received: 'lable'", err), err
    assert "id (int64), label (int64), pad (bytes)" in err
    assert "Did you mean --label-key label?" in err
    assert "ParseExample" not in err
    assert "label_key" not in err


def test_a_bytes_label_is_counted_as_text(tmp_path: Path) -> None:
    prefix = os.path.join(tmp_path, "s")
    write_tfrecords([example(i, "cat" if i % 4 else "dog") for i in range(40)], prefix, num_shards=2)
    report = skew_report(f"{prefix}-*", label_key="label", num_workers=2)
    assert report.global_classes == {"cat": 30, "dog": 10}


# Progress.


@pytest.fixture
def progress_data(tmp_path: Path) -> str:
    """Four shards of 1000 records (90/9/1 classes); returns their pattern."""
    prefix = os.path.join(tmp_path, "g")
    write_tfrecords([example(i, y) for i, y in enumerate(_labels())], prefix, num_shards=4)
    return f"{prefix}-*"


def test_callback_every_n_records(progress_data: str) -> None:
    calls: list[ScanProgress] = []
    skew_report(
        progress_data,
        label_key="label",
        num_workers=2,
        shard_policy="file",
        progress=calls.append,
        progress_every=100,
    )
    assert [c.records for c in calls[:-1]] == list(range(100, 1001, 100))
    assert [c.worker for c in calls[:-1]] == [0] * 5 + [1] * 5
    last = calls[-1]
    assert (last.done, last.records, last.total, last.files) == (True, 1000, 1000, 4)
    assert not any(c.done for c in calls[:-1])


def test_cli_progress_lines_on_stderr_only_when_asked(progress_data: str) -> None:
    args = [progress_data, "--label-key", "label", "--workers", "2", "--shard-policy", "file"]
    code, out, err = _cli([*args, "--progress-every", "250"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if "scanned" in line]
    assert len(lines) == 5, err
    for line, count in zip(lines, ["250", "500", "750", "1,000"]):
        assert re.search(rf"^tfdist data-report: scanned {count} of 1,000 records, worker [12] of 2, ", line), line
    assert re.search(r"^tfdist data-report: scanned 1,000 records in 4 file\(s\) \(\d+\.\d s\)$", lines[-1]), lines[-1]
    assert "scanned" not in out
    _, _, quiet = _cli(args)  # stderr is not a terminal here: no progress by default.
    assert "scanned" not in quiet
    _, _, off = _cli([*args, "--progress-every", "250", "--no-progress"])
    assert "scanned" not in off
    _, _, forced = _cli([*args, "--progress"])  # On, every 2 s: the closing line at least.
    assert re.search(r"tfdist data-report: scanned 1,000 records in 4 file\(s\)", forced), forced


# Corrupt files.


@pytest.fixture
def corrupt_data(tmp_path: Path) -> tuple[str, str]:
    """Two shards of 400 records, the second truncated mid-record; returns (pattern, the damaged file)."""
    prefix = os.path.join(tmp_path, "c")
    paths = write_tfrecords([example(i, y) for i, y in enumerate(_labels(400))], prefix, num_shards=2)
    with open(paths[1], "rb") as f:
        data = f.read()
    with open(paths[1], "wb") as f:
        f.write(data[: len(data) // 2])  # Truncated mid-record.
    return f"{prefix}-*", paths[1]


def test_cli_error_names_the_flag_and_skip_reports_the_loss(corrupt_data: tuple[str, str]) -> None:
    pattern, bad = corrupt_data
    args = [pattern, "--label-key", "label", "--workers", "2", "--shard-policy", "file"]
    code, out, err = _cli(args)
    assert (code, out) == (2, "")
    assert f"Corrupt TFRecord file {bad}" in err
    assert "pass --on-corrupt skip" in err
    assert "on_corrupt" not in err
    code, out, err = _cli([*args, "--on-corrupt", "skip", "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert data["corrupt_files"] == [bad]
    assert data["records_lost_exact"]  # The writer's manifest counts the file's records.
    assert sum(data["worker_records"]) + data["records_lost"] == 400
    assert data["records_lost"] > 50
    code, out, _ = _cli([*args, "--on-corrupt", "skip"])
    assert f"skipped the damaged part of 1 file(s), {data['records_lost']} record(s) lost: {bad}" in out


def test_python_on_corrupt(corrupt_data: tuple[str, str]) -> None:
    pattern, bad = corrupt_data
    with pytest.raises(DataError, match="on_corrupt='skip'"):
        skew_report(pattern, label_key="label", num_workers=2)
    report = skew_report(pattern, label_key="label", num_workers=2, on_corrupt="skip")
    assert report.corrupt_files == (bad,)
    assert sum(report.worker_records) + report.records_lost == 400


def test_plot_without_matplotlib_says_how_to_install_it_before_any_scan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Checked before the scan: a pattern that matches nothing would fail the scan, so exit 2 with the plot
    # message (not the scan's) proves the order.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    args = [str(tmp_path / "none-*"), "--label-key", "label", "--workers", "2", "--plot", str(tmp_path / "r.png")]
    code, out, err = _cli(args)
    assert (code, out) == (2, "")
    assert "--plot needs matplotlib, which is not installed" in err, err
    assert 'pip install ".[plot]" in a tfdist clone' in err and "No files" not in err, err
