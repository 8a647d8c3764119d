"""A communication and memory cost model for data-parallel, parameter-server and model-parallel training.

Alpha-beta model: sending ``n`` bytes over one link costs ``latency + n / bandwidth``.

Example:
    >>> from tfdist.plan import Plan, parse_quantity
    >>> plan = Plan(params=parse_quantity("25.6M"), workers=4, bandwidth=parse_quantity("10Gbps", "bandwidth"),
    ...             latency=parse_quantity("50us", "time"))
    >>> round(plan.ring_allreduce_s, 4), plan.recommendation
    (0.1232, 'data_parallel')
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from tfdist._names import describe_choices
from tfdist.errors import PlanError, invalid, require_int, require_number, require_type

__all__ = [
    "LAN_LATENCY",
    "OPTIMIZER_SLOTS",
    "EmbeddingTraffic",
    "Plan",
    "PlanError",
    "embedding_traffic",
    "fit_ring",
    "parse_quantity",
]

# A message's latency on a local network (a switch or two; tfdist plan --link's default): what a ring all-reduce
# step waits besides the bytes. Whole-gradient all-reduces of megabytes hardly feel it.
LAN_LATENCY = 50e-6
# Extra per-parameter state each optimizer keeps (in copies of the weights).
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "adamw": 2, "lamb": 2}
_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}  # "b": a billion, for counts ('7B').
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_TIME = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_MAX_MACHINES = 1_000_000
_MAX_DEVICE_MEMORY = float(2**60)
_MAX_PARAMS = 1e15  # A thousand times today's largest models; anything above is a unit mistake.
_NUMBER = r"(?P<value>[0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*"
# Each kind parse_quantity reads, with examples for its error message.
_KINDS = {
    "count": "a count such as '25.6M' or '7B'",
    "bytes": "a size such as '16GiB' or '80GB'",
    "time": "a time such as '50us', '2ms' or '0.1s'",
    "bandwidth": "a bandwidth such as '10Gbps', '100Mbit/s' or '1.25GB/s'",
}


def parse_quantity(text: Any, kind: str = "count", *, field: str | None = None) -> float:
    """Parses counts ('25.6M', '7B' or '7G': a billion), bandwidths ('10Gbps', '1.25GB/s') -> bytes/s,
    sizes ('16GiB') -> bytes, and times ('50us', '2ms') -> seconds.

    ``field`` names the argument in an error (default: ``kind``).

    Example:
        >>> parse_quantity("10Gbps", "bandwidth"), parse_quantity("16GiB", "bytes"), round(parse_quantity("50us", "time"), 9)
        (1250000000.0, 17179869184.0, 5e-05)
        >>> parse_quantity("1.5B"), parse_quantity("70B") == parse_quantity("70G")
        (1500000000.0, True)
    """
    if not isinstance(kind, str) or kind not in _KINDS:
        raise invalid(PlanError, "kind", kind, describe_choices(kind, _KINDS))
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(require_number(PlanError, field or kind, text))
    if not isinstance(text, str):
        raise invalid(PlanError, field or kind, text, f"a number, or {_KINDS[kind]}")
    raw = text.strip()
    low = raw.lower()
    patterns = {
        "count": (rf"^{_NUMBER}(?P<unit>[kmgbt]?)$", lambda v, u: v * _SI[u]),
        "bytes": (rf"^{_NUMBER}(?P<unit>(?:[kmgt]i?)?)b?$", lambda v, u: v * (_IEC.get(u) or _SI[u])),
        "time": (rf"^{_NUMBER}(?P<unit>ns|us|µs|ms|s)$", lambda v, u: v * _TIME[u]),
    }
    if kind == "bandwidth":
        match = re.match(rf"^{_NUMBER}(?P<unit>[kmgt]?)(?P<what>bps|bit/s|b/s|bytes/s|byte/s)$", low)
        if match:
            value = float(match.group("value")) * _SI[match.group("unit")]
            bits = match.group("what") in ("bps", "bit/s") or (match.group("what") == "b/s" and "B/s" not in raw)
            return value / 8 if bits else value
    else:
        pattern, convert = patterns[kind]
        match = re.match(pattern, low)
        if match:
            return convert(float(match.group("value")), match.group("unit"))
    raise invalid(PlanError, field or kind, raw, _KINDS[kind])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """Per-step communication and per-replica memory for one model on one cluster.

    Args:
      params: Trainable parameters.
      workers: Machines (N).
      bandwidth: Link bandwidth per machine, bytes/s.
      latency: One-way message latency, seconds.
      gpus_per_worker: Devices per machine; gradients are first reduced inside
        a machine (assumed free next to the network), then across machines.
      device_memory: Bytes per device; None skips the fit check.
      optimizer: One of :data:`OPTIMIZER_SLOTS`.
      bytes_per_value: 4 for fp32, 2 for fp16/bf16-compressed gradients.
      ps_shards: Parameter-server tasks for the PS estimate; default ``workers``.
      compute_s: Compute time of one step; None skips the ratio.
      embedding_values: Of ``params``, the values in embedding tables; 0 for
        a dense model. With parameter servers only the rows a batch touches
        move, while all-reduce moves the tables' full (dense) gradients.
      embedding_touched: Values in the distinct embedding rows one worker's
        batch reads per step (required with ``embedding_values``).
    """

    params: float
    workers: int
    bandwidth: float
    latency: float
    gpus_per_worker: int = 1
    device_memory: float | None = None
    optimizer: str = "adam"
    bytes_per_value: int = 4
    ps_shards: int | None = None
    compute_s: float | None = None
    embedding_values: float = 0.0
    embedding_touched: float = 0.0

    def __post_init__(self) -> None:
        quantity = "Pass a number; parse_quantity() reads strings such as '25.6M' or '10Gbps'."
        for name in ("params", "bandwidth"):
            require_number(PlanError, name, getattr(self, name), above=0, fix=quantity)
        require_number(PlanError, "latency", self.latency, minimum=0, fix=quantity)
        for name in ("device_memory", "compute_s"):
            require_number(PlanError, name, getattr(self, name), above=0, allow_none=True, fix=quantity)
        for name in ("embedding_values", "embedding_touched"):
            require_number(PlanError, name, getattr(self, name), minimum=0, fix=quantity)
        if self.ps_shards is not None:
            require_int(PlanError, "ps_shards", self.ps_shards, minimum=1, maximum=_MAX_MACHINES)
        require_type(PlanError, "optimizer", self.optimizer, str, describe_choices("", OPTIMIZER_SLOTS))
        for name in ("workers", "gpus_per_worker"):
            require_int(PlanError, name, getattr(self, name), minimum=1, maximum=_MAX_MACHINES)
        if self.device_memory is not None and self.device_memory > _MAX_DEVICE_MEMORY:
            raise invalid(
                PlanError,
                "device_memory",
                self.device_memory,
                "at most 1 EiB per device",
                "Check the unit: '16GiB', '80GB'.",
            )
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise invalid(PlanError, "optimizer", self.optimizer, describe_choices(self.optimizer, OPTIMIZER_SLOTS))
        if self.bytes_per_value not in (2, 4) or isinstance(self.bytes_per_value, bool):
            raise invalid(PlanError, "bytes_per_value", self.bytes_per_value, "4 (fp32) or 2 (fp16/bf16)")
        if not 0 <= self.embedding_values <= self.params:
            raise invalid(
                PlanError, "embedding_values", self.embedding_values, f"between 0 and params ({self.params:g})"
            )
        if not 0 <= self.embedding_touched <= self.embedding_values or (
            self.embedding_values and not self.embedding_touched
        ):
            raise invalid(
                PlanError,
                "embedding_touched",
                self.embedding_touched,
                f"a value in (0, embedding_values={self.embedding_values:g}] when embedding_values is set",
                "Count the values in the distinct rows one worker's batch reads.",
            )
        if self.params > _MAX_PARAMS:
            raise invalid(
                PlanError,
                "params",
                self.params,
                f"at most {_MAX_PARAMS:g} parameters",
                "Check the unit: 'M' is a million, 'G' a billion values.",
            )
        estimates = (self.ring_allreduce_s, self.tree_allreduce_s, self.ps_s, self.memory_per_replica_bytes)
        if not all(math.isfinite(value) for value in estimates):
            raise invalid(
                PlanError,
                "params",
                self.params,
                "sizes and rates whose estimates fit in a float",
                "Check the units: params counts values (e.g. '25.6M'), bandwidth is per machine.",
            )

    @property
    def gradient_bytes(self) -> float:
        return self.params * self.bytes_per_value

    @property
    def ring_allreduce_s(self) -> float:
        """Ring: 2(N-1) steps, each a latency and 1/N of the gradients."""
        n = self.workers
        return 0.0 if n == 1 else 2 * (n - 1) * self.latency + 2 * (n - 1) / n * self.gradient_bytes / self.bandwidth

    @property
    def tree_allreduce_s(self) -> float:
        """Pipelined (double binary) tree: 2 log2(N) latencies, ~2 gradient volumes per link."""
        n = self.workers
        return 0.0 if n == 1 else 2 * math.ceil(math.log2(n)) * self.latency + 2 * self.gradient_bytes / self.bandwidth

    @property
    def ps_s(self) -> float:
        """Push gradients and pull weights: the slower of a worker's link and a ps shard's link.

        For dense gradients a worker moves 2S bytes per step, more than ring
        all-reduce's 2(N-1)/N S, so this model prefers all-reduce for dense
        models. Embedding tables (``embedding_values``) move only the rows a
        batch touches (``embedding_touched``), which is where PS wins.
        """
        shards = self.ps_shards or self.workers
        moved = (self.params - self.embedding_values + self.embedding_touched) * self.bytes_per_value
        worker_link = 2 * moved / self.bandwidth
        ps_link = 2 * self.workers * moved / (shards * self.bandwidth)
        return 2 * self.latency + max(worker_link, ps_link)

    @property
    def memory_per_replica_bytes(self) -> float:
        """Weights + gradients + optimizer slots in fp32 (activations not included)."""
        return self.params * 4 * (2 + OPTIMIZER_SLOTS[self.optimizer])

    @property
    def state_bytes(self) -> float:
        """Weights + optimizer slots in fp32: what a process holds between steps (``sharding_report``'s total)."""
        return self.params * 4 * (1 + OPTIMIZER_SLOTS[self.optimizer])

    @property
    def mesh(self) -> tuple[int, int] | None:
        """``(batch, model)`` axes over every device for a replica that does not fit one; None when it fits.

        The smallest model axis (a power of two dividing the devices) whose share of the replica fits one
        device; the rest of the devices form the batch axis. ``(0, 0)`` when no split of these devices fits.
        Splitting assumes the weights shard evenly (``shard_model`` leaves small tensors whole).

        Example:
            >>> Plan(params=3e9, workers=4, gpus_per_worker=2, bandwidth=1e9, latency=1e-5, device_memory=16 * 2**30).mesh
            (2, 4)
        """
        if self.device_memory is None or self.memory_per_replica_bytes <= self.device_memory:
            return None
        devices, model = self.replicas, 2
        while model <= devices:
            if devices % model == 0 and self.memory_per_replica_bytes / model <= self.device_memory:
                return devices // model, model
            model *= 2
        return 0, 0

    @property
    def recommendation(self) -> str:
        return self._decide()[0]

    @property
    def reasons(self) -> list[str]:
        return self._decide()[1]

    @property
    def replicas(self) -> int:
        """Model replicas in sync: ``workers * gpus_per_worker``."""
        return self.workers * self.gpus_per_worker

    def _decide(self) -> tuple[str, list[str]]:
        gib = 2**30
        reasons = []
        if self.gpus_per_worker > 1:
            reasons.append(
                f"{self.workers} machines x {self.gpus_per_worker} devices = {self.replicas} replicas; each "
                f"machine sums its devices' gradients first (NVLink/PCIe, not modelled), so the network "
                f"estimates span the {self.workers} machines and the global batch is {self.replicas} per-device batches"
            )
        if self.device_memory is not None and self.memory_per_replica_bytes > self.device_memory:
            reasons.append(
                f"one replica needs {self.memory_per_replica_bytes / gib:.1f} GiB for weights, gradients "
                f"and {self.optimizer} state, more than the {self.device_memory / gib:.1f} GiB per device"
            )
            batch, model = self.mesh or (0, 0)
            if model:
                reasons.append(
                    f"a mesh batch={batch},model={model} splits it {model} ways: "
                    f"{self.memory_per_replica_bytes / model / gib:.1f} GiB per device (no activations), "
                    f"{batch} data-parallel replica(s)"
                )
                reasons.append(
                    f"or {model} pipeline stages, one per task (tfdist-launch --chief --workers {model} --run-on "
                    f"chief): about the same per stage if the layers balance, plus the activations of the "
                    f"micro-batches in flight"
                )
            else:
                reasons.append(
                    f"even split over all {self.replicas} devices it needs "
                    f"{self.memory_per_replica_bytes / self.replicas / gib:.1f} GiB per device: add devices"
                )
            return "model_parallel", reasons
        allreduce = min(self.ring_allreduce_s, self.tree_allreduce_s)
        best = "ring" if self.ring_allreduce_s <= self.tree_allreduce_s else "tree"
        reasons.append(
            f"{best} all-reduce of {self.gradient_bytes / 1e6:.1f} MB takes {allreduce * 1e3:.1f} ms per "
            f"step; parameter servers {self.ps_s * 1e3:.1f} ms"
        )
        if self.compute_s is not None:
            ratio = self.compute_s / allreduce if allreduce else math.inf
            reasons.append(f"compute/communication ratio {ratio:.2f} (compute {self.compute_s * 1e3:.1f} ms)")
            if ratio < 1 and self.ps_s < allreduce:
                reasons.append("communication dominates and sharded parameter servers move less per link")
                return "parameter_server", reasons
        if self.ps_s < 0.5 * allreduce:
            if self.embedding_values:
                reasons.append(
                    f"parameter servers move only the embedding rows a batch touches "
                    f"({self.embedding_touched:g} of {self.embedding_values:g} values)"
                )
            reasons.append("sharded parameter servers take less than half the all-reduce time")
            return "parameter_server", reasons
        reasons.append("the replica fits and all-reduce is the cheapest synchronization")
        return "data_parallel", reasons

    def to_dict(self) -> dict[str, Any]:
        """The estimates as JSON-ready values; ``embedding_*`` keys too when the model has embedding tables."""
        allreduce = min(self.ring_allreduce_s, self.tree_allreduce_s)
        embedding = {}
        if self.embedding_values:
            traffic = embedding_traffic(
                table_values=self.embedding_values,
                values_touched_per_step=self.embedding_touched,
                workers=max(2, self.workers),
                bytes_per_value=self.bytes_per_value,
            )
            embedding = {f"embedding_{k}": v for k, v in traffic.to_dict().items()}
        return {
            **embedding,
            "ring_allreduce_s": self.ring_allreduce_s,
            "tree_allreduce_s": self.tree_allreduce_s,
            "ps_s": self.ps_s,
            "memory_per_replica_bytes": self.memory_per_replica_bytes,
            "state_bytes": self.state_bytes,
            "mesh": None if not self.mesh or not self.mesh[1] else f"batch={self.mesh[0]},model={self.mesh[1]}",
            "gradient_bytes": self.gradient_bytes,
            "replicas": self.replicas,
            "compute_communication_ratio": (
                self.compute_s / allreduce if self.compute_s is not None and allreduce else None
            ),
            "recommendation": self.recommendation,
            "reasons": self.reasons,
        }


def fit_ring(samples: list[tuple[float, ...]], *, workers: int | None = None) -> tuple[float, float]:
    """Fits (latency s, bandwidth bytes/s) of the ring model to measured (bytes, seconds[, workers]) all-reduces.

    Least squares on ``t = 2(N-1) * latency + 2(N-1)/N * bytes / bandwidth``,
    weighted by 1/t so small and large messages count alike (relative error).
    A sample's third element is its worker count N (default ``workers``), so
    one fit can span clusters of several sizes.

    Example:
        >>> truth = Plan(params=1, workers=2, bandwidth=1e9, latency=1e-4)
        >>> samples = [(b, 2 * 1e-4 + b / 1e9) for b in (4e3, 1e6, 64e6)]
        >>> [round(v, 6) for v in fit_ring(samples, workers=2)]
        [0.0001, 1000000000.0]
    """
    given = [int(s[2]) if len(s) > 2 else workers for s in samples]
    counts = [n for n in given if n is not None]
    if len(counts) < len(given) or any(n < 2 for n in counts) or len(samples) < 2:
        raise invalid(PlanError, "samples", len(samples), "two or more sizes measured on >= 2 workers each")
    rows = [
        (2 * (n - 1) / s[1], 2 * (n - 1) / n * s[0] / s[1], 1.0)  # Each row divided by t: relative error.
        for s, n in zip(samples, counts)
    ]
    sxx = sum(r[0] * r[0] for r in rows)
    sxy = sum(r[0] * r[1] for r in rows)
    syy = sum(r[1] * r[1] for r in rows)
    sxz = sum(r[0] * r[2] for r in rows)
    syz = sum(r[1] * r[2] for r in rows)
    det = sxx * syy - sxy * sxy
    if det == 0:
        raise invalid(PlanError, "samples", samples, "messages of at least two different sizes")
    latency = (sxz * syy - syz * sxy) / det
    inverse_bandwidth = (sxx * syz - sxy * sxz) / det
    if latency < 0 or inverse_bandwidth <= 0:
        raise invalid(PlanError, "samples", samples, "times that grow with message size")
    return latency, 1.0 / inverse_bandwidth


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingTraffic:
    """Bytes one worker moves per step for embedding tables, PS rows vs dense all-reduce.

    Attributes:
      ps_bytes: Rows pulled from the ps plus their gradients pushed back.
      allreduce_bytes: Ring all-reduce of the tables' full (dense) gradients.
      ratio: ``allreduce_bytes / ps_bytes``: how much less the PS moves.

    Example:
        >>> embedding_traffic(table_values=1000, values_touched_per_step=10, workers=4).to_dict()
        {'ps_bytes': 80.0, 'allreduce_bytes': 6000.0, 'ratio': 75.0}
    """

    ps_bytes: float
    allreduce_bytes: float
    ratio: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in dataclasses.asdict(self).items()}


