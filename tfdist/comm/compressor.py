"""What a gradient compressor is: a typed config that carries its own bytes, traffic and step.

Each compressor is one frozen, keyword-only dataclass: its fields are its options (PowerSGD's ``rank``,
top-k's ``density``), validated in ``__post_init__``; its class variables and methods are its numbers. It
is registered once, by name, in :mod:`tfdist.comm.registry`, and everything else (``CollectiveConfig``,
``with_communication``, ``compressed_traffic``, ``tfdist plan``) reads it from there. Three kinds, told
apart by type:

* :class:`WireCast` sends every value, cast to ``wire_dtype`` (``none``, ``fp16``, ``bf16``). Its step is
  :func:`tfdist.comm.all_reduce_sum`; the planner models it through ``value_bytes``.
* :class:`TrafficModel` sends something that depends on each weight's shape: ``sent_bytes`` and ``seconds``
  model its collectives, ``compute_seconds`` its step's compute on a host's measured rates
  (:class:`~tfdist.comm.HostRates`), for :func:`tfdist.comm.compressed_traffic` (and ``warmup`` its first
  steps, where they send otherwise: PowerSGD's plain warm-up). Local SGD is one; its step is the Keras
  helper that averages the weights.
* :class:`ErrorFeedback` is a traffic model whose step runs in the gradient all-reduce: it declares the
  state it keeps per gradient (:class:`StateSlot`) and sums the gradients in :meth:`ErrorFeedback.step`
  (PowerSGD, top-k), as a torch DDP communication hook holds its state and its hook in one object.

Example:
    >>> from tfdist.comm import Link, PowerSGD
    >>> power = PowerSGD(rank=4)
    >>> power.sent_bytes([(2048, 1000), (1000,)])  # Two rank-4 factors, the bias, the warm-up's end: float32.
    52772.0
    >>> round(power.seconds([(2048, 1000)], Link(workers=2, bandwidth=1e9, latency=1e-4)) * 1e3, 3)
    0.449
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tfdist.comm.host import HostRates
from tfdist.errors import StrategyError, invalid
from tfdist.plan import Plan

__all__ = ["Collectives", "Compressor", "ErrorFeedback", "Link", "StateSlot", "TrafficModel", "Warmup", "WireCast"]

Shapes = Sequence[Sequence[int]]
Collective = Callable[[Sequence[Any]], Sequence[Any]]  # A list of tensors in, their reduction out.
States = Sequence[Mapping[str, Any]]  # Per gradient, its state tensors by kind.
Step = tuple[list[Any], list[dict[str, Any]]]  # The summed gradients, and per gradient its new state by kind.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Compressor(abc.ABC):
    """A registered way to send gradients: the options are the dataclass's fields, each with a default.

    Attributes:
      name: Its name in the registry (``compression="..."``; ``tfdist plan --compression`` spells ``_`` as
        ``-``).
      value_bytes: Bytes one value it sends whole takes on the wire: the planner's ``bytes_per_value``.
    """

    name: ClassVar[str]
    value_bytes: ClassVar[int] = 4

    def options(self) -> dict[str, Any]:
        """Its options by name, e.g. ``{'rank': 4}``."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class WireCast(Compressor):
    """Every value sent, cast to ``wire_dtype`` and back (:func:`tfdist.comm.all_reduce_sum` casts).

    Attributes:
      wire_dtype: The dtype float gradients travel as, or None for their own.
      wire_max: The largest finite value of ``wire_dtype`` when below float32's: the all-reduce then scales
        by a power of two so no partial sum exceeds it (one extra scalar all-reduce of 4 bytes).
      arithmetic_passes: Reads and writes of every float32 gradient value the casts (and the sums in the
        wire dtype) cost per step, in float32 values: what the planner charges at the memory bandwidth.
    """

    wire_dtype: ClassVar[str | None] = None
    wire_max: ClassVar[float | None] = None
    arithmetic_passes: ClassVar[int] = 0

    def payload_bytes(self, tensors: Sequence[Any]) -> int:
        """Bytes of ``tensors`` (anything with a static ``shape`` and a ``dtype``) in ``wire_dtype``."""
        return sum(
            math.prod(int(d) for d in tensor.shape) * (self.value_bytes if self.wire_dtype else _itemsize(tensor))
            for tensor in tensors
        )

    def wire_bytes(self, tensors: Sequence[Any]) -> int:
        """Bytes one replica hands to the collectives per step: the payload, and the range scale if any."""
        return self.payload_bytes(tensors) + (4 if self.wire_max is not None and len(tensors) else 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrafficModel(Compressor):
    """A compressor whose traffic depends on each weight's shape, in the alpha-beta model of the planner.

    Attributes:
      arithmetic_passes: Reads and writes of every value in :meth:`streamed_values` its arithmetic makes per
        step: what :meth:`compute_seconds` charges at the memory bandwidth unless a compressor says otherwise.
    """

    arithmetic_passes: ClassVar[int]

    @abc.abstractmethod
    def sent_bytes(self, shapes: Shapes) -> float:
        """Bytes one worker hands to the collectives per optimizer step for gradients of ``shapes``."""

    @abc.abstractmethod
    def seconds(self, shapes: Shapes, link: Link) -> float:
        """The collectives' time per step on ``link``."""

    @abc.abstractmethod
    def streamed_values(self, shapes: Shapes) -> float:
        """The values its arithmetic streams through memory per step."""

    def compute_seconds(self, shapes: Shapes, rates: HostRates, *, workers: int) -> float:
        """Its step's compute on a host of ``rates`` among ``workers``: by default :attr:`arithmetic_passes`
        over :meth:`streamed_values` at the memory bandwidth. A compressor whose work is not all a stream through
        memory (a selection, a matrix product, a scatter of what every worker sent) charges that part at the
        rate ``rates`` has for it."""
        del workers  # A stream over one's own gradients costs the same among any number.
        return rates.arithmetic_seconds(self.arithmetic_passes, self.streamed_values(shapes))

    def warmup(self, shapes: Shapes, link: Link) -> Warmup:
        """Its first steps, if they send otherwise than :meth:`sent_bytes` and :meth:`seconds` say (those
        model the steps after them); none by default."""
        return Warmup(steps=0, sent_bytes=0.0, seconds=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Warmup:
    """The first steps of a compressor that send otherwise than the rest (PowerSGD's plain warm-up).

    Attributes:
      steps: How many there are (0: none).
      sent_bytes: Bytes one worker hands to the collectives in each.
      seconds: The collectives' time of each.
    """

    steps: int
    sent_bytes: float
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateSlot:
    """One state tensor an :class:`ErrorFeedback` compressor keeps per compressed gradient.

    Attributes:
      kind: Its key in the step's state mappings and the end of its variable's name ('error', 'q').
      shape: Its shape.
      shared: The same on every replica (saved once); else each replica's own (saved per replica).
      seeded: Starts from a normal distribution of a fixed seed, the same on every replica; else zeros.
    """

    kind: str
    shape: tuple[int, ...]
    shared: bool = False
    seeded: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind.isidentifier():
            raise invalid(StrategyError, "kind", self.kind, "an identifier, e.g. 'error'")
        if not isinstance(self.shape, tuple) or not all(isinstance(d, int) and d > 0 for d in self.shape):
            raise invalid(StrategyError, "shape", self.shape, "a tuple of positive integers")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ErrorFeedback(TrafficModel):
    """A compressor that sends fewer values, each replica keeping what it did not send for its next step.

    Its state lives in optimizer variables (``tfdist.keras.with_communication`` makes them from
    :meth:`state_slots`), so checkpoints carry it.
    """

    def wire_bytes(self, tensors: Sequence[Any]) -> int:
        """Bytes one replica hands to the collectives per step for ``tensors`` (their static shapes)."""
        return int(self.sent_bytes([[int(d) for d in tensor.shape] for tensor in tensors]))

    @abc.abstractmethod
    def state_slots(self, shape: Sequence[int]) -> tuple[StateSlot, ...]:
        """The state it keeps for a gradient of ``shape`` (none: the gradient is summed whole)."""

    @abc.abstractmethod
    def step(self, grads: Sequence[Any], states: States, collectives: Collectives) -> Step:
        """One step in replica context, the same on every replica (TensorFlow).

        Args:
          grads: Dense gradients.
          states: Per gradient, its state by kind (:meth:`state_slots`' tensors; empty when it has none).
          collectives: What it may call across the replicas.

        Returns:
          The sums over the replicas (``grads``' shapes and dtypes), and per gradient its new state by kind.
        """


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collectives:
    """What an :class:`ErrorFeedback` step may call across the replicas, each call one collective.

    Attributes:
      all_reduce: Sums a list of tensors over the replicas as they are (float32, the config's packing).
      all_gather: Concatenates a list of 1-D tensors over the replicas along axis 0.
    """

    all_reduce: Collective
    all_gather: Collective


@dataclasses.dataclass(frozen=True, kw_only=True)
class Link:
    """The ring collectives' alpha-beta times on ``workers`` machines (the all-reduce is Plan's formula).

    Example:
        >>> link = Link(workers=4, bandwidth=1e9, latency=1e-4)
        >>> round(link.ring(4e6) * 1e3, 3), round(link.gather(1e6) * 1e3, 3)
        (6.6, 3.3)
    """

    workers: int
    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        Plan(params=1, workers=self.workers, bandwidth=self.bandwidth, latency=self.latency)  # As the planner.

    def ring(self, nbytes: float) -> float:
        """A ring all-reduce of ``nbytes``."""
        if nbytes <= 0 or self.workers == 1:
            return 0.0
        return Plan(
            params=nbytes / 4, workers=self.workers, bandwidth=self.bandwidth, latency=self.latency
        ).ring_allreduce_s

    def gather(self, nbytes: float) -> float:
        """A ring all-gather in which every worker contributes ``nbytes``."""
        n = self.workers
        return 0.0 if n == 1 else (n - 1) * self.latency + (n - 1) * nbytes / self.bandwidth


def _itemsize(tensor: Any) -> int:
    dtype = tensor.dtype
    size = getattr(dtype, "size", None)
    return int(size if size is not None else dtype.itemsize)
