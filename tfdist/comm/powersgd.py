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
too small to gain (``r * (n + m) >= n * m``), are summed whole.

:class:`PowerSGD` is the compressor as the registry knows it (``compression="powersgd"``): its rank, the
bytes and time it costs, its state and its step. Which tensors are compressed, and the bytes a step moves:

Example:
    >>> matrix_shape((3, 3, 64, 128), rank=4), matrix_shape((128,), rank=4), matrix_shape((4, 4), rank=4)
    ((576, 128), None, None)
    >>> lowrank_value_count([(3, 3, 64, 128), (128,)], rank=4)
    (2816, 128)
    >>> PowerSGD(rank=4).sent_bytes([(3, 3, 64, 128), (128,)])  # Float32 factors, the bias whole.
    11776.0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfdist.comm.compressor import Collective, Collectives, ErrorFeedback, Link, Shapes, States, StateSlot, Step
from tfdist.errors import StrategyError, require_int, require_number

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["PowerSGD", "lowrank_value_count", "matrix_shape", "orthogonalize", "powersgd_sum"]

EPSILON = 1e-8  # Added to a column's norm: a zero column stays zero instead of becoming NaN.
_MAX_WARMUP = 2**24  # steps a float32 counter holds exactly


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


def matrix_shape(shape: Sequence[int], *, rank: int, min_compression_rate: float = 1.0) -> tuple[int, int] | None:
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
    shapes: Sequence[Sequence[int]], *, rank: int, min_compression_rate: float = 1.0
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
    min_compression_rate: float = 1.0,
    warm: tf.Tensor | None = None,
) -> tuple[list[tf.Tensor], list[tf.Tensor | None], list[tf.Tensor | None]]:
    """One step of PowerSGD over ``grads``: their sum over the replicas, and the state for the next step.

    Call in replica context, the same on every replica. ``errors[i]`` and ``qs[i]`` are the error and the
    warm-start factor of ``grads[i]`` (both None where :func:`matrix_shape` is None); ``all_reduce`` sums a
    list of tensors over the replicas (two calls: the P factors, then the Q factors with the whole tensors).

    With ``warm`` (a boolean scalar, the same on every replica), a True step is a warm-up step: every
    gradient is summed whole (a third all-reduce, of every matrix), and the errors and Q factors stay as
    they are. The collectives cannot sit in a branch (``tf.cond``) under a strategy, so every step makes
    all three; the third sends one value per step once ``warm`` is False (its length is dynamic).

    Returns:
      The summed gradients (as ``grads``' shapes and dtypes), the new errors and the new Q factors.
    """
    import tensorflow as tf

    views = [matrix_shape(g.shape.as_list(), rank=rank, min_compression_rate=min_compression_rate) for g in grads]
    _check_state(grads, views, errors, qs)
    compressed = [i for i, view in enumerate(views) if view is not None]
    whole = [i for i, view in enumerate(views) if view is None]
    matrices = {}
    for i in compressed:
        n, m = views[i]  # type: ignore[misc]
        matrices[i] = tf.reshape(tf.cast(grads[i], tf.float32), [n, m]) + errors[i]
    ps = [tf.matmul(matrices[i], qs[i]) for i in compressed]
    ps = [orthogonalize(p) for p in all_reduce(ps)] if ps else []
    local_qs = [tf.matmul(matrices[i], p, transpose_a=True) for i, p in zip(compressed, ps)]
    summed = list(all_reduce(local_qs + [grads[i] for i in whole])) if local_qs or whole else []
    plain = _warm_sums([matrices[i] for i in compressed], all_reduce, warm) if warm is not None and compressed else []
    out: list[tf.Tensor] = list(grads)
    new_errors: list[tf.Tensor | None] = [None] * len(grads)
    new_qs: list[tf.Tensor | None] = [None] * len(grads)
    for k, i in enumerate(compressed):
        p, q_local, q_sum = ps[k], local_qs[k], summed[k]
        new_errors[i] = matrices[i] - tf.matmul(p, q_local, transpose_b=True)
        new_qs[i] = q_sum
        total = tf.matmul(p, q_sum, transpose_b=True)
        if plain:  # a warm-up step keeps the state and applies the plain sum
            new_errors[i] = tf.where(warm, errors[i], new_errors[i])
            new_qs[i] = tf.where(warm, qs[i], q_sum)
            total = tf.where(warm, plain[k], total)
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


