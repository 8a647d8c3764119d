"""The ledger of parameter-server claims: the steps a failed run claimed are claimed again, by any worker.

Under parameter servers every worker claims the next global step from a counter on a ps
(:mod:`tfdist.data.order.claims`). TF's ``ClusterCoordinator`` runs one closure at a time per worker and,
when a worker fails, puts the closure it ran back in the queue for another worker; that run claims a step
of its own, so the step the failed run had claimed was never trained (or partly: its update may have
reached the ps). The ledger, on the ps beside the counter, records each worker's claims, and the
coordinator gives back the claims of a failed run: the next claim, on any worker, takes a step given back
before a fresh one.

- A claim (the workers' graph, one call to the ps): a step given back if there is one, else the next
  fresh step; recorded as the claiming worker's (its claim count, and its last :data:`DEPTH` steps).
- Each closure that reads the claimed dataset (no other closure: not another fit's, nor one after this fit
  ended or failed) runs :meth:`StepLedger.begin` in its own function before its input: on the ps, the
  worker's claims so far are noted and the closure counted as begun. The coordinator (Python, on the chief)
  counts the closures begun as they end, and when one goes back to the queue it gives back the steps the
  worker claimed since that closure's begin (none when its begin never ran): the claims of the failed run,
  and only those (TF sends a worker one closure at a time, and nothing reads ahead of a claim). A failed
  run whose update reached the ps before it failed is trained once more: that step only.
- Given back: a ring of :data:`CAPACITY` steps that the coordinator alone writes, ``available`` (minus the
  steps given back and not taken yet) and ``taken`` (an atomic fetch-and-add: which one a claim takes).
  Takes run one at a time on the ps (a ``tf.CriticalSection``): a claim that sees a step available takes
  it, one that sees none claims a fresh step, and none fails. The coordinator writes the step, then counts
  it available, so a claim never takes a slot not yet written.
- A claim cut in the middle (its worker died while the ps ran it: the ps cancels what is left of the call)
  may have taken a step without recording it as the worker's. Each claim marks its step as accounted last
  (a ring of fresh steps, a ring of takes): the coordinator, when a run fails, also gives back the steps
  taken and never accounted (:meth:`StepLedger.orphans`), once they stay so for :data:`SETTLE` seconds (a
  live worker's claim accounts for its step within milliseconds).
- A backup saves the counter and the steps given back (:meth:`StepLedger.checkpoint`): a restore goes on
  with them.

Example (one process, the coordinator's part called by hand):
    >>> import tensorflow as tf
    >>> ledger = StepLedger(workers=2)
    >>> claim = tf.function(lambda worker: ledger.claim(tf.constant(worker, tf.int64)))
    >>> [int(claim(0)), int(claim(1))]
    [0, 1]
    >>> since = ledger.started(1)  # Before a closure on worker 1: it claims step 2, then fails.
    >>> int(claim(1)), ledger.failed(1, since)[1]
    (2, [2])
    >>> [int(claim(0)), int(claim(0))]  # The next claim takes the step given back.
    [2, 3]
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from tfdist import _compat
from tfdist.errors import DataError, require_int

__all__: list[str] = []

_log = logging.getLogger("tfdist.data")

DEPTH = 32  # Claims per worker the ledger keeps: at least one closure's (fit's steps_per_execution).
CAPACITY = 1024  # Steps given back and not taken yet; also the fresh steps and takes checked for orphans.
SETTLE = (1.0, 2.0)  # Seconds between the looks that find a claim cut in the middle (it stays unaccounted).
NO_LIMIT = (1 << 63) - 1  # ResourceCountUpTo's bound where only the fetch-and-add is wanted.


def count_up(variable: Any, limit: int = NO_LIMIT) -> Any:
    """The int64 ``variable``'s value before an atomic increment; fails (OutOfRange) at ``limit``.

    ``ResourceCountUpTo`` reads and increments under the variable's lock in one kernel: concurrent calls
    never return the same value (``assign_add`` then a read can).

    Example:
        >>> import tensorflow as tf
        >>> counter = tf.Variable(5, dtype=tf.int64)
        >>> int(count_up(counter)), int(counter.numpy())
        (5, 6)
    """
    import tensorflow as tf

    return tf.raw_ops.ResourceCountUpTo(resource=variable.handle, limit=limit, T=tf.int64)


def _read(variable: Any) -> Any:
    import tensorflow as tf

    return tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=tf.int64)


def current_worker() -> Any:
    """This worker's index (int64) in a dataset function a ``ClusterCoordinator`` traces, else 0.

    TF fills it in when the function runs on a worker (``experimental_get_current_worker_index``).
    """
    import tensorflow as tf

    if not tf.inside_function():  # Built eagerly (by hand, or one process): its claims count as worker 0's.
        _log.warning(
            "A parameter-server dataset built outside the coordinator's tracing: its claims count as worker 0's."
        )
        return tf.constant(0, tf.int64)
    return tf.distribute.coordinator.experimental_get_current_worker_index()


def _mark(ring: Any, index: Any) -> Any:
    """Graph or eager: ``ring[index % CAPACITY] = index`` (int64 ``index``): accounted."""
    import tensorflow as tf

    slot = tf.reshape(index % CAPACITY, [1])
    marked = tf.raw_ops.ResourceScatterUpdate(resource=ring.handle, indices=slot, updates=tf.reshape(index, [1]))
    with tf.control_dependencies([marked]):
        return tf.identity(index)


class StepLedger:
    """The claim counter of parameter-server steps and who claimed what; see the module docstring.

    Made on the coordinator inside ``strategy.scope()``: its variables sit together on one ps.

    Args:
      workers: Worker tasks of the cluster.
      name: The counter variable's name (``pipeline.claimed_steps()`` reads it).
    """

    def __init__(self, *, workers: int, name: str = "tfdist_claimed_steps") -> None:
        import tensorflow as tf

        self.workers = require_int(DataError, "workers", workers, minimum=1)

        def variable(value: Any, label: str) -> Any:
            return tf.Variable(value, dtype=tf.int64, trainable=False, name=label)

        self.counter = variable(0, name)  # The next fresh step.
        with tf.distribute.get_strategy().extended.colocate_vars_with(self.counter):  # One ps, not sharded.
            self._claims = variable(tf.zeros([workers], tf.int64), "tfdist_claims")
            self._held = variable(tf.fill([workers * DEPTH], tf.constant(-1, tf.int64)), "tfdist_claims_held")
            self._back = variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), "tfdist_given_back")
            self._available = variable(0, "tfdist_given_back_available")  # Minus the steps not taken yet.
            self._taken = variable(0, "tfdist_given_back_taken")
            self._given = variable(0, "tfdist_given_back_given")
            self._saved = variable(0, "tfdist_claims_saved")  # 1 in a backup: the restore goes on with it.
            self._fresh = variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), "tfdist_fresh_accounted")
            self._took = variable(tf.fill([CAPACITY], tf.constant(-1, tf.int64)), "tfdist_takes_accounted")
            self._runs = variable(tf.zeros([workers], tf.int64), "tfdist_claims_runs")  # Closures begun.
            self._begun = variable(tf.zeros([workers], tf.int64), "tfdist_claims_begun")  # Claims then.
        with tf.device(self.counter.device):
            self._takes = tf.CriticalSection(name="tfdist_claims_takes")  # One take at a time, on the ps.
        self._lock = threading.Lock()
        self._restored = False
        self._floors = (0, 0)  # The first fresh step and take the rings account for (a restore moves them).
        self._runs_known: dict[int, int | None] = {}  # Per worker: its closures begun, as the coordinator knows.

    @classmethod
    def of(cls, strategy: Any, *, name: str = "tfdist_claimed_steps") -> StepLedger:
        """A ledger for the workers of ``strategy`` (made in its scope: on a ps under parameter servers)."""
        workers = _compat.worker_count(strategy)
        with strategy.scope():
            return cls(workers=workers, name=name)

    def dataset_fn(self, strategy: Any, read: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Every parameter-server worker's dataset function: ``read(*args, counter=self, worker=W, **kwargs)``
        whatever its InputContext, ``W`` the worker running it. Made on the coordinator before ``fit``, which
        traces it as it starts: the closures that read its dataset tell this ledger when they start and
        fail (:meth:`hooks`), and no other closure does."""
        import tensorflow as tf

        watch = None
        if isinstance(strategy, tf.distribute.ParameterServerStrategy):
            watch = _compat.watch_closures(strategy)  # Before fit creates the dataset: see attach().

        def dataset_fn(input_context: Any = None) -> Any:
            del input_context  # Every worker claims from this ledger.
            worker = tf.constant(0, tf.int64)
            if watch is not None:
                if not watch.attach(self.hooks()) and tf.inside_function():
                    _log.warning(
                        "A claimed dataset traced outside ClusterCoordinator.create_per_worker_dataset: the "
                        "claims of a closure that fails on it are not given back."
                    )
                worker = current_worker()
            return read(*args, counter=self, worker=worker, **kwargs)

        return dataset_fn

    # ------------------------------------------------------------ the workers' graph
    def claim(self, worker: Any, *, fresh: bool = False) -> Any:
        """Graph: the step ``worker`` (an int64 scalar) trains next, recorded as its claim: a step given back
        if any, else the next fresh one (``fresh``: the next fresh one). One call to the ps, which never fails
        for want of a step: takes run one at a time there (a critical section), so a take finds the step it
        saw, and a look that finds none claims a fresh one."""
        import tensorflow as tf

        def fresh_step() -> Any:
            return count_up(self.counter), tf.constant(-1, tf.int64)

        def take_or_fresh() -> Any:  # In the critical section: no other take between the look and the take.
            return tf.cond(_read(self._available) < 0, self._take, fresh_step)

        def taking() -> Any:
            return self._takes.execute(take_or_fresh, exclusive_resource_access=False)

        with tf.device(self.counter.device):  # Everything on the ps: one call from the worker.
            if fresh:
                return self._record(worker, count_up(self.counter))
            step, which = tf.cond(_read(self._available) < 0, taking, fresh_step)
            return self._record(worker, step, which)

    def _take(self) -> Any:
        import tensorflow as tf

        permitted = count_up(self._available, limit=0)  # Fails when none is left: never, one take at a time.
        with tf.control_dependencies([permitted]):
            which = count_up(self._taken)
        return tf.gather(_read(self._back), which % CAPACITY), which

    def _record(self, worker: Any, step: Any, which: Any = None) -> Any:
        """``step`` as ``worker``'s next claim (only ``worker`` writes its entries: one claim at a time), then
        accounted: in the ring of fresh steps, or of takes (``which``, -1 for a fresh step; None: fresh)."""
        import tensorflow as tf

        made = tf.gather(_read(self._claims), worker)
        slot = tf.reshape(worker * DEPTH + made % DEPTH, [1])
        held = tf.raw_ops.ResourceScatterUpdate(resource=self._held.handle, indices=slot, updates=tf.reshape(step, [1]))
        with tf.control_dependencies([held]):
            one = tf.ones([1], tf.int64)
            counted = tf.raw_ops.ResourceScatterAdd(
                resource=self._claims.handle, indices=tf.reshape(worker, [1]), updates=one
            )
        with tf.control_dependencies([counted]):
            if which is None:
                accounted = _mark(self._fresh, step)
            else:
                accounted = tf.cond(which < 0, lambda: _mark(self._fresh, step), lambda: _mark(self._took, which))
        with tf.control_dependencies([accounted]):
            return tf.identity(step)

    def begin(self, worker: Any) -> Any:
        """Graph, first in every closure that reads the claims, before its input: notes the claims ``worker``
        (an int64 scalar) made so far, then counts the closure as begun (on the ps, in the closure's own
        function: no call of the coordinator's). Returns the claims noted."""
        import tensorflow as tf

        with tf.device(self.counter.device):
            slot = tf.reshape(tf.cast(worker, tf.int64), [1])
            made = tf.gather(_read(self._claims), slot)
            noted = tf.raw_ops.ResourceScatterUpdate(resource=self._begun.handle, indices=slot, updates=made)
            with tf.control_dependencies([noted]):
                one = tf.ones([1], tf.int64)
                counted = tf.raw_ops.ResourceScatterAdd(resource=self._runs.handle, indices=slot, updates=one)
            with tf.control_dependencies([counted]):
                return tf.identity(made)

    def steps_for(self, worker: Any, *, also: Any = None) -> Any:
        """An endless dataset of the steps ``worker`` claims, one per element (:meth:`claim`); with ``also``
        (an int64 variable beside the ledger), each claimed step and that variable's value, read in the same
        call to the ps."""
        import tensorflow as tf

        def claim(_: Any) -> Any:
            step = self.claim(worker)
            return step if also is None else (step, _read(also))

        claims = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
        return claims.map(tf.autograph.experimental.do_not_convert(claim))

    # ------------------------------------------------------------ the coordinator
    def started(self, worker: int) -> int | None:
        """Before a closure runs on ``worker``: the claims it made so far (None: the ps did not answer)."""
        try:
            return int(self._claims.numpy()[worker])
        except Exception as err:
            _log.warning("Could not read worker %d's claims before its step (%s).", worker, err)
            return None

    def failed(self, worker: int, since: int | None) -> tuple[int | None, list[int]]:
        """A closure on ``worker`` failed and goes back to the queue: gives back the steps the worker
        claimed from its claim ``since`` on (:meth:`started`'s). Returns (the claims now, the steps)."""
        if since is None:
            _log.error(
                "A step on worker %d failed, and which steps it had claimed is unknown (the ps did not answer "
                "before it ran): a step it claimed is not trained again.",
                worker,
            )
            return None, []
        try:
            with self._lock:
                made = int(self._claims.numpy()[worker])
                held = self._held.numpy()
                if made - since > DEPTH:
                    _log.error(
                        "Worker %d claimed %d steps in one run; the ledger keeps %d.", worker, made - since, DEPTH
                    )
                steps = [int(held[worker * DEPTH + i % DEPTH]) for i in range(max(since, made - DEPTH), made)]
                for step in steps:
                    self._give_back(step)
                steps += self._give_back_orphans(exclude=steps)
        except Exception as err:
            _log.error("Could not give back worker %d's claims (%s): they are not trained again.", worker, err)
            return since, []
        if steps:
            _log.warning(
                "A step on worker %d failed with global step(s) %s claimed: the next claims take them again.",
                worker,
                steps,
            )
        return made, steps

    def orphans(self) -> tuple[list[int], list[int]]:
        """(fresh steps, take indices) claimed and not accounted yet: claims in flight, or cut in the middle
        (coordinator; the rings hold the last :data:`CAPACITY` of each since the last restore)."""
        counter, taken = int(self.counter.numpy()), int(self._taken.numpy())
        fresh, took = self._fresh.numpy(), self._took.numpy()
        first_fresh, first_take = self._floors
        lost = [s for s in range(max(first_fresh, counter - CAPACITY), counter) if fresh[s % CAPACITY] != s]
        cut = [i for i in range(max(first_take, taken - CAPACITY), taken) if took[i % CAPACITY] != i]
        return lost, cut

    def _give_back_orphans(self, *, exclude: list[int]) -> list[int]:
        """Gives back the steps of claims cut in the middle (unaccounted at every look of :data:`SETTLE`), but
        those in ``exclude`` (given back already), and accounts for them; returns them."""
        import time

        import tensorflow as tf

        lost, cut = self.orphans()
        for pause in SETTLE:
            if not lost and not cut:
                return []
            time.sleep(pause)  # A live worker's claim in flight accounts for its step meanwhile.
            now_lost, now_cut = self.orphans()
            lost, cut = [s for s in lost if s in now_lost], [i for i in cut if i in now_cut]
        back = self._back.numpy()
        steps = [s for s in lost + [int(back[i % CAPACITY]) for i in cut] if s not in exclude]
        for ring, indices in ((self._fresh, lost), (self._took, cut)):
            for index in indices:
                _mark(ring, tf.constant(index, tf.int64))
        for step in steps:
            self._give_back(step)
        if steps:
            _log.warning(
                "Claims cut in the middle had taken global step(s) %s: the next claims take them again.", steps
            )
        return steps

    def _give_back(self, step: int) -> None:
        import tensorflow as tf

        given = int(self._given.numpy())
        if given - int(self._taken.numpy()) >= CAPACITY:
            raise DataError(f"More than {CAPACITY} claimed steps were given back and not claimed again.")
        slot, value = tf.constant([given % CAPACITY], tf.int64), tf.constant([step], tf.int64)
        tf.raw_ops.ResourceScatterUpdate(resource=self._back.handle, indices=slot, updates=value)
        self._given.assign(given + 1)
        self._available.assign_sub(1)  # Last: a claim may take it from now on.

    def pending(self) -> list[int]:
        """The steps given back and not claimed again yet (coordinator, while no claim runs)."""
        taken, given, back = int(self._taken.numpy()), int(self._given.numpy()), self._back.numpy()
        return [int(back[i % CAPACITY]) for i in range(taken, given)]

    def hooks(self) -> _compat.ClosureHooks:
        """What the coordinator calls around each closure that reads this ledger's claims
        (:class:`tfdist._compat.distribute.ClosureWatch`): :meth:`closure_started` before it runs,
        :meth:`closure_failed` when it goes back to the queue, :meth:`closure_ended` when it ends; and the
        closure's function runs :meth:`begin` first."""
        return _compat.ClosureHooks(
            started=self.closure_started, failed=self.closure_failed, begin=self.begin, finished=self.closure_ended
        )

    def closure_started(self, worker: int) -> int | None:
        """Before a closure runs on ``worker``: the closures begun there so far (its :meth:`begin` makes one
        more), read from the ps only when not known (None: the ps did not answer)."""
        known = self._runs_known.get(worker)
        if known is None:
            try:
                known = int(self._runs.numpy()[worker])
            except Exception as err:
                _log.warning("Could not read worker %d's closures before its step (%s).", worker, err)
                return None
            self._runs_known[worker] = known
        return known

    def closure_ended(self, worker: int, begun: int | None, ok: bool) -> None:
        """The closure ended on ``worker`` without going back to the queue: its function ran, and so did its
        :meth:`begin`, when ``ok`` (else the count is read again before the next closure)."""
        self._runs_known[worker] = begun + 1 if ok and begun is not None else None

    def closure_failed(self, worker: int, begun: int | None) -> int | None:
        """A closure on ``worker`` goes back to the queue: gives back the claims it made, those since its
        :meth:`begin` when that ran (the count moved past ``begun``), none when it did not (lost before its
        function ran). Returns the count now: a second put-back of the same run gives back nothing more."""
        self._runs_known[worker] = None
        if begun is None:
            return self.failed(worker, None)[0]
        try:
            with self._lock:
                runs, since = int(self._runs.numpy()[worker]), int(self._begun.numpy()[worker])
                if runs == begun:  # Its function never ran: no claim of its own.
                    since = int(self._claims.numpy()[worker])
        except Exception as err:
            _log.error("Could not read worker %d's claims (%s): a step it claimed is not trained again.", worker, err)
            return None
        self.failed(worker, since)
        self._runs_known[worker] = runs
        return runs

    # ------------------------------------------------------------ backups
    def checkpoint(self) -> Any:
        """What a backup saves of the ledger (a trackable): the counter and the steps given back."""
        import tensorflow as tf

        kept = tf.Module(name="tfdist_claims")
        kept.counter, kept.back, kept.available = self.counter, self._back, self._available
        kept.taken, kept.given, kept.saved = self._taken, self._given, self._saved
        return kept

    def restore(self, checkpoint: Any, path: str | None) -> bool:
        """Saves the ledger with ``checkpoint`` (a backup's ``tf.train.Checkpoint``, as ``tfdist_input``) and
        restores it from ``path`` (the backup's latest save; None: none). Returns whether it held a ledger."""
        import tensorflow as tf

        kept = self.checkpoint()
        self._saved.assign(0)
        if path:
            tf.train.Checkpoint(tfdist_input=kept).read(path).expect_partial()
        self._restored = bool(path) and int(self._saved.numpy()) == 1
        self._floors = (int(self.counter.numpy()), int(self._taken.numpy()))  # The rings are not saved.
        checkpoint.tfdist_input = kept
        self._saved.assign(1)  # Saved from now on: a later restore goes on with the ledger.
        return self._restored

    def resume(self, step: int) -> int:
        """Where the claims go on after a restore at global step ``step``: the restored ledger's next fresh
        step when the backup held one (its steps given back are claimed first), else ``step``."""
        if self._restored:
            return int(self.counter.numpy())
        self.counter.assign(step)
        self._floors = (step, self._floors[1])
        return step
