"""Skew reports: what each worker will read, and how far its class mix is from the global one.

Example:
    >>> from tfdist.data import SkewReport
    >>> report = SkewReport(policy="file", reason="", label_key="y", worker_records=(60, 40),
    ...                     worker_bytes=(600, 400), worker_classes=({"a": 50, "b": 10}, {"a": 20, "b": 20}))
    >>> round(report.record_imbalance, 2), report.total_bytes
    (1.2, 1000)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tfdist.data.sharding import ShardPlan, imbalance
from tfdist.errors import DataError, Error, invalid, require_int

if TYPE_CHECKING:
    from tfdist.data.pipeline.tfrecord import TFRecordPipeline
    from tfdist.data.records.files import Listing
    from tfdist.data.records.verify import VerifyReport

__all__ = ["ScanProgress", "SkewReport", "skew_report"]

_log = logging.getLogger("tfdist.data.report")
_DIVERGENCE_TIP = 0.05  # Worst total-variation distance above which the report advises on class mixes.
_READ_BATCH = 8192  # Records parsed per step of the scan.
# The kinds of a tf.train.Feature, and the dtype a label of that kind is read as.
_KINDS = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}
_DTYPES = {"int64": "int64", "float": "float32", "bytes": "string"}


def _tv_distance(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    keys = set(p) | set(q)
    return 0.5 * sum(abs(p.get(k, 0.0) - q.get(k, 0.0)) for k in keys)


def _normalize(counts: Mapping[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()} if total else {}


def class_order(label: str) -> tuple[int, float, str]:
    """Sort key for class labels: numbers by value (2 before 10), then the other labels as text.

    Example:
        >>> sorted(["10", "2", "b", "0", "a", "1.5"], key=class_order)
        ['0', '1.5', '2', '10', 'a', 'b']
    """
    try:
        value = float(label)
    except ValueError:
        return (1, 0.0, label)
    return (0, value, label) if math.isfinite(value) else (1, 0.0, label)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScanProgress:
    """How far a :func:`skew_report` scan is, handed to its ``progress`` callback.

    Attributes:
      records: Records counted so far, over all workers' shares.
      total: Records the scan counts in all, when the writer's manifest knows (else None).
      files: Files opened so far (a file every worker reads counts once per worker).
      worker: The worker whose share is being read (0-based).
      workers: Workers in the report.
      seconds: Since the scan started.
      done: True on the last call, when every share is counted.
    """

    records: int
    total: int | None
    files: int
    worker: int
    workers: int
    seconds: float
    done: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkewReport:
    """Per-worker record, byte and class counts for one sharding policy.

    ``worker_bytes`` is what each worker *reads*: under 'data' and 'hash' every
    worker reads every file and keeps its share of the records. ``dataset_bytes``
    is the dataset's size on disk (the sum of its file sizes); None when not
    known, and then taken from the per-worker reads.
    ``class_groups`` counts the per-class shard groups of ``label_key`` the files
    are written in (``write_tfrecords(partition_by=label_key)``; 0: mixed files).
    ``corrupt_files`` and ``records_lost`` say what ``on_corrupt='skip'`` skipped (``records_lost`` is
    estimated from the unreadable bytes when no writer's manifest counts the records:
    ``records_lost_exact`` is then False).
    """

    policy: str
    reason: str
    label_key: str
    worker_records: tuple[int, ...]
    worker_bytes: tuple[int, ...]
    worker_classes: tuple[Mapping[str, int], ...]
    dataset_bytes: int | None = None
    class_groups: int = 0
    corrupt_files: tuple[str, ...] = ()
    records_lost: int = 0
    records_lost_exact: bool = True

    @property
    def global_classes(self) -> dict[str, int]:
        """Class -> records over all workers, classes in :func:`class_order`."""
        total: Counter[str] = Counter()
        for classes in self.worker_classes:
            total.update(classes)
        return dict(sorted(total.items(), key=lambda item: class_order(item[0])))

    @property
    def total_bytes(self) -> int:
        """The dataset's size on disk: ``dataset_bytes``, else the per-worker reads (each file read once under 'file')."""
        if self.dataset_bytes is not None:
            return self.dataset_bytes
        if self.policy == "file":
            return sum(self.worker_bytes)
        return max(self.worker_bytes, default=0)  # Every worker reads every file.

    @property
    def record_imbalance(self) -> float:
        """Max over mean records per worker (1.0 is even; the slowest worker sets the step time)."""
        return imbalance(self.worker_records)

    @property
    def class_divergence(self) -> tuple[float, ...]:
        """Total-variation distance of each worker's class mix from the global mix (0 = same, 1 = disjoint)."""
        target = _normalize(self.global_classes)
        return tuple(_tv_distance(_normalize(c), target) for c in self.worker_classes)

    @property
    def class_imbalance(self) -> float:
        """Largest over smallest class count globally (inf when a class is empty)."""
        counts = list(self.global_classes.values())
        smallest = min(counts, default=0)
        return max(counts) / smallest if smallest else math.inf

    def advice(self) -> list[str]:
        """What to change, in words: for files already per class, what helps those (not writing them again)."""
        tips = []
        key = self.label_key
        if self.record_imbalance > 1.1:
            tips.append(
                f"Workers read unequal shares (max/mean {self.record_imbalance:.2f}): write more, "
                "equal-sized shards, or use shard_policy='data'."
            )
        worst = max(self.class_divergence, default=0.0)
        if worst > _DIVERGENCE_TIP and self.class_groups:
            tips.append(
                f"A worker's class mix differs from the global one by {worst:.0%} (total variation): the files "
                f"are {self.class_groups} per-class shard groups of {key!r}, and plain reading splits them by "
                f"file. Read them with TFRecordPipeline(..., label_key={key!r}, class_weights='natural') (or "
                "'sqrt'/'balanced' to rebalance): each class group is then split over the workers on its own, so "
                "every worker draws every class. Or use shard_policy='data'."
            )
        elif worst > _DIVERGENCE_TIP:
            tips.append(
                f"A worker's class mix differs from the global one by {worst:.0%} (total variation): write "
                f"per-class shard groups (write_tfrecords(partition_by={key!r})) and read with class_weights, or "
                "use shard_policy='data'."
            )
        if self.class_imbalance > 10 and self.class_groups:
            tips.append(
                f"Classes are skewed {self.class_imbalance:.0f}:1: read with class_weights='sqrt' or 'balanced' "
                "in TFRecordPipeline; the per-class shard groups make that a stratified draw (no extra reads)."
            )
        elif self.class_imbalance > 10:
            tips.append(
                f"Classes are skewed {self.class_imbalance:.0f}:1: consider class_weights='sqrt' or 'balanced' "
                "in TFRecordPipeline. On these mixed files that is rejection resampling (num_classes=..., it "
                f"reads far more records); write_tfrecords(partition_by={key!r}) makes it a stratified draw."
            )
        return tips or ["Shares and class mixes are balanced; nothing to change."]

    def _bytes_note(self) -> str:
        """What the MB column means, for the table."""
        total, read = self.total_bytes, sum(self.worker_bytes)
        if read == total:
            return "MB read: the bytes of each worker's files; all: the dataset's size on disk."
        over = f", read {read / total:.1f}x over" if total else ""
        return (
            f"MB read: each worker reads every file under '{self.policy}'; all: the dataset's size on disk "
            f"({total / 1e6:.2f} MB{over})."
        )

    def to_text(self) -> str:
        """A table for people: one row per worker, then ``all`` (records, the dataset's size, classes)."""
        classes = list(self.global_classes)
        lines = [
            f"sharding: {self.policy} ({self.reason})",
            f"{'worker':<8}{'records':>10}{'MB read':>9}{'TV':>7}  " + " ".join(f"{c:>8}" for c in classes),
        ]
        for i, (records, size, mix, tv) in enumerate(
            zip(self.worker_records, self.worker_bytes, self.worker_classes, self.class_divergence)
        ):
            lines.append(
                f"{i:<8}{records:>10}{size / 1e6:>9.2f}{tv:>7.3f}  " + " ".join(f"{mix.get(c, 0):>8}" for c in classes)
            )
        lines.append(
            f"{'all':<8}{sum(self.worker_records):>10}{self.total_bytes / 1e6:>9.2f}{'':>7}  "
            + " ".join(f"{self.global_classes[c]:>8}" for c in classes)
        )
        lines.append(self._bytes_note())
        lines.append(
            f"record imbalance (max/mean): {self.record_imbalance:.3f}; class skew (max/min): "
            f"{self.class_imbalance:.1f}; worst class-mix divergence: {max(self.class_divergence, default=0.0):.3f}"
        )
        if self.corrupt_files:
            lines.append(
                f"skipped the damaged part of {len(self.corrupt_files)} file(s), "
                f"{'' if self.records_lost_exact else 'about '}{self.records_lost} record(s) lost: "
                + ", ".join(self.corrupt_files)
            )
        lines += [f"- {tip}" for tip in self.advice()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Every count and derived number, for ``--json``."""
        return {
            "policy": self.policy,
            "reason": self.reason,
            "label_key": self.label_key,
            "worker_records": list(self.worker_records),
            "worker_bytes": list(self.worker_bytes),
            "dataset_bytes": self.total_bytes,
            "worker_classes": [dict(c) for c in self.worker_classes],
            "global_classes": self.global_classes,
            "class_groups": self.class_groups,
            "record_imbalance": self.record_imbalance,
            "class_divergence": list(self.class_divergence),
            "class_imbalance": self.class_imbalance,
            "corrupt_files": list(self.corrupt_files),
            "records_lost": self.records_lost,
            "records_lost_exact": self.records_lost_exact,
            "advice": self.advice(),
        }

    def figure(self) -> Any:
        """A matplotlib ``Figure`` of the report (needs matplotlib: the ``plot`` extra).

        Three panels: records per class and worker on a log axis (tail classes stay visible), records per
        worker, and each worker's class-mix divergence (total variation) against the advice threshold.
        """
        from tfdist.data import _report_plot

        return _report_plot.figure(self, threshold=_DIVERGENCE_TIP)

    def plot(self, path: str) -> None:
        """Draws :meth:`figure` to the PNG ``path`` (needs matplotlib: the ``plot`` extra)."""
        self.figure().savefig(path, dpi=100)


def _first_features(path: str, compression: str) -> dict[str, str] | None:
    """Feature name -> kind ('int64', 'float', 'bytes') of the first record of ``path``; None if not known.

    Read with ``tf.train.Example.FromString``, so a wrong key can be reported with the features that exist
    instead of the parser's own words. An empty, damaged or non-Example file gives None (the reader reports it).
    """
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    from tfdist.data.records import _framing
    from tfdist.data.storage import remote

    try:
        if "://" not in path and not compression:
            record = _framing.first_record(path)
        else:
            first = list(tf.data.TFRecordDataset(remote.readable_path(path), compression_type=compression).take(1))
            record = first[0].numpy() if first else None
        if record is None:
            return None
        example = tf.train.Example.FromString(record)
    except (tf.errors.OpError, OSError, Error, DecodeError):
        return None
    return {
        name: _KINDS.get(str(feature.WhichOneof("kind")), "empty")
        for name, feature in sorted(example.features.feature.items())
    }


def _require_feature(field: str, key: str, kinds: Mapping[str, str], path: str) -> None:
    """Raises a DataError naming ``field`` when ``key`` is not a feature of the first record."""
    if key in kinds:
        return
    from tfdist._names import closest

    shown = ", ".join(f"{name} ({kind})" for name, kind in kinds.items()) or "no features"
    guess = closest(key, kinds)
    fix = f"Did you mean {field}={guess!r}?" if guess else f"Pass {field}= one of those features."
    raise invalid(DataError, field, key, f"a feature of the records (the first record of {path} has: {shown})", fix)


def skew_report(
    files: Any,
    *,
    label_key: str,
    num_workers: int,
    shard_policy: str = "auto",
    shard_key: str | None = None,
    label_spec: Any | None = None,
    on_corrupt: str = "raise",
    progress: Callable[[ScanProgress], None] | None = None,
    progress_every: int = _READ_BATCH,
) -> SkewReport:
    """Reads the labels of every record and reports each worker's share under ``shard_policy``.

    Args:
      files: A glob or list of TFRecord files.
      label_key: The label feature.
      num_workers: Workers to split over.
      shard_policy: As in :class:`TFRecordPipeline` ('hash' needs ``shard_key``).
      shard_key: The hashed feature for 'hash'.
      label_spec: The label's ``tf.io`` feature spec; default a scalar of the first record's kind
        (int64, float32 or string).
      on_corrupt: As in :class:`TFRecordPipeline`: 'raise' a DataError naming a damaged file, or 'skip'
        its damaged part (the report then lists the files and the records lost).
      progress: Called with a :class:`ScanProgress` every ``progress_every`` records and once at the end.
      progress_every: Records between ``progress`` calls.

    Raises:
      DataError: ``label_key`` or ``shard_key`` is not a feature of the records (the message lists those
        of the first record), or any input :class:`TFRecordPipeline` refuses.
    """
    import tensorflow as tf

    from tfdist.data.pipeline.parsing import check_features
    from tfdist.data.records.files import compression_of

    if not isinstance(label_key, str) or not label_key:
        raise invalid(DataError, "label_key", label_key, "the name of the label feature (a non-empty string)")
    require_int(DataError, "progress_every", progress_every, minimum=1)
    features = {label_key: label_spec or tf.io.FixedLenFeature([], tf.int64)}
    if shard_key:
        features[shard_key] = tf.io.FixedLenFeature([], tf.int64)
    # The report runs each worker's real record stream (the pipeline's own sharding code), so it is exact.
    probe_for = functools.partial(_probe, files, shard_policy=shard_policy, shard_key=shard_key, on_corrupt=on_corrupt)
    probe = probe_for(features)
    listing = probe.listing()
    plan = probe.plan(num_workers, listing)
    first = plan.files_for(0)[0]
    dtype = _label_dtype(first, label_key, shard_key)
    if label_spec is None and dtype is not None:  # A string or float label is read as one.
        features[label_key] = tf.io.FixedLenFeature([], getattr(tf, dtype))
        probe = probe_for(features)
    check_features(first, compression_of(first, "auto") or "", probe.parsing)
    known = listing.records([f.path for f in listing.files])
    scan = _Scan(
        progress,
        progress_every,
        num_workers,
        None if known is None else known * (num_workers if plan.policy == "off" else 1),
    )
    counts, reports = [], []
    for worker in range(num_workers):
        share, report = probe.worker_records(worker, num_workers, plan=plan, listing=listing)
        reports.append(report)
        scan.files += len(plan.files_for(worker))
        counts.append(_count_labels(share, features, label_key, min(_READ_BATCH, progress_every), scan, worker))
    scan.finish(num_workers - 1)
    return _report(label_key, plan, listing, counts, reports)


def _probe(
    files: Any, features: Mapping[str, Any], *, shard_policy: str, shard_key: str | None, on_corrupt: str
) -> TFRecordPipeline:
    """The pipeline whose worker streams the report reads: one record per batch, in a fixed order."""
    from tfdist.data.pipeline.tfrecord import TFRecordPipeline

    return TFRecordPipeline(
        files=files,
        features=dict(features),
        batch_size=1,
        shard_policy=shard_policy,
        shard_key=shard_key,
        on_corrupt=on_corrupt,
        deterministic=True,
    )


def _label_dtype(first: str, label_key: str, shard_key: str | None) -> str | None:
    """Checks the keys against the features of the file ``first``; the label's dtype if a float or a string.

    None when the label is an int64, or the first record cannot be read (the reader then reports it).
    """
    from tfdist.data.records.files import compression_of

    kinds = _first_features(first, compression_of(first, "auto") or "")
    if kinds is None:
        return None
    _require_feature("label_key", label_key, kinds, first)
    if shard_key:
        _require_feature("shard_key", shard_key, kinds, first)
    return _DTYPES[kinds[label_key]] if kinds[label_key] in ("float", "bytes") else None


def _count_labels(
    share: Any, features: Mapping[str, Any], label_key: str, batch: int, scan: _Scan, worker: int
) -> Counter[str]:
    """The records of each label in one worker's stream ``share``, counted ``batch`` at a time into ``scan`` too."""
    import tensorflow as tf

    counts: Counter[str] = Counter()
    for parsed in share.batch(batch).map(lambda r: tf.io.parse_example(r, features)):
        labels = parsed[label_key].numpy().reshape(-1)
        counts.update(v.decode() if isinstance(v, bytes) else str(v) for v in labels)
        scan.add(len(labels), worker)
    return counts


def _report(
    label_key: str, plan: ShardPlan, listing: Listing, counts: list[Counter[str]], reports: list[VerifyReport]
) -> SkewReport:
    """The report of the per-worker label ``counts`` and corruption ``reports`` of a scan under ``plan``."""
    from tfdist.data.pipeline import stratified

    sizes = dict(listing.sizes)
    corrupt = sorted({path for r in reports for path in r.corrupt_files})
    # Under 'file' each file is checked by one worker; otherwise every worker checks (and reports) every file.
    lost = sum(r.records_lost for r in reports) if plan.policy == "file" else reports[0].records_lost
    return SkewReport(
        policy=plan.policy,
        reason=plan.reason,
        label_key=label_key,
        worker_records=tuple(sum(c.values()) for c in counts),
        worker_bytes=tuple(sum(sizes[p] for p in plan.files_for(worker)) for worker in range(len(counts))),
        worker_classes=tuple(dict(sorted(c.items(), key=lambda item: class_order(item[0]))) for c in counts),
        dataset_bytes=sum(sizes.values()),
        class_groups=len(stratified.class_groups(listing, label_key)),
        corrupt_files=tuple(corrupt),
        records_lost=lost,
        records_lost_exact=all(r.records_lost_exact for r in reports),
    )


class _Scan:
    """Counts a scan's records and calls ``progress`` each ``every`` records (a count, not a clock)."""

    def __init__(self, progress: Callable[[ScanProgress], None] | None, every: int, workers: int, total: int | None):
        self.progress, self.every, self.workers, self.total = progress, every, workers, total
        self.records = self.files = 0
        self.start = time.monotonic()

    def _call(self, worker: int, done: bool) -> None:
        if self.progress is not None:
            self.progress(
                ScanProgress(
                    records=self.records,
                    total=self.total,
                    files=self.files,
                    worker=worker,
                    workers=self.workers,
                    seconds=time.monotonic() - self.start,
                    done=done,
                )
            )

    def add(self, count: int, worker: int) -> None:
        before, self.records = self.records, self.records + count
        if self.records // self.every > before // self.every:
            self._call(worker, done=False)

    def finish(self, worker: int) -> None:
        _log.debug("Skew report: scanned %d records in %.1f s.", self.records, time.monotonic() - self.start)
        self._call(worker, done=True)
