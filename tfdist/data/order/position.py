"""Where the input stands: a position in steps, and the cursor a pipeline's readers start from.

A :class:`DataPosition` says where the next iteration of a dataset starts: data epoch ``epoch``, after
``step`` global steps were trained from there. Keras' backups already hold the step counters; after a
restore the pipeline turns them into a position (:func:`input_position`, through
:class:`~tfdist.data.pipeline.state.ResumableInput`) and starts its :class:`InputCursor` there before
the first batch is read.

Example:
    >>> cursor = InputCursor(epochs_per_iteration=1)
    >>> cursor.start(DataPosition(epoch=2, step=5))
    >>> starts = cursor.reads()
    >>> starts.iteration(stream=0), starts.iteration(stream=0), cursor.reads().iteration(stream=0)
    (DataPosition(epoch=2, step=5), DataPosition(epoch=3, step=0), DataPosition(epoch=2, step=5))
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping

from tfdist.errors import DataError, invalid, require_int

__all__ = ["DataPosition", "InputCursor"]

_log = logging.getLogger("tfdist.data")
_RESTART_VAR = "TFDIST_RESTART"  # Set by tfdist-launch and the jobs it emits: 0 on the first run.


def restart_attempt(environ: Mapping[str, str] | None = None) -> int:
    """Which restart of its job this task is (``TFDIST_RESTART``): 0 on the first run or outside tfdist-launch.

    Example:
        >>> restart_attempt({"TFDIST_RESTART": "2"}), restart_attempt({}), restart_attempt({"TFDIST_RESTART": "x"})
        (2, 0, 0)
    """
    value = (os.environ if environ is None else environ).get(_RESTART_VAR, "0")
    return int(value) if value.isdigit() else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataPosition:
    """The next iteration starts at data epoch ``epoch`` with ``step`` global steps of it already trained.

    With endless input (``num_epochs=None``) one iteration spans every epoch: ``step`` then counts the
    steps since the start of ``epoch`` over all later epochs too.
    """

    epoch: int = 0
    step: int = 0

    def __post_init__(self) -> None:
        require_int(DataError, "epoch", self.epoch, minimum=0)
        require_int(DataError, "step", self.step, minimum=0)


def input_position(
    epoch: int, step: int, *, epochs_per_iteration: int | None, steps_per_epoch: int | None
) -> DataPosition:
    """The data position of Keras epoch ``epoch``, step ``step`` (where fit goes on after a restore).

    A finite dataset of ``E`` epochs is iterated once per Keras epoch, so Keras epoch ``k`` is data epoch
    ``k * E``; an endless one is one iteration, counted in steps since the start.

    Example:
        >>> input_position(2, 5, epochs_per_iteration=1, steps_per_epoch=None)
        DataPosition(epoch=2, step=5)
        >>> input_position(2, 5, epochs_per_iteration=None, steps_per_epoch=20)
        DataPosition(epoch=0, step=45)
    """
    if epochs_per_iteration is not None:
        return DataPosition(epoch=epoch * epochs_per_iteration, step=step)
    if steps_per_epoch is None:
        raise invalid(
            DataError,
            "steps_per_epoch",
            None,
            "a number of steps per epoch with endless input (num_epochs=None)",
            "Pass steps_per_epoch=... to fit().",
        )
    return DataPosition(epoch=0, step=epoch * steps_per_epoch + step)


class InputCursor:
    """The start of each iteration of a pipeline's dataset, per stream (thread-safe).

    Each dataset counts its own iterations (:meth:`reads`); every stream's reader asks once when an
    iteration begins: the first starts at the position set by :meth:`start` (default the start of epoch
    0), each later one at the next ``epochs_per_iteration`` epochs (Keras iterates a finite dataset once
    per epoch).
    """

    def __init__(self, *, epochs_per_iteration: int | None) -> None:
        self.epochs_per_iteration = epochs_per_iteration
        self._lock = threading.Lock()
        self._position = DataPosition()
        self._generation = 0
        self._linked = False  # Started at a position (by a restore, or by hand).
        self._warned = False

    @property
    def position(self) -> DataPosition:
        """The position the first iteration after the last :meth:`start` begins at."""
        return self._position

    def start(self, position: DataPosition) -> None:
        """Starts the next iteration of every stream at ``position`` (and later ones after it)."""
        with self._lock:
            self._position = position
            self._generation += 1
            self._linked = True

    def reads(self) -> StreamStarts:
        """A new dataset's own count of iterations per stream (two datasets of one pipeline do not share one)."""
        return StreamStarts(self)

    def _start_of(self, k: int) -> DataPosition:
        per = self.epochs_per_iteration
        if k == 0 or per is None:  # Endless: one iteration holds every epoch; a new one starts over.
            return self._position
        return DataPosition(epoch=self._position.epoch + k * per, step=0)

    def _warn_unlinked_restart(self) -> None:
        restart = restart_attempt()
        if self._linked or self._warned or restart == 0:
            return
        self._warned = True
        _log.warning(
            "This task is restart %s of its job, and its input starts at the beginning of epoch %d: the records "
            "trained before the failure are read again and the end of the epoch is cut. A plain "
            "BackupAndRestore restores the model, not the input position. Pass the pipeline to the backup "
            "callback (tfdist.keras.PreemptionSafeBackup(dir, data=pipeline), cluster_callbacks(..., "
            "data=pipeline)) or add tfdist.keras.ResumeInput(pipeline) after it.",
            restart,
            self._position.epoch,
        )


class StreamStarts:
    """One dataset's iterations per stream: the first starts at the cursor's position, later ones after it.

    A new :meth:`InputCursor.start` (a restore) starts the count again.
    """

    def __init__(self, cursor: InputCursor) -> None:
        self._cursor = cursor
        self._counts: dict[int, int] = {}
        self._generation = -1

    @property
    def epochs_per_iteration(self) -> int | None:
        """Epochs one iteration spans (None: endless)."""
        return self._cursor.epochs_per_iteration

    def iteration(self, *, stream: int) -> DataPosition:
        """Where this dataset's new iteration of ``stream`` starts (called by the stream's reader)."""
        cursor = self._cursor
        with cursor._lock:
            if self._generation != cursor._generation:
                self._counts.clear()
                self._generation = cursor._generation
            k = self._counts.get(stream, 0)
            self._counts[stream] = k + 1
            cursor._warn_unlinked_restart()
            return cursor._start_of(k)
