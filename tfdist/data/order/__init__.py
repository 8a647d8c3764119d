"""The order of an epoch's records as a function of (seed, epoch, listing), and reading it from any position."""

from tfdist.data.order.epoch import EpochOrder
from tfdist.data.order.position import DataPosition, InputCursor

__all__ = ["DataPosition", "EpochOrder", "InputCursor"]
