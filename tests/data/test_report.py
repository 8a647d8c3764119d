"""``tfdist data-report`` and ``skew_report`` (issue 26 item 9): plot, sizes, advice, errors, progress, corrupt files."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Sequence

import pytest
from absl.testing import parameterized

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


class PlotTest(parameterized.TestCase):
    def test_log_axis_labelled_and_divergence_drawn(self) -> None:
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
        self.assertEqual(counts.get_yscale(), "log")
        self.assertEqual(counts.get_ylabel(), "records (log scale)")
        heights = [round(bar.get_height(), 6) for bar in divergence.patches]
        self.assertEqual(heights, [round(tv, 6) for tv in report.class_divergence])
        self.assertGreater(heights[1], 0.9)  # Worker 1 holds only class 2.
        self.assertIn("total variation", divergence.get_ylabel())
        self.assertEqual([line.get_ydata()[0] for line in divergence.get_lines()], [0.05])  # The advice threshold.
        png = os.path.join(self.create_tempdir().full_path, "skew.png")
        report.plot(png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(png), 10_000)


class SizesTest(parameterized.TestCase):
    def test_all_row_is_the_size_on_disk(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "d")
        paths = write_tfrecords([example(i, y, pad=_PAD) for i, y in enumerate(_labels())], prefix, num_shards=4)
        on_disk = sum(os.path.getsize(p) for p in paths)
        self.assertGreater(on_disk, 1_000_000)
        everyone = skew_report(f"{prefix}-*", label_key="label", num_workers=2, shard_policy="data")
        self.assertEqual((everyone.dataset_bytes, everyone.worker_bytes), (on_disk, (on_disk, on_disk)))
        text = everyone.to_text()
        self.assertEqual(_all_row(text)[:3], ["all", "1000", f"{on_disk / 1e6:.2f}"])  # Not twice the size.
        self.assertIn("MB read", text)
        self.assertIn(f"the dataset's size on disk ({on_disk / 1e6:.2f} MB, read 2.0x over)", text)
        self.assertEqual(everyone.to_dict()["dataset_bytes"], on_disk)
        by_file = skew_report(f"{prefix}-*", label_key="label", num_workers=2, shard_policy="file")
        self.assertEqual(sum(by_file.worker_bytes), on_disk)
        self.assertEqual(_all_row(by_file.to_text())[2], f"{on_disk / 1e6:.2f}")


class AdviceTest(parameterized.TestCase):
    def test_per_class_files_are_not_told_to_write_per_class_groups(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "p")
        write_tfrecords([example(i, y) for i, y in enumerate(_labels())], prefix, num_shards=1, partition_by="label")
        report = skew_report(f"{prefix}-*", label_key="label", num_workers=3, shard_policy="file")
        self.assertEqual(report.class_groups, 3)
        self.assertGreater(max(report.class_divergence), 0.5)
        advice = " ".join(report.advice())
        self.assertIn("3 per-class shard groups of 'label'", advice)
        self.assertIn("class_weights='natural'", advice)
        self.assertNotIn("partition_by", advice)

    def test_mixed_files_are_told_to_write_per_class_groups(self) -> None:
        root = self.create_tempdir().full_path
        for y in range(3):  # One class per file, in names that are not class groups.
            write_tfrecords([example(i, y) for i in range(100 * (y + 1))], os.path.join(root, f"d{y}"), num_shards=1)
        report = skew_report(os.path.join(root, "d*.tfrecord"), label_key="label", num_workers=3, shard_policy="file")
        self.assertEqual(report.class_groups, 0)
        self.assertGreater(max(report.class_divergence), 0.5)
        self.assertIn("write_tfrecords(partition_by='label')", " ".join(report.advice()))


class MissingKeyTest(parameterized.TestCase):
    def _data(self) -> str:
        prefix = os.path.join(self.create_tempdir().full_path, "k")
        write_tfrecords([example(i, i % 2, pad=b"ab") for i in range(20)], prefix, num_shards=2)
        return f"{prefix}-*"

    def test_python_names_the_field_and_the_features(self) -> None:
        with pytest.raises(DataError) as caught:
            skew_report(self._data(), label_key="lable", num_workers=2)
        err = caught.value
        self.assertEqual((err.field, err.value), ("label_key", "lable"))
        message = str(err)
        self.assertIn("has: id (int64), label (int64), pad (bytes)", message)
        self.assertIn("Did you mean label_key='label'?", message)
        self.assertNotIn("ParseExample", message)

    def test_cli_speaks_in_flags(self) -> None:
        code, out, err = _cli([self._data(), "--label-key", "lable", "--workers", "2"])
        self.assertEqual((code, out), (2, ""))
        self.assertRegex(err, r"^tfdist data-report: error: Invalid value for `--label-key`. Received: 'lable'")
        self.assertIn("id (int64), label (int64), pad (bytes)", err)
        self.assertIn("Did you mean --label-key label?", err)
        self.assertNotIn("ParseExample", err)
        self.assertNotIn("label_key", err)

    def test_a_bytes_label_is_counted_as_text(self) -> None:
        prefix = os.path.join(self.create_tempdir().full_path, "s")
        write_tfrecords([example(i, "cat" if i % 4 else "dog") for i in range(40)], prefix, num_shards=2)
        report = skew_report(f"{prefix}-*", label_key="label", num_workers=2)
        self.assertEqual(report.global_classes, {"cat": 30, "dog": 10})


class ProgressTest(parameterized.TestCase):
    def _data(self) -> str:
        prefix = os.path.join(self.create_tempdir().full_path, "g")
        write_tfrecords([example(i, y) for i, y in enumerate(_labels())], prefix, num_shards=4)
        return f"{prefix}-*"

    def test_callback_every_n_records(self) -> None:
        calls: list[ScanProgress] = []
        skew_report(
            self._data(),
            label_key="label",
            num_workers=2,
            shard_policy="file",
            progress=calls.append,
            progress_every=100,
        )
        self.assertEqual([c.records for c in calls[:-1]], list(range(100, 1001, 100)))
        self.assertEqual([c.worker for c in calls[:-1]], [0] * 5 + [1] * 5)
        last = calls[-1]
        self.assertEqual((last.done, last.records, last.total, last.files), (True, 1000, 1000, 4))
        self.assertFalse(any(c.done for c in calls[:-1]))

    def test_cli_progress_lines_on_stderr_only_when_asked(self) -> None:
        data = self._data()
        args = [data, "--label-key", "label", "--workers", "2", "--shard-policy", "file"]
        code, out, err = _cli([*args, "--progress-every", "250"])
        self.assertEqual(code, 0, err)
        lines = [line for line in err.splitlines() if "scanned" in line]
        self.assertLen(lines, 5, err)
        for line, count in zip(lines, ["250", "500", "750", "1,000"]):
            self.assertRegex(line, rf"^tfdist data-report: scanned {count} of 1,000 records, worker [12] of 2, ")
        self.assertRegex(lines[-1], r"^tfdist data-report: scanned 1,000 records in 4 file\(s\) \(\d+\.\d s\)$")
        self.assertNotIn("scanned", out)
        _, _, quiet = _cli(args)  # stderr is not a terminal here: no progress by default.
        self.assertNotIn("scanned", quiet)
        _, _, off = _cli([*args, "--progress-every", "250", "--no-progress"])
        self.assertNotIn("scanned", off)
        _, _, forced = _cli([*args, "--progress"])  # On, every 2 s: the closing line at least.
        self.assertRegex(forced, r"tfdist data-report: scanned 1,000 records in 4 file\(s\)")


class CorruptTest(parameterized.TestCase):
    def _data(self) -> tuple[str, str]:
        prefix = os.path.join(self.create_tempdir().full_path, "c")
        paths = write_tfrecords([example(i, y) for i, y in enumerate(_labels(400))], prefix, num_shards=2)
        with open(paths[1], "rb") as f:
            data = f.read()
        with open(paths[1], "wb") as f:
            f.write(data[: len(data) // 2])  # Truncated mid-record.
        return f"{prefix}-*", paths[1]

    def test_cli_error_names_the_flag_and_skip_reports_the_loss(self) -> None:
        pattern, bad = self._data()
        args = [pattern, "--label-key", "label", "--workers", "2", "--shard-policy", "file"]
        code, out, err = _cli(args)
        self.assertEqual((code, out), (2, ""))
        self.assertIn(f"Corrupt TFRecord file {bad}", err)
        self.assertIn("pass --on-corrupt skip", err)
        self.assertNotIn("on_corrupt", err)
        code, out, err = _cli([*args, "--on-corrupt", "skip", "--json"])
        self.assertEqual(code, 0, err)
        data = json.loads(out)
        self.assertEqual(data["corrupt_files"], [bad])
        self.assertTrue(data["records_lost_exact"])  # The writer's manifest counts the file's records.
        self.assertEqual(sum(data["worker_records"]) + data["records_lost"], 400)
        self.assertGreater(data["records_lost"], 50)
        code, out, _ = _cli([*args, "--on-corrupt", "skip"])
        self.assertIn(f"skipped the damaged part of 1 file(s), {data['records_lost']} record(s) lost: {bad}", out)

    def test_python_on_corrupt(self) -> None:
        pattern, bad = self._data()
        with pytest.raises(DataError, match="on_corrupt='skip'"):
            skew_report(pattern, label_key="label", num_workers=2)
        report = skew_report(pattern, label_key="label", num_workers=2, on_corrupt="skip")
        self.assertEqual(report.corrupt_files, (bad,))
        self.assertEqual(sum(report.worker_records) + report.records_lost, 400)
