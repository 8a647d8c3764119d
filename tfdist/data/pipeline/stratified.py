"""Stratified reading: per-class shard groups sampled in a class mix, or rejection resampling without them.

Example:
    >>> from tfdist.data import FileInfo, Listing
    >>> from tfdist.data.pipeline.stratified import class_groups
    >>> listing = Listing(files=(FileInfo(path="d-y=1-00000-of-00001.tfrecord", size=5),
    ...                          FileInfo(path="d-y=0-00000-of-00001.tfrecord", size=7)))
    >>> list(class_groups(listing, "y"))
    ['0', '1']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist.data.pipeline.options import EpochOptions, ParseOptions, SampleOptions, SourceOptions
from tfdist.data.records import _framing
from tfdist.data.records.files import Listing, compression_of
from tfdist.data.records.writer import CLASS_GROUP, label_of_name
from tfdist.data.sampling import resolve_weights, stratified_sample
from tfdist.data.sharding import plan_shards
from tfdist.errors import DataError, invalid

Group = list[tuple[str, int]]
MEMORY_BUDGET = 256 << 20  # Bytes of small, re-drawn class groups one input pipeline keeps in memory.
ReadShare = Callable[[Any], Any]  # ShardPlan of one class group -> that worker's records of it.


def is_variable(value: object) -> bool:
    from tfdist._compat import is_variable as _is_variable

    return _is_variable(value)


def class_groups(listing: Listing, label_key: str | None) -> dict[str, Group]:
    """Class value -> its (path, size) files, from ``PREFIX-LABEL=VALUE-*`` names; {} if unpartitioned.

    Integer labels come in numeric order (2 before 10): the order of a
    ``tf.Variable`` of class weights.
    """
    groups: dict[str, Group] = {}
    for info in listing.files:
        match = CLASS_GROUP.search(info.path)
        if match is None or match.group("key") != label_key:
            return {}
        label = info.label if info.label is not None else label_of_name(match.group("value"))
        groups.setdefault(label, []).append((info.path, info.size))
    return dict(
        sorted(groups.items(), key=lambda kv: (0, int(kv[0]), "") if kv[0].lstrip("-").isdigit() else (1, 0, kv[0]))
    )


def _records_in(files: Sequence[tuple[str, int]], listing: Listing, source: SourceOptions) -> int:
    """Records in ``files``: from the writer's manifest when it covers them, else a framing walk."""
    known = listing.records([path for path, _ in files])
    if known is not None:
        return known
    return sum(_framing.check_file(path, compression_of(path, source.compression)).records for path, _ in files)


def stratified_records(
    groups: Mapping[str, Group],
    *,
    listing: Listing,
    source: SourceOptions,
    shard_policy: str,
    sample: SampleOptions,
    epoch: EpochOptions,
    index: int,
    count: int,
    read_share: ReadShare,
) -> tuple[Any, str]:
    """This worker's records drawn from the class groups in the asked mix, and a sentence for the log."""
    counts = {label: _records_in(files, listing, source) for label, files in groups.items()}
    # Each class group is split on its own: 'data'/'off' as asked, otherwise 'auto' (by file when the
    # group has enough balanced files, else by record). 'hash' needs parsed keys and is not applied here.
    policy = shard_policy if shard_policy in ("data", "off") else "auto"
    plans = {label: plan_shards(files, num_workers=count, policy=policy) for label, files in groups.items()}
    per_class = {label: read_share(plan) for label, plan in plans.items()}
    share = sum(counts.values()) // count
    weights, mix, natural = _mix(sample.class_weights, counts)
    passes = (
        {}
        if natural
        else {
            label: _pass_of(plan, index, counts[label], groups[label], listing, source) for label, plan in plans.items()
        }
    )
    held = _held_in_memory(passes, mix, share=share, listing=listing, source=source)
    for label in held:
        per_class[label] = _kept(per_class[label], passes[label].records, epoch)
    if natural and epoch.num_epochs is not None:
        # The mix is the data's own: a finite epoch is one pass over this worker's share, each record once.
        per_class = {label: data.repeat(epoch.num_epochs) for label, data in per_class.items()}
        mine = _natural_share(plans, index, counts, groups, listing, source)
        sampled = stratified_sample(
            per_class,
            weights,
            counts=counts,
            seed=epoch.seed,
            block=sample.sample_block,
            on_exhausted="drop",
            draws=None if mine is None else mine * epoch.num_epochs,
        )
        return sampled, f"stratified over {len(groups)} class shard groups, natural mix, each record once"
    # Any other mix re-draws small classes and leaves part of large ones unread in an epoch (its purpose).
    draws = share * epoch.num_epochs if epoch.num_epochs is not None else None
    sampled = stratified_sample(
        per_class,
        weights,
        counts=counts,
        seed=epoch.seed,
        block=sample.sample_block,
        draws=draws,
    )
    sampled = sampled.take(draws) if draws is not None else sampled
    shown = {k: round(p, 3) for k, p in mix.items()} if isinstance(mix, dict) else mix  # A log line to read.
    kept = f", {len(held)} held in memory ({', '.join(held)})" if held else ""
    return sampled, f"stratified over {len(groups)} class shard groups, mix {shown}, {share} records per epoch{kept}"