def embedding_traffic(
    *, table_values: float, values_touched_per_step: float, workers: int, bytes_per_value: int = 4
) -> EmbeddingTraffic:
    """Per-worker bytes per step for embedding tables under parameter servers vs ring all-reduce.

    A PS worker pulls the rows its batch touches and pushes their gradients
    (``2 * touched * bytes``); an all-reduce of the dense table gradients moves
    ``2(N-1)/N * table * bytes`` whatever the batch touched.

    Args:
      table_values: Values (rows x dim, summed over tables) in the embedding tables.
      values_touched_per_step: Values in the distinct rows one worker's batch reads.
      workers: Workers (N) sharing the all-reduce.
      bytes_per_value: 4 for float32.

    Example:
        >>> embedding_traffic(table_values=1e6 * 16, values_touched_per_step=1000 * 16, workers=2).ratio
        500.0
    """
    for name, value in (("table_values", table_values), ("values_touched_per_step", values_touched_per_step)):
        require_number(PlanError, name, value, above=0)
    require_int(PlanError, "workers", workers, minimum=2, fix="An all-reduce needs at least 2 workers.")
    if bytes_per_value not in (2, 4) or isinstance(bytes_per_value, bool):
        raise invalid(PlanError, "bytes_per_value", bytes_per_value, "4 (fp32) or 2 (fp16/bf16)")
    ps_bytes = 2.0 * values_touched_per_step * bytes_per_value
    allreduce_bytes = 2 * (workers - 1) / workers * table_values * bytes_per_value
    return EmbeddingTraffic(ps_bytes=ps_bytes, allreduce_bytes=allreduce_bytes, ratio=allreduce_bytes / ps_bytes)
