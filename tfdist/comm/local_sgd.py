"""Local SGD as the planner sees it: one all-reduce of the weights every ``period`` steps.

Its step is ``tfdist.keras.local_sgd``, which averages the workers' weights between steps; this is its
config and its traffic, registered as ``local_sgd`` for :func:`tfdist.comm.compressed_traffic` and
``tfdist plan --compression local-sgd``. It is not a compression of the gradient all-reduce, so
``CollectiveConfig`` refuses it.

Example:
    >>> LocalSGD(period=4).sent_bytes([(1000,)])  # 4000 bytes of weights, averaged every 4 steps.
    1000.0
"""

from __future__ import annotations

import dataclasses
import math

from tfdist.comm.compressor import Link, Shapes, TrafficModel
from tfdist.errors import StrategyError, require_int

__all__ = ["LocalSGD"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalSGD(TrafficModel):
    """Local SGD (``local_sgd``): local steps, the weights averaged by one ring all-reduce every ``period``.

    Its arithmetic streams the weights 3 times per averaging (``arithmetic_passes``): summed and scaled
    (read, write, write), once per period.
    """

    name = "local_sgd"
    arithmetic_passes = 3

    period: int = dataclasses.field(default=4, metadata={"help": "steps between averagings"})

    def __post_init__(self) -> None:
        require_int(
            StrategyError, "period", self.period, minimum=1, fix="Average the workers' weights every 1 or more steps."
        )

    def sent_bytes(self, shapes: Shapes) -> float:
        return 4.0 * _values(shapes) / self.period

    def seconds(self, shapes: Shapes, link: Link) -> float:
        return link.ring(4.0 * _values(shapes)) / self.period

    def streamed_values(self, shapes: Shapes) -> float:
        return float(_values(shapes)) / self.period


def _values(shapes: Shapes) -> int:
    return sum(math.prod(int(d) for d in shape) for shape in shapes)