def _mix(weights: Any, counts: Mapping[str, int]) -> tuple[Any, dict[str, float] | str, bool]:
    """The class weights as the sampler takes them, the mix they give, and whether it is the data's own."""
    if isinstance(weights, Mapping):
        weights = {str(k): v for k, v in weights.items()}
    mix = resolve_weights(weights, counts=counts) if not is_variable(weights) else "a tf.Variable"
    total = sum(counts.values())
    natural = isinstance(mix, dict) and all(abs(p - counts[k] / total) < 1e-9 for k, p in mix.items())
    return weights, mix, natural


def _kept(records: Any, size: int, epoch: EpochOptions) -> Any:
    """One pass of this worker's ``size`` records of a small class, kept after its first read.

    The mix re-draws it many times an epoch (BENCHMARKS.md: 1,000 draws of 31 records), and reopening its
    files cost more than reading them. Each pass is then shuffled anew when the pipeline shuffles (as the
    file order was), in a buffer of the whole pass.
    """
    records = records.cache()
    return records.shuffle(max(1, size), seed=epoch.seed) if epoch.shuffle_buffer else records


def _natural_share(
    plans: Mapping[str, Any],
    index: int,
    counts: Mapping[str, int],
    groups: Mapping[str, Group],
    listing: Listing,
    source: SourceOptions,
) -> int | None:
    """Records worker ``index`` reads in one natural pass over every class group; None when not known cheaply.

    Under 'file' sharding only the writer's manifest counts (a framing walk of this worker's files would
    cost more than the traced function the planned choices save); under 'data'/'off' the group counts
    already taken (manifest or walk) give it. A wrong count loses nothing: past the planned choices,
    stratified_sample drains every class round robin.
    """
    total = 0
    for label, plan in plans.items():
        if plan.policy == "file":
            known = listing.records(plan.files_for(index))
            if known is None:
                return None
            total += known
        else:
            total += _pass_of(plan, index, counts[label], groups[label], listing, source).records
    return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Pass:
    """One worker's pass over a class group: the files it reads, the part of their records it keeps, its records."""

    files: tuple[tuple[str, int], ...]
    part: float
    records: int


def _pass_of(plan: Any, index: int, records: int, files: Group, listing: Listing, source: SourceOptions) -> _Pass:
    """Worker ``index``'s pass under ``plan``: its own files ('file'), every N-th record ('data'), or all ('off')."""
    sizes = dict(files)
    mine = tuple((path, sizes[path]) for path in plan.files_for(index))
    if plan.policy == "file":
        return _Pass(files=mine, part=1.0, records=_records_in(mine, listing, source))
    if plan.policy == "data":
        return _Pass(files=mine, part=1 / plan.num_workers, records=len(range(index, records, plan.num_workers)))
    return _Pass(files=mine, part=1.0, records=records)


def _memory_of(files: Sequence[tuple[str, int]], listing: Listing, source: SourceOptions, room: float) -> float:
    """Bytes ``files``' records take read (uncompressed), or infinity once over ``room``.

    The writer's manifest tells; an uncompressed file is its size; a compressed
    one without a manifest is measured by a framing walk, and only when its
    compressed size still fits (never guessed from the size on disk: GZIP of
    repetitive features expands many times).
    """
    known = {info.path: info.record_bytes for info in listing.files}
    used = 0.0
    for path, size in files:
        compression = compression_of(path, source.compression)
        if known.get(path) is not None:
            used += known[path]  # type: ignore[operator]
        elif compression is None:
            used += size
        elif used + size > room:
            return float("inf")
        else:
            used += _framing.check_file(path, compression).total_bytes
        if used > room:
            return float("inf")
    return used