def _warm_sums(matrices: Sequence[tf.Tensor], all_reduce: Collective, warm: tf.Tensor) -> list[tf.Tensor]:
    """The plain sums of ``matrices`` while ``warm``; else anything of their shapes, for one value sent."""
    import tensorflow as tf

    sizes = [int(m.shape[0]) * int(m.shape[1]) for m in matrices]
    flat = tf.concat([tf.reshape(m, [-1]) for m in matrices], axis=0)
    length = tf.where(warm, sum(sizes), 1)
    sent = all_reduce([flat[:length]])[0]
    flat = tf.pad(sent, [[0, sum(sizes) - length]])
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
    (1), ``P Q_w^T`` (1), ``M - P Q_w^T`` (3), ``P Q^T`` (1). Per compressed gradient it keeps the replica's
    error (``[n, m]``) and the warm-start ``Q`` (``[m, rank]``, the same on every replica).

    As torch's PowerSGD hook does, it can start with ``warmup_steps`` steps of plain all-reduce
    (``start_powerSGD_iter``), and send whole every matrix that the factors would not make more than
    ``min_compression_rate`` times smaller (torch's ``min_compression_rate``; torch's defaults are 1,000
    steps and 2). With a warm-up, each compressed gradient also keeps the steps taken so far (``steps``,
    shared), so a resumed run continues the warm-up where it was; the bytes and times it models are those
    after the warm-up.

    Example:
        >>> PowerSGD(rank=2).state_slots((8, 16))[1]
        StateSlot(kind='q', shape=(16, 2), shared=True, seeded=True)
        >>> [slot.kind for slot in PowerSGD(rank=2, warmup_steps=100).state_slots((8, 16))]
        ['error', 'q', 'steps']
        >>> PowerSGD(rank=2, min_compression_rate=3).state_slots((8, 16))  # 128 values, 48 in factors: whole
        ()
    """

    name = "powersgd"
    arithmetic_passes = 10

    rank: int = dataclasses.field(default=4, metadata={"help": "PowerSGD's rank"})
    warmup_steps: int = dataclasses.field(
        default=0, metadata={"help": "PowerSGD: steps of plain all-reduce before compressing"}
    )
    min_compression_rate: float = dataclasses.field(
        default=1.0, metadata={"help": "PowerSGD: compress a matrix only if its factors are this many times smaller"}
    )

    def __post_init__(self) -> None:
        check_rank(self.rank)
        require_int(StrategyError, "warmup_steps", self.warmup_steps, minimum=0, maximum=_MAX_WARMUP)
        object.__setattr__(self, "min_compression_rate", check_rate(self.min_compression_rate))

    def _views(self, shapes: Shapes) -> list[tuple[int, int] | None]:
        rate = self.min_compression_rate
        return [matrix_shape([int(d) for d in shape], rank=self.rank, min_compression_rate=rate) for shape in shapes]

    def sent_bytes(self, shapes: Shapes) -> float:
        counts = lowrank_value_count(shapes, rank=self.rank, min_compression_rate=self.min_compression_rate)
        return 4.0 * sum(counts)  # Float32 factors and whole tensors.

    def seconds(self, shapes: Shapes, link: Link) -> float:
        views = self._views(shapes)
        p = sum(self.rank * view[0] for view in views if view is not None)
        q = sum(self.rank * view[1] for view in views if view is not None)
        whole = sum(math.prod(int(d) for d in shape) for shape, view in zip(shapes, views) if view is None)
        return link.ring(4.0 * p) + link.ring(4.0 * (q + whole))

    def streamed_values(self, shapes: Shapes) -> float:
        views = self._views(shapes)
        return float(sum(math.prod(int(d) for d in shape) for shape, view in zip(shapes, views) if view is not None))

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
