"""Collective autotuning: time the real all-reduce of your gradients on the live cluster, keep the fastest.

TF's default for multi-worker all-reduce packs every gradient into one message;
on gRPC that is several times slower than packs of a few MB (BENCHMARKS.md).
The best pack size depends on the model, the network and the worker count, so
it is measured, not guessed: :func:`autotune_collectives` runs on every worker
at the same time, all-reduces tensors of the model's gradient shapes with each
candidate, agrees on the winner (the timings are themselves all-reduced, so
every worker picks the same one) and returns a :class:`CollectiveTuning` that
saves to JSON. ``build_strategy(..., tuning=PATH)`` loads it.

Example:
    >>> from tfdist.comm import CollectiveTuning
    >>> tuning = CollectiveTuning(bytes_per_pack=4 << 20, split_bytes=4 << 20)
    >>> tuning.strategy_options()
    {'bytes_per_pack': 4194304}
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import statistics
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tfdist.comm.collective import CollectiveConfig, all_reduce_sum
from tfdist.comm.compressor import WireCast
from tfdist.comm.registry import compressor_for, registered_compressors
from tfdist.errors import StorageError, StrategyError, invalid, require_int

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["DEFAULT_PACK_CANDIDATES", "CollectiveTuning", "all_reduce_timer", "autotune_collectives"]

_log = logging.getLogger("tfdist.comm.autotune")
_MB = 1 << 20
DEFAULT_PACK_CANDIDATES = (0, 1 * _MB, 2 * _MB, 4 * _MB, 8 * _MB, 16 * _MB, 32 * _MB)
_FORMAT = "tfdist-collective-tuning/1"
# The fields a tuning file holds besides the compressor, which it holds by name with its options.
_STORED = ("bytes_per_pack", "split_bytes", "timings_ms", "workers", "total_bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectiveTuning(CollectiveConfig):
    """The tuned collective settings, with the timings that chose them.

    Attributes:
      timings_ms: Candidate pack size (bytes, as text) -> all-reduce time (ms),
        averaged over workers.
      workers: Number of replicas the timings were taken with.
      total_bytes: Bytes of float32 gradients timed, per replica.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "tuning.json")
        >>> CollectiveTuning(bytes_per_pack=1 << 20).save(path)
        >>> CollectiveTuning.load(path).bytes_per_pack
        1048576
    """

    timings_ms: Mapping[str, float] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))
    workers: int = 1
    total_bytes: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.timings_ms, Mapping) or not all(
            isinstance(key, str) and isinstance(ms, (int, float)) and not isinstance(ms, bool) and 0 <= ms < math.inf
            for key, ms in self.timings_ms.items()
        ):
            raise invalid(
                StrategyError, "timings_ms", self.timings_ms, "a mapping of pack size (text) to milliseconds >= 0"
            )
        object.__setattr__(self, "timings_ms", types.MappingProxyType(dict(self.timings_ms)))  # frozen all through
        require_int(StrategyError, "workers", self.workers, minimum=1)
        require_int(StrategyError, "total_bytes", self.total_bytes, minimum=0)

    def strategy_options(self) -> dict[str, int]:
        """The :class:`tfdist.StrategyOptions` fields this tuning sets."""
        return {"bytes_per_pack": self.bytes_per_pack}

    def to_json(self) -> str:
        """The JSON :meth:`save` writes: the compressor by name with its options, and the other fields."""
        body = {field.name: getattr(self, field.name) for field in dataclasses.fields(self) if field.name in _STORED}
        body.update(compression=self.compressor.name, **self.compressor.options(), timings_ms=dict(self.timings_ms))
        return json.dumps({"format": _FORMAT, **body}, indent=1, sort_keys=True)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the JSON atomically (temp file, then rename); on failure nothing is left behind.

        Raises:
          StorageError: ``path`` cannot be written (a directory, no permission, no space).
        """
        tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
        try:
            if os.path.isdir(path):
                raise IsADirectoryError(21, "Is a directory")
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self.to_json() + "\n")
            os.replace(tmp, path)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise StorageError(
                f"Cannot write the tuning file {os.fspath(path)!r}: {err.strerror or err}. "
                "Pass a file path in a writable directory.",
                field="path",
                value=os.fspath(path),
            ) from err

    @classmethod
    def of(cls, tuning: CollectiveTuning | str | os.PathLike) -> CollectiveTuning:
        """``tuning`` itself, or the tuning saved at that path."""
        return tuning if isinstance(tuning, CollectiveTuning) else cls.load(tuning)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CollectiveTuning:
        """Reads a file written by :meth:`save`."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            raise StorageError(
                f"Cannot read the tuning file {os.fspath(path)!r}: {err}. Check the path, or write "
                "it with CollectiveTuning.save().",
                field="tuning",
                value=os.fspath(path),
            ) from err
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as err:
            raise invalid(
                StrategyError,
                "tuning",
                os.fspath(path),
                "a tuning JSON file",
                f"Write it with CollectiveTuning.save() ({err}).",
            ) from err
        if not isinstance(body, dict) or body.pop("format", None) != _FORMAT:
            raise invalid(
                StrategyError,
                "tuning",
                os.fspath(path),
                f"a JSON object with format '{_FORMAT}'",
                "Write it with CollectiveTuning.save().",
            )
        compression = body.pop("compression", "none")
        named = registered_compressors().get(compression) if isinstance(compression, str) else None
        taken = {f.name for f in dataclasses.fields(named)} if named is not None else set()
        options = {key: body.pop(key) for key in sorted(taken & set(body))}
        for key in _options_of_all() - taken:  # Older files hold rank and density whatever the compression.
            body.pop(key, None)
        fields = {f.name for f in dataclasses.fields(cls) if f.name in _STORED}
        unknown = sorted(set(body) - fields)
        if unknown:
            raise invalid(
                StrategyError,
                "tuning",
                unknown,
                f"only the keys {sorted(fields | {'compression'} | taken)}",
                "The file comes from another tfdist version; rerun the autotuner.",
            )
        return cls(compression=compressor_for(compression, options), **body)


def _options_of_all() -> set[str]:
    return {field.name for cls in registered_compressors().values() for field in dataclasses.fields(cls)}


def all_reduce_timer(
    strategy: tf.distribute.Strategy, shapes: Sequence[Sequence[int]], config: CollectiveConfig | None = None
) -> Callable[[], float]:
    """A traced, warmed-up all-reduce of float32 tensors of ``shapes``; each call runs it once, returns seconds.

    Call on every worker in the same order (it is a collective).

    Args:
      strategy: The strategy whose replicas all-reduce.
      shapes: Tensor shapes, e.g. a model's gradient shapes.
      config: How tfdist sends them (:func:`tfdist.comm.collective.all_reduce_sum`);
        None times TF's own ``ReplicaContext.all_reduce`` with the strategy's
        options, i.e. what Keras ``fit`` does with a plain optimizer.
    """
    import tensorflow as tf

    values = [
        strategy.experimental_distribute_values_from_function(lambda context, s=tuple(shape): tf.ones(s, tf.float32))
        for shape in shapes
    ]
    device = strategy.extended.worker_devices[0]

    def replica_fn(*tensors: Any) -> Any:
        with tf.device(device):  # An unplaced tensor has no destination for the all-reduce.
            placed = [tf.identity(t) for t in tensors]
        if config is None:
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, placed)
        return all_reduce_sum(placed, config)

    @tf.function
    def step(*tensors: Any) -> Any:
        return strategy.run(replica_fn, args=tensors)

    def once() -> float:
        start = time.perf_counter()
        result = step(*values)
        first = tf.nest.flatten(result)[0]
        strategy.experimental_local_results(first)[0].numpy()
        return time.perf_counter() - start

    once()  # Trace, and set up the collective groups.
    return once


def autotune_collectives(
    strategy: tf.distribute.Strategy,
    shapes: Sequence[Sequence[int]],
    *,
    candidates: Sequence[int] = DEFAULT_PACK_CANDIDATES,
    compression: str | WireCast = "none",
    repeats: int = 3,
) -> CollectiveTuning:
    """Times the all-reduce of ``shapes`` for each pack size and returns the fastest; call on every worker.

    Each candidate packs into all-reduces of about that many bytes and splits
    larger tensors to the same size (0: TF's default, one pack). The timings
    are all-reduced, so every worker returns the same choice.

    Args:
      strategy: A MultiWorkerMirroredStrategy (or any strategy with replica
        all-reduce), built on every worker.
      shapes: The gradient shapes, e.g. ``[v.shape for v in model.trainable_variables]``.
      candidates: Pack sizes in bytes to try.
      compression: Wire dtype to tune with: 'none', 'fp16' or 'bf16' (or ``BFloat16()``...).
      repeats: Timed rounds; each round runs every candidate once, and each
        candidate's median counts.

    Returns:
      The winning settings and every candidate's time.

    Raises:
      StrategyError: No shapes, no candidates, or invalid candidates.
    """
    import tensorflow as tf

    shapes = [tuple(int(d) for d in s) for s in shapes]
    if not shapes:
        raise invalid(
            StrategyError,
            "shapes",
            shapes,
            "at least one tensor shape",
            "Pass [v.shape for v in model.trainable_variables] after building the model.",
        )
    configs = [CollectiveConfig(compression=compression, bytes_per_pack=c, split_bytes=c) for c in candidates]
    if not configs:
        raise invalid(StrategyError, "candidates", list(candidates), "at least one pack size in bytes")
    timers = [all_reduce_timer(strategy, shapes, config) for config in configs]
    # Rounds over all candidates, not all runs of one candidate in a row: drift on a shared machine then
    # hits every candidate alike.
    runs = [[timer() for timer in timers] for _ in range(repeats)]
    local = [statistics.median(column) for column in zip(*runs)]
    summed = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.experimental_distribute_values_from_function(lambda context: tf.constant(local, tf.float64)),
        axis=None,
    ).numpy()
    mean_ms = [float(t) * 1e3 / strategy.num_replicas_in_sync for t in summed]
    best = min(range(len(configs)), key=lambda i: (mean_ms[i], i))
    timings = {str(c.bytes_per_pack): round(ms, 3) for c, ms in zip(configs, mean_ms)}
    _log.info(
        "Collective autotuning over %d tensors: %s ms; best pack %d bytes.",
        len(shapes),
        timings,
        configs[best].bytes_per_pack,
    )
    total = sum(4 * math.prod(s) for s in shapes)
    return CollectiveTuning(
        compression=compression,
        bytes_per_pack=configs[best].bytes_per_pack,
        split_bytes=configs[best].split_bytes,
        timings_ms=timings,
        workers=strategy.num_replicas_in_sync,
        total_bytes=total,
    )