def _held_in_memory(
    passes: Mapping[str, _Pass], mix: Any, *, share: int, listing: Listing, source: SourceOptions
) -> list[str]:
    """The class groups kept in memory: those the mix draws twice or more an epoch, smallest first, in a budget.

    Each group costs this worker's pass of it, uncompressed: its own files, a
    1/N part of all under 'data', or every record when sharding is 'off'. With a
    ``tf.Variable`` mix (unknown, and changing), the groups smaller than an
    even share of the epoch.
    """

    def redrawn(label: str) -> bool:
        expected = mix[label] * share if isinstance(mix, dict) else share / len(passes)
        return expected > 2 * passes[label].records  # At least two passes: the first one completes.

    on_disk = {label: sum(size for _, size in one.files) * one.part for label, one in passes.items()}
    held, used = [], 0.0
    for label in sorted((label for label in passes if redrawn(label)), key=lambda label: (on_disk[label], label)):
        one = passes[label]
        cost = _memory_of(one.files, listing, source, (MEMORY_BUDGET - used) / one.part) * one.part
        if used + cost > MEMORY_BUDGET:
            continue  # Sorted by size on disk, not in memory: a later group may still fit.
        held.append(label)
        used += cost
    return held


def resample(dataset: Any, *, sample: SampleOptions, parse: ParseOptions, seed: int | None) -> Any:
    """Fallback for unpartitioned files: rejection resampling on the parsed label."""
    import tensorflow as tf

    if not sample.num_classes:
        raise invalid(
            DataError,
            "num_classes",
            sample.num_classes,
            "the class count for stratifying unpartitioned files",
            "Pass num_classes=..., or write files with write_tfrecords(partition_by=label_key).",
        )
    classes = list(range(sample.num_classes))
    if is_variable(sample.class_weights):
        raise invalid(
            DataError,
            "class_weights",
            "tf.Variable",
            "fixed weights for unpartitioned files",
            "Adaptive weights need per-class shard groups (write_tfrecords(partition_by=...)).",
        )
    weights = sample.class_weights
    if isinstance(weights, Mapping):
        weights = {int(k): v for k, v in weights.items()}
    probabilities = resolve_weights(weights, classes=classes)  # type: ignore[arg-type]
    label = parse.label_key
    target = tf.constant([probabilities[c] for c in classes], tf.float32)

    resampled = dataset.rejection_resample(lambda f: tf.cast(tf.reshape(f[label], []), tf.int32), target, seed=seed)
    return resampled.map(lambda _, features: features)


def check_labels(records: Any, *, parse: ParseOptions, num_classes: int | None, where: str) -> None:
    """One pass over the labels of ``records``: every label must be a class in ``[0, num_classes)``.

    Rejection resampling needs it (a label outside would fail deep in the
    graph); it reads the data once more, as the fallback does anyway.
    """
    import tensorflow as tf

    if not num_classes or parse.features is None or parse.label_key is None:
        return
    spec = parse.features[parse.label_key]
    if not getattr(spec, "dtype", tf.string).is_integer:
        return
    key = parse.label_key
    labels = records.batch(8192).map(lambda r: tf.reshape(tf.io.parse_example(r, {key: spec})[key], [-1]))
    low, high = labels.reduce(
        (tf.constant(0, tf.int64), tf.constant(-1, tf.int64)),
        lambda bounds, batch: (
            tf.minimum(bounds[0], tf.reduce_min(tf.concat([tf.cast(batch, tf.int64), [0]], 0))),
            tf.maximum(bounds[1], tf.reduce_max(tf.concat([tf.cast(batch, tf.int64), [-1]], 0))),
        ),
    )
    if int(low) < 0 or int(high) >= num_classes:
        raise invalid(
            DataError,
            "num_classes",
            num_classes,
            f"more than every label of `{key}` (labels run from {int(low)} to {int(high)} in {where})",
            f"Pass num_classes={int(high) + 1} (labels 0..n-1).",
        )
