"""What the launcher watches in its tasks while they train: the option group of the stall inspector.

:class:`Inspection` is the option group of :class:`~tfdist.launch.LaunchConfig` for it. With
``stall_seconds`` every training task runs a step watchdog (:mod:`tfdist.runtime.watchdog`) and the
supervisor reads it (:mod:`tfdist.launch.supervisor._stall`): when no training task completes a step for that
long, it names the tasks that stopped and those waiting on them, writes every watched task's Python stacks and
ends the run, or loses the stopped workers of an elastic run (docs/launch.md).

Example:
    >>> from tfdist.launch import Inspection
    >>> Inspection().stall_seconds, Inspection(stall_seconds=120).stall_seconds, STALL_SECONDS
    (None, 120, 300.0)
"""

from __future__ import annotations

import dataclasses

from tfdist._options import option
from tfdist.errors import LaunchError, invalid, require_number

__all__ = ["Inspection"]

# `stall_seconds` asked for without a value: above a first step's tracing and compiling and an epoch end's
# checkpoint, and 5x Horovod's stall warning (60 s, which Horovod does not act on by default).
STALL_SECONDS = 300.0
_MAX_SECONDS = 366 * 86400.0  # A year, as `timeout`.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inspection:
    """What the launcher watches in its training tasks.

    Attributes:
      stall_seconds: When no training task completes a step for this many
        seconds, name the tasks that stopped and those waiting on them, write
        every watched task's Python stacks into ``log_dir`` (else a new
        directory under the temp directory) and end the run
        (``Outcome.STALLED``), or lose the stopped workers of an elastic run.
        Must exceed the longest gap between two steps of a healthy run, the
        first step's tracing and compiling included. None: off. Collective
        runs on the local engine only.
    """

    stall_seconds: float | None = option(
        None,
        help="when no training task completes a step for S seconds, name the tasks that stopped and those "
        "waiting on them, write each task's Python stacks into `log_dir` (else a new temp dir) and fail the run, "
        f"or lose the stopped workers (`min_workers`); the flag alone: {STALL_SECONDS:g}; default off",
        metavar="S",
        bare=STALL_SECONDS,
    )

    def __post_init__(self) -> None:
        require_number(
            LaunchError,
            "stall_seconds",
            self.stall_seconds,
            minimum=1,
            maximum=_MAX_SECONDS,
            allow_none=True,
            fix=f"Seconds without a completed step, longer than the longest step (e.g. {STALL_SECONDS:g}); None: off.",
        )

    def check_mode(self, mode: str) -> None:
        """LaunchError when the stall inspector is on in a run of ``mode`` ('parameter_server' or 'collective')."""
        if self.stall_seconds is not None and mode == "parameter_server":
            raise invalid(
                LaunchError,
                "stall_seconds",
                self.stall_seconds,
                "None with `ps` (the stall inspector watches collective runs)",
                "Drop `stall_seconds`: under parameter servers the coordinator gives a stuck worker's steps to the "
                "others.",
            )
