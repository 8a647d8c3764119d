"""The skew report's figure (matplotlib, an optional dependency: the ``plot`` extra).

Built on ``matplotlib.figure.Figure`` alone: no pyplot, so no global backend or figure registry is touched
(``Figure.savefig`` renders a PNG with Agg).
"""

from __future__ import annotations

from typing import Any

from tfdist.errors import RuntimeFailure
from tfdist.runtime.versions import install_hint

INSTALL = install_hint("plot")
_MANY_CLASSES = 12  # Above this, class labels are drawn rotated.


def figure(report: Any, *, threshold: float) -> Any:
    """Records per class and worker (log axis), records per worker, and class-mix divergence per worker.

    ``report`` is a :class:`tfdist.data.report.SkewReport` (typed loosely: that module imports this one).

    Raises:
      RuntimeFailure: matplotlib is not installed (the message says how to install it).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise RuntimeFailure(
            f"Plotting the skew report needs matplotlib: {INSTALL}.",
            field="matplotlib",
            value="not installed",
            fix=INSTALL,
        ) from err
    classes = list(report.global_classes)
    workers = len(report.worker_classes)
    fig = Figure(figsize=(15, 4.5), layout="constrained")
    counts, shares, divergence = fig.subplots(1, 3, gridspec_kw={"width_ratios": [3, 1, 1]})
    width = 0.8 / max(workers, 1)
    for i, mix in enumerate(report.worker_classes):
        counts.bar(
            [c + i * width for c in range(len(classes))],
            [mix.get(k, 0) for k in classes],
            width,
            label=f"worker {i}",
        )
    counts.set_yscale("log")  # A linear axis hides tail classes (31 records beside 2,011).
    counts.set_ylim(bottom=0.8)
    counts.set_ylabel("records (log scale)")
    counts.set_xlabel(f"class ({report.label_key})")
    counts.set_xticks(
        [c + 0.4 - width / 2 for c in range(len(classes))],
        classes,
        rotation=90 if len(classes) > _MANY_CLASSES else 0,
    )
    counts.set_title("records per class and worker")
    counts.legend(fontsize="small")
    shares.bar(range(workers), report.worker_records, color="tab:gray")
    shares.set_xticks(range(workers))
    shares.set_xlabel("worker")
    shares.set_ylabel("records")
    shares.set_title(f"records (max/mean {report.record_imbalance:.2f})")
    divergence.bar(range(workers), report.class_divergence, color="tab:red", label="class-mix divergence")
    divergence.axhline(threshold, color="black", linestyle="--", linewidth=1, label=f"advice above {threshold:g}")
    divergence.set_ylim(0, max(1.0 if max(report.class_divergence, default=0) > 0.5 else 0.5, threshold * 2))
    divergence.set_xticks(range(workers))
    divergence.set_xlabel("worker")
    divergence.set_ylabel("total variation from the global mix")
    divergence.set_title("class-mix divergence")
    divergence.legend(fontsize="small")
    fig.suptitle(f"sharding: {report.policy} ({report.reason})", fontsize="medium")
    return fig
