"""PowerSGD: rank-``r`` gradient compression with error feedback and warm start (Vogels et al., 2019).

Each gradient that is a matrix (a conv kernel seen as ``[kh*kw*cin, cout]``) travels as two thin factors
instead of itself. On every replica ``w``, with ``M_w`` the gradient plus the error it kept last step and
``Q`` the factor the previous step ended with (the same on every replica: the warm start):

1. ``P = sum_w M_w Q``                                  (all-reduce of ``[n, r]``)
2. ``P = orthogonalize(P)``                             (Gram-Schmidt of the columns)
3. ``Q_w = M_w^T P``; ``Q = sum_w Q_w``                 (all-reduce of ``[m, r]``)
4. the summed gradient is ``P Q^T``; replica ``w`` keeps ``M_w - P Q_w^T`` as its error (the part of its
   own gradient outside the shared subspace) and adds it to its next gradient.

Over any number of steps nothing is lost: the updates applied plus the errors the replicas hold equal the
sum of every gradient (the tests check it against a NumPy reference). Tensors that are not matrices, or
that the factors would not make ``min_compression_rate`` times smaller (``rate * r * (n + m) >= n * m``),
are summed whole; so is every gradient in the first ``warmup_steps`` steps.

:class:`PowerSGD` is the compressor as the registry knows it (``compression="powersgd"``): its rank, the
bytes and time it costs, its state and its step. Which tensors are compressed, and the bytes a step moves:

Example:
    >>> matrix_shape((3, 3, 64, 128), rank=4), matrix_shape((128,), rank=4), matrix_shape((4, 4), rank=4)
    ((576, 128), None, None)
    >>> lowrank_value_count([(3, 3, 64, 128), (128,)], rank=4)
    (2816, 128)
    >>> PowerSGD(rank=4, warmup_steps=0).sent_bytes([(3, 3, 64, 128), (128,)])  # Float32 factors, the bias.
    11776.0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfdist.comm.compressor import (
    Collective,
    Collectives,
    ErrorFeedback,
    Link,
    Shapes,
    States,
    StateSlot,
    Step,
    Warmup,
)
from tfdist.errors import StrategyError, require_int, require_number

if TYPE_CHECKING:
    import tensorflow as tf

    from tfdist.comm.host import HostRates

__all__ = ["PowerSGD", "lowrank_value_count", "matrix_shape", "orthogonalize", "powersgd_sum"]

EPSILON = 1e-8  # Added to a column's norm: a zero column stays zero instead of becoming NaN.
_MAX_WARMUP = 2**24  # steps a float32 counter holds exactly
# Compress a matrix only if its factors are more than this many times smaller (torch's default): below it, a
# matrix saves less than half its bytes on the wire and still costs the whole arithmetic and its error.
MIN_COMPRESSION_RATE = 2.0


def check_rank(rank: int) -> int:
    """``rank`` if it is a valid PowerSGD rank (an int of at least 1); else a StrategyError naming it."""
    require_int(StrategyError, "rank", rank, minimum=1, fix="PowerSGD needs a rank of at least 1, e.g. 4.")
    return rank


def check_rate(min_compression_rate: float) -> float:
    """``min_compression_rate`` if it is a finite number >= 1; else a StrategyError naming it."""
    require_number(
        StrategyError,
        "min_compression_rate",
        min_compression_rate,
        minimum=1.0,
        fix="The fewest times smaller the factors must be than a matrix for it to be compressed, e.g. 2.",
    )
    return float(min_compression_rate)


def matrix_shape(
    shape: Sequence[int], *, rank: int, min_compression_rate: float = MIN_COMPRESSION_RATE
) -> tuple[int, int] | None:
    """The ``(n, m)`` matrix a gradient of ``shape`` is compressed as, or None if it is summed whole.

    A tensor of rank 2 or more is seen as ``[prod(shape[:-1]), shape[-1]]`` (TF kernels keep their output
    dimension last). It is compressed only if both sides exceed ``rank`` and the factors are more than
    ``min_compression_rate`` times smaller (``n * m > rate * rank * (n + m)``; torch's
    ``min_compression_rate``): a tensor that compression would not shrink enough goes whole.

    Example:
        >>> matrix_shape((16, 8), rank=2), matrix_shape((16, 8), rank=2, min_compression_rate=3)
        ((16, 8), None)
    """
    check_rank(rank)
    check_rate(min_compression_rate)
    if len(shape) < 2:
        return None
    n, m = math.prod(int(d) for d in shape[:-1]), int(shape[-1])
    if min(n, m) <= rank or n * m <= min_compression_rate * rank * (n + m):
        return None
    return n, m


def lowrank_value_count(
    shapes: Sequence[Sequence[int]], *, rank: int, min_compression_rate: float = MIN_COMPRESSION_RATE
) -> tuple[int, int]:
    """(values in the P and Q factors, values summed whole) one replica all-reduces per step for ``shapes``."""
    factors = whole = 0
    for shape in shapes:
        view = matrix_shape(shape, rank=rank, min_compression_rate=min_compression_rate)
        if view is None:
            whole += math.prod(int(d) for d in shape)
        else:
            factors += rank * (view[0] + view[1])
    return factors, whole


def orthogonalize(p: tf.Tensor, epsilon: float = EPSILON) -> tf.Tensor:
    """The columns of ``p`` ([n, r]) made orthonormal by modified Gram-Schmidt, in order.

    Gram-Schmidt rather than a QR decomposition: its signs and rounding are the same on every platform, so
    every replica (and a NumPy reference) gets the same ``P``.
    """
    import tensorflow as tf

    columns = tf.unstack(p, axis=1)
    for i in range(len(columns)):
        column = columns[i] / (tf.norm(columns[i]) + epsilon)
        columns[i] = column
        for j in range(i + 1, len(columns)):
            columns[j] = columns[j] - tf.reduce_sum(column * columns[j]) * column
    return tf.stack(columns, axis=1)


def powersgd_sum(
    grads: Sequence[tf.Tensor],
    errors: Sequence[tf.Tensor | None],
    qs: Sequence[tf.Tensor | None],
    *,
    rank: int,
    all_reduce: Collective,
    min_compression_rate: float = MIN_COMPRESSION_RATE,
    warm: tf.Tensor | None = None,
) -> tuple[list[tf.Tensor], list[tf.Tensor | None], list[tf.Tensor | None]]:
    """One step of PowerSGD over ``grads``: their sum over the replicas, and the state for the next step.

    Call in replica context, the same on every replica. ``errors[i]`` and ``qs[i]`` are the error and the
    warm-start factor of ``grads[i]`` (both None where :func:`matrix_shape` is None); ``all_reduce`` sums a
    list of tensors over the replicas (two calls: the P factors, then the Q factors with the whole tensors).

    With ``warm`` (a boolean scalar, the same on every replica), a True step is a warm-up step: every
    gradient is summed whole, and the errors and Q factors stay as they are. The collectives cannot sit in
    a branch (``tf.cond``) under a strategy, so every step makes both calls, and the first also carries the
    compressed gradients as one tensor of dynamic length: all of them while ``warm``, one value after.

    Returns:
      The summed gradients (as ``grads``' shapes and dtypes), the new errors and the new Q factors.
    """
    import tensorflow as tf

    views = [matrix_shape(g.shape.as_list(), rank=rank, min_compression_rate=min_compression_rate) for g in grads]
    _check_state(grads, views, errors, qs)
    compressed = [i for i, view in enumerate(views) if view is not None]
    whole = [i for i, view in enumerate(views) if view is None]
    plain = {i: tf.reshape(tf.cast(grads[i], tf.float32), views[i]) for i in compressed}
    matrices = {i: plain[i] + errors[i] for i in compressed}
    ps = [tf.matmul(matrices[i], qs[i]) for i in compressed]
    warming = warm is not None and bool(compressed)
    first = ps + ([_warm_flat([plain[i] for i in compressed], warm)] if warming else [])
    first = list(all_reduce(first)) if first else []
    ps = [orthogonalize(p) for p in first[: len(ps)]]
    local_qs = [tf.matmul(matrices[i], p, transpose_a=True) for i, p in zip(compressed, ps)]
    summed = list(all_reduce(local_qs + [grads[i] for i in whole])) if local_qs or whole else []
    sums = _warm_sums(first[-1], [plain[i] for i in compressed], warm) if warming else []
    out: list[tf.Tensor] = list(grads)
    new_errors: list[tf.Tensor | None] = [None] * len(grads)
    new_qs: list[tf.Tensor | None] = [None] * len(grads)
    for k, i in enumerate(compressed):
        p, q_local, q_sum = ps[k], local_qs[k], summed[k]
        new_errors[i] = matrices[i] - tf.matmul(p, q_local, transpose_b=True)
        new_qs[i] = q_sum
        total = tf.matmul(p, q_sum, transpose_b=True)
        if sums:  # a warm-up step keeps the state and applies the plain sum
            new_errors[i] = tf.where(warm, errors[i], new_errors[i])
            new_qs[i] = tf.where(warm, qs[i], q_sum)
            total = tf.where(warm, sums[k], total)
        out[i] = tf.cast(tf.reshape(total, tf.shape(grads[i])), grads[i].dtype)
    for k, i in enumerate(whole):
        out[i] = summed[len(compressed) + k]
    return out, new_errors, new_qs


def _check_state(
    grads: Sequence[tf.Tensor],
    views: Sequence[tuple[int, int] | None],
    errors: Sequence[tf.Tensor | None],
    qs: Sequence[tf.Tensor | None],
) -> None:
    for i, (view, error, q) in enumerate(zip(views, errors, qs)):
        if (view is None) != (error is None) or (view is None) != (q is None):
            raise StrategyError(
                f"PowerSGD state of gradient {i} (shape {grads[i].shape.as_list()}) does not match it: "
                f"expected {'no state' if view is None else 'an error and a Q factor'}. Build the state with "
                "matrix_shape().",
                field="grads",
                value=i,
            )


def _warm_flat(matrices: Sequence[tf.Tensor], warm: tf.Tensor) -> tf.Tensor:
    """``matrices`` flattened into one tensor while ``warm``; else its first value (one value sent)."""
    import tensorflow as tf

    flat = tf.concat([tf.reshape(m, [-1]) for m in matrices], axis=0)
    return flat[: tf.where(warm, tf.shape(flat)[0], 1)]


def _warm_sums(sent: tf.Tensor, matrices: Sequence[tf.Tensor], warm: tf.Tensor) -> list[tf.Tensor]:
    """The plain sums of ``matrices`` from the all-reduced :func:`_warm_flat` while ``warm``; else anything of
    their shapes."""
    import tensorflow as tf

    sizes = [int(m.shape[0]) * int(m.shape[1]) for m in matrices]
    flat = tf.pad(sent, [[0, sum(sizes) - tf.shape(sent)[0]]])
    out, start = [], 0
    for matrix, size in zip(matrices, sizes):
        out.append(tf.reshape(flat[start : start + size], tf.shape(matrix)))
        start += size
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerSGD(ErrorFeedback):
    """PowerSGD (``compression="powersgd"``): each matrix as two rank-``rank`` factors, with error feedback.

    Sends per step ``rank * (n + m)`` float32 values per compressed ``[n, m]`` matrix and every other tensor
    whole, in two ring all-reduces (the P factors; the Q factors with the whole tensors). Its arithmetic
    streams the compressed matrices 10 times (``arithmetic_passes``): ``g + e`` (3), ``M Q`` (1), ``M^T P``
    (1), ``P Q_w^T`` (1), ``M - P Q_w^T`` (3), ``P Q^T`` (1). The 4 thin products (``matmul_passes``) run
    well below a plain stream on CPUs: :meth:`compute_seconds` charges them at the host's
    ``matmul_bandwidth`` (at rank 1, matrix-vector products, its ``matvec_bandwidth``), the other 6 at its
    memory bandwidth. Per compressed gradient it keeps the replica's
    error (``[n, m]``) and the warm-start ``Q`` (``[m, rank]``, the same on every replica).

    As torch's PowerSGD hook does, it starts with ``warmup_steps`` steps of plain all-reduce
    (``start_powerSGD_iter``), then compresses from zero errors and the seeded ``Q``; and it sends whole
    every matrix that the factors would not make more than ``min_compression_rate`` times smaller (torch's
    ``min_compression_rate``). The defaults are 25 steps (torch: 1,000; on the digits benchmark longer
    warm-ups cost rank 1 loss after 200 steps, and none helped: BENCHMARKS.md) and torch's 2. With a
    warm-up, each compressed gradient also keeps the steps taken so far (``steps``, shared), so a resumed
    run continues the warm-up where it was. :meth:`sent_bytes` and :meth:`seconds` model the steps after
    the warm-up (one value more than without one: the warm-up's sum, ended); :meth:`warmup` the warm-up's.

    Example:
        >>> PowerSGD(rank=2).state_slots((32, 16))[1]
        StateSlot(kind='q', shape=(16, 2), shared=True, seeded=True)
        >>> [slot.kind for slot in PowerSGD(rank=2).state_slots((32, 16))]
        ['error', 'q', 'steps']
        >>> [slot.kind for slot in PowerSGD(rank=2, warmup_steps=0).state_slots((32, 16))]
        ['error', 'q']
        >>> PowerSGD(rank=2).state_slots((6, 5))  # 30 values, 22 in factors: not 2 times fewer, sent whole
        ()
    """

    name = "powersgd"
    arithmetic_passes = 10
    matmul_passes = 4  # Of arithmetic_passes, the thin products M Q, M^T P, P Q_w^T and P Q^T.

    rank: int = dataclasses.field(default=4, metadata={"help": "PowerSGD's rank"})
    warmup_steps: int = dataclasses.field(
        default=25, metadata={"help": "PowerSGD: steps of plain all-reduce before compressing"}
    )
    min_compression_rate: float = dataclasses.field(
        default=MIN_COMPRESSION_RATE,
        metadata={"help": "PowerSGD: compress a matrix only if its factors are this many times smaller"},
    )

    def __post_init__(self) -> None:
        check_rank(self.rank)
        require_int(StrategyError, "warmup_steps", self.warmup_steps, minimum=0, maximum=_MAX_WARMUP)
        object.__setattr__(self, "min_compression_rate", check_rate(self.min_compression_rate))

    def _counts(self, shapes: Shapes) -> tuple[int, int, int, int]:
        """Values per step: in the P factors, in the Q factors, in the tensors sent whole; and in the
        compressed matrices."""
        p = q = whole = matrices = 0
        for shape in shapes:
            size = math.prod(int(d) for d in shape)
            view = matrix_shape(shape, rank=self.rank, min_compression_rate=self.min_compression_rate)
            if view is None:
                whole += size
            else:
                p, q, matrices = p + self.rank * view[0], q + self.rank * view[1], matrices + size
        return p, q, whole, matrices

    def _flag(self, matrices: int) -> int:
        """Values the warm-up's plain sum adds to the P factors' all-reduce after the warm-up (one, if any)."""
        return 1 if self.warmup_steps and matrices else 0

    def sent_bytes(self, shapes: Shapes) -> float:
        p, q, whole, matrices = self._counts(shapes)
        return 4.0 * (p + q + whole + self._flag(matrices))  # Float32 factors and whole tensors.

    def seconds(self, shapes: Shapes, link: Link) -> float:
        p, q, whole, matrices = self._counts(shapes)
        return link.ring(4.0 * (p + self._flag(matrices))) + link.ring(4.0 * (q + whole))

    def streamed_values(self, shapes: Shapes) -> float:
        return float(self._counts(shapes)[3])

    def compute_seconds(self, shapes: Shapes, rates: HostRates, *, workers: int) -> float:
        """The thin products at the matmul bandwidth (at rank 1 the matvec bandwidth), the other passes at the
        memory bandwidth (the orthogonalization of the ``[n, rank]`` factors is left out: a few ms for
        ResNet-50 at rank 4). The same among any number of ``workers``."""
        del workers
        matrices = self.streamed_values(shapes)
        streamed = self.arithmetic_passes - self.matmul_passes
        products = rates.matmul_seconds(self.matmul_passes, matrices, rank=self.rank)
        return rates.arithmetic_seconds(streamed, matrices) + products

    def warmup(self, shapes: Shapes, link: Link) -> Warmup:
        """The warm-up's steps: every compressed matrix whole beside the P factors, the rest as after it.

        Example:
            >>> PowerSGD(rank=4, warmup_steps=10).warmup([(2048, 1000), (1000,)], Link(workers=2, bandwidth=1e9,
            ...                                           latency=1e-4)).sent_bytes  # Plain, factors, bias.
            8244768.0
        """
        p, q, whole, matrices = self._counts(shapes)
        if not self._flag(matrices):
            return super().warmup(shapes, link)
        seconds = link.ring(4.0 * (p + matrices)) + link.ring(4.0 * (q + whole))
        return Warmup(steps=self.warmup_steps, sent_bytes=4.0 * (p + matrices + q + whole), seconds=seconds)

    def state_slots(self, shape: Sequence[int]) -> tuple[StateSlot, ...]:
        view = matrix_shape(shape, rank=self.rank, min_compression_rate=self.min_compression_rate)
        if view is None:
            return ()
        slots = (
            StateSlot(kind="error", shape=view),
            StateSlot(kind="q", shape=(view[1], self.rank), shared=True, seeded=True),
        )
        return slots + ((StateSlot(kind="steps", shape=(1,), shared=True),) if self.warmup_steps else ())

    def step(self, grads: Sequence[Any], states: States, collectives: Collectives) -> Step:
        errors = [state.get("error") for state in states]
        qs = [state.get("q") for state in states]
        steps = next((state["steps"] for state in states if "steps" in state), None)
        warm = None if steps is None else steps[0] < self.warmup_steps  # every compressed gradient counts alike
        summed, new_errors, new_qs = powersgd_sum(
            grads,
            errors,
            qs,
            rank=self.rank,
            all_reduce=collectives.all_reduce,
            min_compression_rate=self.min_compression_rate,
            warm=warm,
        )
        counted = {} if steps is None else {"steps": _count(steps, self.warmup_steps)}
        new = [{"error": e, "q": q, **counted} if state else {} for state, e, q in zip(states, new_errors, new_qs)]
        return summed, new


def _count(steps: tf.Tensor, warmup_steps: int) -> tf.Tensor:
    """The warm-up steps taken after this one (float32, shape [1]), held at ``warmup_steps``."""
    import tensorflow as tf

    return tf.minimum(steps + 1.0, float(warmup_steps))
