"""Skew reports: what each worker will read, and how far its class mix is from the global one.

Example:
    >>> from tfdist.data import SkewReport
    >>> report = SkewReport(policy="file", reason="", label_key="y", worker_records=(60, 40),
    ...                     worker_bytes=(600, 400), worker_classes=({"a": 50, "b": 10}, {"a": 20, "b": 20}))
    >>> round(report.record_imbalance, 2)
    1.2
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from tfdist.data.sharding import imbalance

__all__ = ["SkewReport", "skew_report"]


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
class SkewReport:
    """Per-worker record, byte and class counts for one sharding policy.

    ``worker_bytes`` is what each worker *reads*: under 'data' and 'hash' every
    worker reads every file and keeps its share of the records.
    """

    policy: str
    reason: str
    label_key: str
    worker_records: tuple[int, ...]
    worker_bytes: tuple[int, ...]
    worker_classes: tuple[Mapping[str, int], ...]

    @property
    def global_classes(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for classes in self.worker_classes:
            total.update(classes)
        return dict(sorted(total.items(), key=lambda item: class_order(item[0])))

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
        """What to change, in words."""
        tips = []
        if self.record_imbalance > 1.1:
            tips.append(
                f"Workers read unequal shares (max/mean {self.record_imbalance:.2f}): write more, "
                "equal-sized shards, or use shard_policy='data'."
            )
        worst = max(self.class_divergence) if self.class_divergence else 0.0
        if worst > 0.05:
            tips.append(
                f"A worker's class mix differs from the global one by {worst:.0%} (total variation): write "
                "per-class shard groups (write_tfrecords(partition_by=...)) and read with class_weights, or "
                "use shard_policy='data'."
            )
        if self.class_imbalance > 10:
            tips.append(
                f"Classes are skewed {self.class_imbalance:.0f}:1: consider class_weights='sqrt' or "
                "'balanced' in TFRecordPipeline."
            )
        return tips or ["Shares and class mixes are balanced; nothing to change."]

    def to_text(self) -> str:
        """A table for people."""
        classes = list(self.global_classes)
        lines = [
            f"sharding: {self.policy} ({self.reason})",
            f"{'worker':<8}{'records':>10}{'MB':>9}{'TV':>7}  " + " ".join(f"{c:>8}" for c in classes),
        ]
        for i, (records, size, mix, tv) in enumerate(
            zip(self.worker_records, self.worker_bytes, self.worker_classes, self.class_divergence)
        ):
            lines.append(
                f"{i:<8}{records:>10}{size / 1e6:>9.2f}{tv:>7.3f}  " + " ".join(f"{mix.get(c, 0):>8}" for c in classes)
            )
        lines.append(
            f"{'all':<8}{sum(self.worker_records):>10}{sum(self.worker_bytes) / 1e6:>9.2f}{'':>7}  "
            + " ".join(f"{self.global_classes[c]:>8}" for c in classes)
        )
        lines.append(
            f"record imbalance (max/mean): {self.record_imbalance:.3f}; class skew (max/min): "
            f"{self.class_imbalance:.1f}; worst class-mix divergence: {max(self.class_divergence):.3f}"
        )
        lines += [f"- {tip}" for tip in self.advice()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "reason": self.reason,
            "worker_records": list(self.worker_records),
            "worker_bytes": list(self.worker_bytes),
            "worker_classes": [dict(c) for c in self.worker_classes],
            "global_classes": self.global_classes,
            "record_imbalance": self.record_imbalance,
            "class_divergence": list(self.class_divergence),
            "class_imbalance": self.class_imbalance,
            "advice": self.advice(),
        }

    def plot(self, path: str) -> None:
        """Draws per-worker class histograms to ``path`` (needs matplotlib: ``pip install tfdist[bench]``)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        classes = list(self.global_classes)
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        width = 0.8 / len(self.worker_classes)
        for i, mix in enumerate(self.worker_classes):
            left.bar(
                [c + i * width for c in range(len(classes))],
                [mix.get(k, 0) for k in classes],
                width,
                label=f"worker {i}",
            )
        left.set_xticks([c + 0.4 - width / 2 for c in range(len(classes))], classes)
        left.set_title(f"records per class and worker ({self.label_key})")
        left.legend()
        right.bar(range(len(self.worker_records)), self.worker_records)
        right.set_xticks(range(len(self.worker_records)))
        right.set_title(f"records per worker (imbalance {self.record_imbalance:.2f})")
        right.set_xlabel("worker")
        fig.suptitle(f"sharding: {self.policy}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def skew_report(
    files: Any,
    *,
    label_key: str,
    num_workers: int,
    shard_policy: str = "auto",
    shard_key: str | None = None,
    label_spec: Any | None = None,
) -> SkewReport:
    """Reads the labels of every record and reports each worker's share under ``shard_policy``.

    Args:
      files: A glob or list of TFRecord files.
      label_key: The label feature.
      num_workers: Workers to split over.
      shard_policy: As in :class:`TFRecordPipeline` ('hash' needs ``shard_key``).
      shard_key: The hashed feature for 'hash'.
      label_spec: The label's ``tf.io`` feature spec; default an int64 scalar.
    """
    import tensorflow as tf

    from tfdist.data.pipeline.parsing import check_features
    from tfdist.data.pipeline.tfrecord import TFRecordPipeline
    from tfdist.data.records.files import compression_of

    spec = label_spec or tf.io.FixedLenFeature([], tf.int64)
    features = {label_key: spec}
    if shard_key:
        features[shard_key] = tf.io.FixedLenFeature([], tf.int64)
    # The report runs each worker's real record stream (the pipeline's own sharding code), so it is exact.
    probe = TFRecordPipeline(
        files=files, features=features, batch_size=1, shard_policy=shard_policy, shard_key=shard_key, deterministic=True
    )
    listing = probe.listing()
    plan = probe.plan(num_workers, listing)
    sizes = dict(listing.sizes)
    records, nbytes, classes = [], [], []
    for worker in range(num_workers):
        share, _ = probe.worker_records(worker, num_workers, plan=plan, listing=listing)
        if worker == 0:
            first = plan.files_for(0)[0]
            check_features(first, compression_of(first, "auto") or "", probe.parsing)
        stream = share.batch(8192).map(lambda r: tf.io.parse_example(r, features))
        counts: Counter[str] = Counter()
        for batch in stream:
            counts.update(v.decode() if isinstance(v, bytes) else str(v) for v in batch[label_key].numpy().reshape(-1))
        records.append(sum(counts.values()))
        nbytes.append(sum(sizes[p] for p in plan.files_for(worker)))
        classes.append(dict(sorted(counts.items(), key=lambda item: class_order(item[0]))))
    return SkewReport(
        policy=plan.policy,
        reason=plan.reason,
        label_key=label_key,
        worker_records=tuple(records),
        worker_bytes=tuple(nbytes),
        worker_classes=tuple(classes),
    )
