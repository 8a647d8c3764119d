"""A pipeline's run state: where its input stands and how to seek in it, the one protocol with the Keras layer.

After a restore, ``fit`` goes on at its epoch ``E``, step ``S``, and the input must go on at the records
that step trains. :class:`ResumableInput` is all the Keras layer (``tfdist.keras.ResumeInput``,
``fit_input``) asks and tells, under every strategy: the order's :meth:`~ResumableInput.fingerprint`,
which the backup records beside itself; :meth:`~ResumableInput.check_fingerprint` against the recorded
one (the input explains a change, naming the option); :meth:`~ResumableInput.steps_per_epoch`; and
:meth:`~ResumableInput.seek` to fit's counters. Whether the input then starts its readers at a
:class:`~tfdist.data.order.DataPosition` (one process, MultiWorkerMirrored) or sets the counter its
parameter-server workers claim steps from (:mod:`tfdist.data.order.claims`) is the data layer's business:
the shape of torch.distributed.checkpoint's ``Stateful`` and Mosaic StreamingDataset's ``state_dict``.

:class:`InputState` implements it for a :class:`~tfdist.data.TFRecordPipeline`, whose builds tell it what
they read. It lives in the pipeline's :class:`PipelineRun`, the one mutable object beside its frozen options.

Example:
    >>> state = InputState(epochs_per_iteration=1)
    >>> isinstance(state, ResumableInput), state.fingerprint()  # Nothing built yet: nothing to resume.
    (True, None)
    >>> state.seek(epoch=2, step=5, steps_per_epoch=None)
    >>> state.cursor.position
    DataPosition(epoch=2, step=5)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from tfdist.data.order.epoch import ORDER_VERSION
from tfdist.data.order.position import InputCursor, input_position, restart_attempt
from tfdist.data.order.reader import StreamLayout
from tfdist.data.pipeline.options import EpochOptions
from tfdist.data.records.verify import VerifyReport
from tfdist.errors import DataError, require_int

__all__ = ["ResumableInput"]

_log = logging.getLogger("tfdist.data")

# The pipeline option behind each key of an order's fingerprint (EpochOrder, StrataOrder): what a change names.
_OPTION_OF = {
    "streams": "order_streams",
    "block": "order_block",
    "window": "shuffle_buffer",
    "mix": "class_weights",
    "counts": "files",
    "stratified": "label_key",
    "pipelines": "cluster",  # Stratified draws: each input pipeline (worker) draws its own.
}


@runtime_checkable
class ResumableInput(Protocol):
    """An input that can go on where a restored backup left off (:class:`~tfdist.data.TFRecordPipeline` is one).

    The Keras layer asks for the fingerprint and the epoch's steps, checks the fingerprint the backup
    recorded, and tells the input where ``fit`` goes on; nothing else passes between them.
    """

    def fingerprint(self) -> dict[str, Any] | None:
        """The order's parameters, which a backup records beside itself (JSON); None: the input cannot resume
        (it does not read in a resumable order)."""
        ...

    def check_fingerprint(self, saved: Mapping[str, Any], *, backup: str) -> bool:
        """Checks the fingerprint ``saved`` with the backup ``backup`` against this order.

        Returns False for the same order; True for a change that resumes all the same (logged): the record
        beside the backup should become :meth:`fingerprint`. Raises a DataError naming the option of any
        other change, since resuming would train other records than the ones left.
        """
        ...

    def steps_per_epoch(self) -> int | None:
        """Global steps of one data epoch of the input built last (None: none built, or not resumable)."""
        ...

    def seek(self, *, epoch: int, step: int, steps_per_epoch: int | None) -> None:
        """Goes on where ``fit`` goes on after a restore: its epoch ``epoch``, step ``step``, in epochs of
        ``steps_per_epoch`` steps (None: fit does not know them)."""
        ...


def _changed(saved: Mapping[str, Any], now: Mapping[str, Any], *, backup: str) -> bool:
    """:meth:`ResumableInput.check_fingerprint` of the order fingerprinted ``now``."""
    if saved.get("order", 1) != now.get("order", 1):  # Fingerprints before version 2 name none: version 1.
        raise DataError(
            f"The backup in {backup} was made reading version {saved.get('order', 1)} of tfdist's resumable "
            f"order, and this tfdist reads version {now.get('order', 1)}: the same files and options give "
            "another record order, so resuming would train other records than the ones left. Finish that "
            "run with the tfdist version that made it, or start a new backup directory.",
            field="order",
            value=now.get("order", 1),
        )
    changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if "aligned" in changed:  # Not an option: how the streams are cut (at block borders for claimed steps).
        cut = {True: "at block borders", None: "by records"}
        raise DataError(
            f"The backup in {backup} was made reading an order whose streams were cut {cut[saved.get('aligned')]}, "
            f"and this run cuts them {cut[now.get('aligned')]}: parameter-server steps cut them at block borders "
            "since tfdist's claimed steps read one piece per stream, other strategies by records. The same files "
            "and options give other steps, so resuming would train other records than the ones left. Finish that "
            "run with the tfdist version and strategy that made it, or start a new backup directory.",
            field="order",
            value=now.get("order", 1),
        )
    if changed == ["pipelines"]:  # Stratified draws on another world size: they go on, and say so.
        _log.warning(
            "The backup in %s was made by %s input pipelines drawing by class_weights, and %s draw now. "
            "Each pipeline draws its own sequence, so the draws go on from the same step in the "
            "sequences of %s pipelines: the class mix holds, but within each class's current pass "
            "some records may be drawn again and others not (docs/data.md, 'Resuming stratified draws').",
            backup,
            saved.get("pipelines"),
            now.get("pipelines"),
            now.get("pipelines"),
        )
        return True  # Recorded anew, the next resume on this world size is exact again.
    if changed:
        raise DataError(
            f"The backup in {backup} was made reading another input order: "
            + ", ".join(f"{_OPTION_OF.get(k, k)} {saved.get(k)!r} then, {now.get(k)!r} now" for k in changed)
            + ". Resuming would train other records than the ones left. Use the same files and options "
            "(an elastic job names order_streams), or start a new backup directory.",
            field=_OPTION_OF.get(changed[0], changed[0]),
            value=now.get(changed[0]),
        )
    return False


class InputState:
    """Where one pipeline's input stands: the cursor its readers start from, the order of the last dataset
    built and, under parameter servers, the counter its workers claim global steps from.

    The pipeline's builds tell it what they read (:meth:`reading`, :meth:`claiming`); the Keras layer asks
    and tells it through :class:`ResumableInput`.

    Args:
      epochs_per_iteration: Data epochs in one iteration of the pipeline's dataset (its ``num_epochs``;
        None: endless).
      drop_remainder: Whether a data epoch's last partial step is dropped.
    """

    def __init__(self, *, epochs_per_iteration: int | None, drop_remainder: bool = False) -> None:
        self._cursor = InputCursor(epochs_per_iteration=epochs_per_iteration)
        self._drop_remainder = drop_remainder
        self._order: Any = None  # An EpochOrder or a StrataOrder (None: the last build is not resumable).
        self._layout: StreamLayout | None = None
        self._claims: Any = None  # Under parameter servers: the StepLedger of claimed global steps (on a ps).
        self._on_seek: Callable[[int], Any] | None = None

    @property
    def cursor(self) -> InputCursor:
        """Where the next iteration of each stream starts (the readers of a resumable order ask it)."""
        return self._cursor

    def reading(self, order: Any, layout: StreamLayout | None) -> None:
        """The last dataset built reads ``order`` with ``layout`` here (None: not in a resumable order)."""
        self._order, self._layout = order, layout

    def claiming(
        self, order: Any, layout: StreamLayout, ledger: Any, *, on_seek: Callable[[int], Any] | None = None
    ) -> None:
        """Parameter-server workers claim the global steps of ``order`` from ``ledger`` (a
        :class:`~tfdist.data.order.ledger.StepLedger` on a ps); ``on_seek(step)`` is told the step a restore
        sets the counter to (stratified draws set where the draws of each class stand there)."""
        self._order, self._layout, self._claims, self._on_seek = order, layout, ledger, on_seek
        restart = restart_attempt()
        if restart:
            _log.warning(
                "This task is restart %s of its job: the claimed steps start at step 0 unless "
                "tfdist.keras.ResumeInput(pipeline) (or cluster_callbacks(..., data=pipeline)) beside the "
                "BackupAndRestore sets them to the restored step, which it logs as 'Input resumes at ...'. "
                "Without it the steps before the backup are trained again and the last ones not at all.",
                restart,
            )

    def claimed_steps(self) -> int | None:
        """Global steps the workers claimed so far (read from the ps); None without claimed steps."""
        return None if self._claims is None else int(self._claims.counter.numpy())

    def claims_ledger(self) -> Any:
        """The :class:`~tfdist.data.order.ledger.StepLedger` of the claimed steps (None: none), which a
        backup saves (``tfdist.keras.ResumeInput``)."""
        return self._claims

    def fingerprint(self) -> dict[str, Any] | None:
        """:meth:`ResumableInput.fingerprint`, with the version of the order's definition (``order``)."""
        return None if self._order is None else {**self._order.fingerprint(), "order": ORDER_VERSION}

    def check_fingerprint(self, saved: Mapping[str, Any], *, backup: str) -> bool:
        """:meth:`ResumableInput.check_fingerprint`."""
        return _changed(saved, self.fingerprint() or {}, backup=backup)

    def steps_per_epoch(self) -> int | None:
        """:meth:`ResumableInput.steps_per_epoch`."""
        if self._order is None or self._layout is None:
            return None
        per, lengths = self._layout.per_stream, self._order.stream_lengths
        if self._drop_remainder and self._claims is None:  # Claimed steps keep the last partial step.
            return min(lengths) // per
        return -(-max(lengths) // per)

    def seek(self, *, epoch: int, step: int, steps_per_epoch: int | None) -> None:
        """:meth:`ResumableInput.seek`: sets the claim counter under parameter servers, else the cursor."""
        require_int(DataError, "epoch", epoch, minimum=0)
        require_int(DataError, "step", step, minimum=0)
        if self._claims is not None:  # The next global step to claim.
            steps = steps_per_epoch or self.steps_per_epoch()
            assert steps is not None, "claiming() set the order"
            claimed = self._claims.resume(epoch * steps + step)  # The backup's ledger, if it held one.
            if self._on_seek is not None:  # Before a claim: no claim of that step runs without it.
                self._on_seek(claimed)
            again = self._claims.pending()
            if claimed or again:
                more = f", given back first: {again}" if again else ""
                _log.info("Input resumes at epoch %d, step %d (claimed steps from %d%s).", epoch, step, claimed, more)
            return
        position = input_position(
            epoch, step, epochs_per_iteration=self._cursor.epochs_per_iteration, steps_per_epoch=steps_per_epoch
        )
        self._cursor.start(position)
        if (epoch, step) != (0, 0):
            _log.info("Input resumes at epoch %d, step %d (%s).", epoch, step, position)


class PipelineRun:
    """What a pipeline's builds and restores change, held beside its frozen options (one per pipeline object)."""

    def __init__(self) -> None:
        self.report: VerifyReport | None = None  # The last dataset()'s verification (a diagnostic).
        self._input: InputState | None = None
        self._lock = threading.Lock()

    def input(self, epochs: EpochOptions) -> InputState:
        """Where the pipeline's input stands, made on first use from its epoch options (the dataclass
        makes this object before the options are known)."""
        with self._lock:
            if self._input is None:
                self._input = InputState(epochs_per_iteration=epochs.num_epochs, drop_remainder=epochs.drop_remainder)
            return self._input
