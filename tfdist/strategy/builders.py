"""Distribution strategy builders over a registry, never ``None``.

Example:
    >>> import tfdist
    >>> strategy = tfdist.build_strategy("default")
    >>> strategy.num_replicas_in_sync
    1
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tfdist._names import describe_choices
from tfdist.cluster.spec import ClusterLike, ClusterSpec, resolve_cluster
from tfdist.cluster.trainable import check_trainable, cluster_kind
from tfdist.errors import StrategyError, check_keywords, invalid, require_int, require_number, require_type
from tfdist.runtime.watchdog import watch_steps

if TYPE_CHECKING:
    import tensorflow as tf

    from tfdist.comm.autotune import CollectiveTuning

__all__ = [
    "StrategyOptions",
    "build_strategy",
    "choose_kind",
    "cluster_coordinator",
    "communication_options",
    "register_strategy",
    "resolve_options",
    "strategy_names",
    "variable_partitioner",
]

_log = logging.getLogger("tfdist.strategy.builders")

COMMUNICATIONS = ("auto", "ring", "nccl")
PARTITIONS = ("none", "min_size", "max_size", "fixed")
_STARTUP_FIX = (
    "Build the strategy first thing in main(), before any tensor, variable, dataset or model "
    "is created: TensorFlow configures collectives and threads only at program start-up."
)

Builder = Callable[["StrategyOptions", ClusterSpec | None], "tf.distribute.Strategy"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StrategyOptions:
    """Validated options shared by every strategy builder.

    Args:
      communication: Collective implementation for multi-worker mirrored:
        'auto' (NCCL on GPUs, RING otherwise), 'ring' or 'nccl'.
      bytes_per_pack: Pack gradients into chunks of this many bytes per
        all-reduce; 0 lets TensorFlow decide.
      timeout_seconds: Abort a collective that takes longer; None waits forever.
      partition: Variable partitioning for parameter servers: 'none',
        'min_size', 'max_size' or 'fixed'.
      min_shard_bytes: Smallest shard for 'min_size' (256 KiB default).
      max_shard_bytes: Largest shard for 'max_size' (required there).
      max_shards: Shard cap for 'min_size'/'max_size'; default the ps count.
      num_shards: Shards for 'fixed'; default the ps count.
      inter_op_threads: Coordinator inter-op threads for parameter servers;
        default raises them to workers + 1 on machines with fewer cores.
      devices: Devices for 'mirrored'; default every local GPU (or the CPU).
      device: Device for 'one_device'; default the first GPU, else the CPU.
      peer_wait_seconds: Before TensorFlow dials its peers, wait up to this
        long for their ports, logging who is missing every 10 s: under
        multi-worker mirrored every task but the leader waits for the leader
        (a failed first dial costs a ~1 s gRPC reconnect backoff); under
        parameter servers the coordinator waits for every worker and ps (TF
        itself waits silently). 0 disables.

    Example:
        >>> StrategyOptions(communication="ring", bytes_per_pack=4 << 20).bytes_per_pack
        4194304
    """

    communication: str = "auto"
    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    partition: str = "min_size"
    min_shard_bytes: int = 256 << 10
    max_shard_bytes: int | None = None
    max_shards: int | None = None
    num_shards: int | None = None
    inter_op_threads: int | None = None
    devices: tuple[str, ...] | None = None
    device: str | None = None
    peer_wait_seconds: float = 300.0

    def __post_init__(self) -> None:
        for name, choices in (("communication", COMMUNICATIONS), ("partition", PARTITIONS)):
            value = getattr(self, name)
            if value not in choices:
                raise invalid(StrategyError, name, value, describe_choices(value, choices))
        require_int(StrategyError, "bytes_per_pack", self.bytes_per_pack, minimum=0)
        require_int(StrategyError, "min_shard_bytes", self.min_shard_bytes, minimum=1)
        for name in ("max_shard_bytes", "max_shards", "num_shards", "inter_op_threads"):
            if getattr(self, name) is not None:
                require_int(StrategyError, name, getattr(self, name), minimum=1)
        require_number(
            StrategyError,
            "timeout_seconds",
            self.timeout_seconds,
            above=0,
            allow_none=True,
            fix="Use None to wait forever.",
        )
        require_number(
            StrategyError,
            "peer_wait_seconds",
            self.peer_wait_seconds,
            minimum=0,
            fix="Use 0 to let TensorFlow dial the leader without waiting.",
        )
        if self.partition == "max_size" and self.max_shard_bytes is None:
            raise invalid(
                StrategyError,
                "max_shard_bytes",
                None,
                "a byte count with partition='max_size'",
                "Pass max_shard_bytes=..., or use partition='min_size'.",
            )
        require_type(StrategyError, "device", self.device, (str, type(None)), "a device name such as '/gpu:0', or None")
        if self.devices is not None:
            devices = tuple(self.devices) if isinstance(self.devices, (list, tuple)) else None
            if devices is None or not all(isinstance(d, str) and d for d in devices):
                raise invalid(
                    StrategyError,
                    "devices",
                    self.devices,
                    "a list of device names, or None",
                    "Example: devices=('/gpu:0', '/gpu:1').",
                )
            object.__setattr__(self, "devices", devices)


# ------------------------------------------------------------------ registry
_BUILDERS: dict[str, Builder] = {}


def register_strategy(name: str) -> Callable[[Builder], Builder]:
    """Registers ``builder(options, cluster)`` under ``name`` for :func:`build_strategy`."""

    def decorator(builder: Builder) -> Builder:
        if name in _BUILDERS:
            raise invalid(StrategyError, "name", name, "a name not registered yet")
        _BUILDERS[name] = builder
        return builder

    return decorator


def strategy_names() -> tuple[str, ...]:
    """The registered strategy kinds."""
    return tuple(sorted(_BUILDERS))


def build_strategy(
    kind: str = "auto",
    *,
    cluster: ClusterLike = None,
    tuning: str | os.PathLike[str] | CollectiveTuning | None = None,
    **options: Any,
) -> tf.distribute.Strategy:
    """Builds a distribution strategy; call it before any other TensorFlow op.

    Under ``tfdist-launch --stall-seconds`` it also starts the step watchdog the launcher's stall inspector
    reads (:mod:`tfdist.runtime.watchdog`: a thread that samples this process's stacks); else nothing more.

    Args:
      kind: One of :func:`strategy_names`: 'auto', 'default', 'one_device',
        'mirrored', 'multi_worker_mirrored', 'parameter_server'.
      cluster: A ClusterSpec, TF_CONFIG JSON/mapping, or None to read the
        ``TF_CONFIG`` variable (no variable: this machine alone).
      tuning: A :class:`tfdist.comm.autotune.CollectiveTuning` or the path of its
        JSON (from :func:`tfdist.comm.autotune.autotune_collectives`): sets
        ``bytes_per_pack`` unless ``options`` set it explicitly.
      **options: Fields of :class:`StrategyOptions`.

    Returns:
      A ``tf.distribute.Strategy``; never None ('default' when nothing is
      distributed).

    Raises:
      StrategyError: Unknown kind, invalid options, or a strategy TensorFlow
        cannot create at this point.
      ClusterSpecError: The cluster or TF_CONFIG is invalid.
    """
    if not isinstance(kind, str) or kind not in _BUILDERS:
        raise invalid(StrategyError, "kind", kind, describe_choices(kind, _BUILDERS))
    opts = resolve_options(tuning=tuning, **options)
    spec = resolve_cluster(cluster)
    if spec is not None:
        _log.info("Cluster: %s", spec.describe())
    strategy = _BUILDERS[kind](opts, spec)
    _log.info("Built %s with %d replica(s) in sync.", type(strategy).__name__, strategy.num_replicas_in_sync)
    _prepare_keras3(strategy)
    watch_steps()  # for the launcher's stall inspector, when it asks (`stall_seconds`); else nothing
    return strategy


def _prepare_keras3(strategy: tf.distribute.Strategy) -> None:
    """Keras 3 under a distributing strategy: its multi-worker fit fixed, or refused with the reason.

    See tfdist._compat.keras3: installed now if Keras 3 is imported, else when it is.
    """
    import tensorflow as tf

    from tfdist._compat import prepare_keras3

    kinds = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)
    if isinstance(strategy, (*kinds, tf.distribute.ParameterServerStrategy)):
        _log.info("Keras 3: %s.", prepare_keras3())


def resolve_options(
    *, tuning: str | os.PathLike[str] | CollectiveTuning | None = None, **options: Any
) -> StrategyOptions:
    """The :class:`StrategyOptions` that :func:`build_strategy` uses: ``options`` over the tuning file's.

    Example:
        >>> resolve_options(bytes_per_pack=1024).bytes_per_pack
        1024
    """
    if tuning is not None:
        from tfdist.comm.autotune import CollectiveTuning

        loaded = CollectiveTuning.of(tuning)
        options = {**loaded.strategy_options(), **options}
        _log.info("Collective tuning: %s", loaded.strategy_options())
    check_keywords(StrategyError, "options", options, [f.name for f in dataclasses.fields(StrategyOptions)])
    return StrategyOptions(**options)


# ------------------------------------------------------------------ choices
def choose_kind(cluster: ClusterSpec | None, num_gpus: int) -> tuple[str, str]:
    """What 'auto' builds, and why. Pure: no TensorFlow needed.

    Example:
        >>> choose_kind(None, num_gpus=0)
        ('default', 'no cluster and at most one GPU')
    """
    kind, reason = cluster_kind(cluster)  # The cluster's half of the choice: tfdist.cluster.trainable.
    if kind is not None:
        return kind, reason
    if num_gpus > 1:
        return "mirrored", f"{num_gpus} local GPUs"
    return "default", "no cluster and at most one GPU" if cluster is None else reason


def communication_options(
    options: StrategyOptions, *, num_gpus: int
) -> tf.distribute.experimental.CommunicationOptions:
    """Maps options to TensorFlow's ``CommunicationOptions``.

    'nccl' on a host without GPUs is an error rather than a silent fallback:
    the request cannot be honoured and the same script on a GPU host would
    behave differently. Use 'auto' for scripts that run on both.
    """
    import tensorflow as tf

    impl = tf.distribute.experimental.CommunicationImplementation
    if options.communication == "nccl" and num_gpus == 0:
        raise invalid(
            StrategyError,
            "communication",
            "nccl",
            "'ring' or 'auto' on a host without GPUs",
            "NCCL runs only between GPUs; use communication='auto' (NCCL on GPUs, RING on CPUs).",
        )
    implementation = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[options.communication]
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=options.bytes_per_pack, timeout_seconds=options.timeout_seconds, implementation=implementation
    )


def variable_partitioner(options: StrategyOptions, *, num_ps: int) -> Callable[..., Any] | None:
    """TensorFlow's partitioner for ``options.partition`` (None for 'none')."""
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    if options.partition == "none":
        return None
    if options.partition == "fixed":
        return partitioners.FixedShardsPartitioner(num_shards=options.num_shards or num_ps)
    if options.partition == "max_size":
        return partitioners.MaxSizePartitioner(
            max_shard_bytes=options.max_shard_bytes, max_shards=options.max_shards or num_ps
        )
    return partitioners.MinSizePartitioner(
        min_shard_bytes=options.min_shard_bytes, max_shards=options.max_shards or num_ps
    )


def _wait_for_leader(cluster: ClusterSpec, timeout: float) -> None:
    from tfdist.cluster.probe import wait_until_reachable

    leader = cluster.leader  # The coordination-service leader TensorFlow picks.
    if leader is None or cluster.task is None or cluster.is_chief or cluster.task_type == "evaluator":
        return
    name, address = leader.name, leader.address
    if not wait_until_reachable(name, address, timeout):
        _log.warning(
            "%s at %s did not answer within %.0fs; handing over to TensorFlow, which keeps trying.",
            name,
            address,
            timeout,
        )


def _wait_for_servers(cluster: ClusterSpec, timeout: float) -> None:
    """The coordinator connects to every worker and ps; TF waits silently for missing ones, so say who."""
    import time

    from tfdist.cluster.probe import wait_until_reachable

    deadline = time.monotonic() + timeout
    for task in cluster.tasks():
        if task.type in ("worker", "ps"):
            remaining = max(0.0, deadline - time.monotonic())
            if not wait_until_reachable(task.name, task.address, remaining):
                _log.warning(
                    "%s at %s did not answer within %.0fs; handing over to TensorFlow, which waits for it.",
                    task.name,
                    task.address,
                    timeout,
                )


@contextlib.contextmanager
def _at_startup(what: str) -> Iterator[None]:
    """Wraps one TensorFlow call that configures process-wide state, which TF allows only before it initializes.

    TensorFlow raises ``RuntimeError`` from these calls exactly when its context already exists, so here (and
    only here) a ``RuntimeError`` means "too late" and becomes a :class:`StrategyError` that says what to do.
    """
    try:
        yield
    except RuntimeError as err:
        raise StrategyError(
            f"Cannot {what} now: {err}. {_STARTUP_FIX}",
            field="build_strategy",
            expected="a call before TensorFlow initializes",
            fix=_STARTUP_FIX,
        ) from err


def _num_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


# ------------------------------------------------------------------ builders
@register_strategy("default")
def _default(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    import tensorflow as tf

    return tf.distribute.get_strategy()


@register_strategy("one_device")
def _one_device(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    import tensorflow as tf

    device = options.device or ("/gpu:0" if _num_gpus() else "/cpu:0")
    return tf.distribute.OneDeviceStrategy(device)


@register_strategy("mirrored")
def _mirrored(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(devices=list(options.devices) if options.devices else None)


@register_strategy("multi_worker_mirrored")
def _multi_worker_mirrored(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    import tensorflow as tf

    from tfdist.strategy.resolver import cluster_resolver

    if cluster is not None and cluster.num_ps:
        raise invalid(
            StrategyError,
            "kind",
            "multi_worker_mirrored",
            "a cluster without ps tasks",
            "Use kind='parameter_server' (or 'auto') for a cluster with ps tasks.",
        )
    check_trainable(cluster, "multi_worker_mirrored")  # Before TF: its own error for these is a raw ValueError.
    comm = communication_options(options, num_gpus=_num_gpus())
    resolver = cluster_resolver(cluster) if cluster is not None else None
    if cluster is not None and cluster.num_workers > 1 and options.peer_wait_seconds:
        _wait_for_leader(cluster, options.peer_wait_seconds)
    with _at_startup("build the 'multi_worker_mirrored' strategy"):  # It configures collective ops.
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=comm)


@register_strategy("parameter_server")
def _parameter_server(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    import tensorflow as tf

    from tfdist.strategy.resolver import cluster_resolver

    if cluster is None or not cluster.num_ps:
        raise invalid(
            StrategyError,
            "cluster",
            cluster,
            "a cluster with a chief, workers and ps tasks",
            "Launch with `tfdist-launch --chief --workers N --ps M` or set TF_CONFIG accordingly.",
        )
    if check_trainable(cluster, "parameter_server").role == "server":
        raise invalid(
            StrategyError,
            "task_type",
            cluster.task_type,
            "'chief' (the coordinator)",
            "Worker and ps tasks of a ParameterServerStrategy cluster run a TensorFlow server, not "
            "user code: `tfdist-launch` starts them, or call tfdist.launch.run_server().",
        )
    if os.environ.get("GRPC_FAIL_FAST") != "use_caller":
        _log.warning(
            "GRPC_FAIL_FAST is not 'use_caller': the coordinator may wait long on a dead worker. "
            "Set GRPC_FAIL_FAST=use_caller before starting the coordinator (tfdist-launch does)."
        )
    threads = options.inter_op_threads
    if threads is None and (os.cpu_count() or 1) < cluster.num_workers + 1:
        threads = cluster.num_workers + 1
    if threads is not None and tf.config.threading.get_inter_op_parallelism_threads() < threads:
        with _at_startup("raise the inter-op threads for the 'parameter_server' strategy"):
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        _log.info(
            "Inter-op threads raised to %d so the coordinator can drive %d workers.", threads, cluster.num_workers
        )
    if options.peer_wait_seconds:
        _wait_for_servers(cluster, options.peer_wait_seconds)
    partitioner = variable_partitioner(options, num_ps=cluster.num_ps)
    with _at_startup("build the 'parameter_server' strategy"):  # It sets the server definition.
        return tf.distribute.ParameterServerStrategy(cluster_resolver(cluster), variable_partitioner=partitioner)


@register_strategy("auto")
def _auto(options: StrategyOptions, cluster: ClusterSpec | None) -> tf.distribute.Strategy:
    kind, reason = choose_kind(cluster, _num_gpus())
    _log.info("Strategy 'auto' chose '%s': %s.", kind, reason)
    return _BUILDERS[kind](options, cluster)


def cluster_coordinator(strategy: tf.distribute.Strategy) -> tf.distribute.coordinator.ClusterCoordinator:
    """The ``ClusterCoordinator`` for a parameter-server strategy (one per strategy)."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise invalid(
            StrategyError,
            "strategy",
            type(strategy).__name__,
            "a ParameterServerStrategy",
            "Only parameter-server training uses a coordinator; build it with kind='parameter_server'.",
        )
    return tf.distribute.coordinator.ClusterCoordinator(strategy)
