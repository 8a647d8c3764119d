"""The chief of ParameterServerStrategy fits where workers come and go (tests/keras/test_ledger_ps.py).

The data is tests/support/exact_tasks.py's 480 records written per class. Two fits from ``fit_input``, one
after the other on one cluster (a chief, 2 workers, a ps), each with a fresh counted model, and each step
counted per worker in a variable on the ps (the worker index is TF's ``experimental_get_current_worker_index``):

- ``straggler``: the plain claimed steps (each record once per data epoch), 2 fit epochs of 20 steps. Every
  step first computes for about 50 ms of CPU, the same on both workers; the test makes worker 1 a straggler
  (a :class:`~tfdist.launch.Straggler` fault: it runs a quarter of the time) for this fit.
- ``lost``: stratified draws (``"balanced"``), 3 fit epochs of 20 steps. Worker 0's steps first wait (at most
  240 s) until worker 1 took a step of this fit: a worker slow to make its input (over 5 s on a loaded
  machine) takes its first step late. Worker 1's first step from the optimizer's step 25 to 49 prints
  ``HOLD lost n`` and sleeps (at most 20 s) before anything else of it: the test's ``LoseAt`` kills it on that
  line, with the step claimed and not trained, and its ``ReturnAt`` brings it back on the chief's line that
  gives the step back. Worker 0's first step after the hold that leaves at least 5 steps of its fit epoch
  prints ``WAIT lost n`` and waits (at most 240 s) until worker 1 took a step: the fit does not end before
  the returned worker joins the claims, and the steps left are there for it (a wait in the epoch's last
  step would wait for nothing: ``join`` schedules no more until it ends). Every step of worker 1 after the
  hold counts as one after its return.

Then a third fit on the same coordinator, ``after``: the plain pipeline in ``order="buffer"`` (no claims),
1 fit epoch of 4 steps.

The chief returns per fit the counts, the steps claimed, the optimizer's iterations and the steps per
worker, and the counts at each fit epoch's end; for ``lost`` also the NumPy reference of the draws after 1, 2
and 3 data epochs (tests/keras/_tasks_strata_ps.py); and per fit how many times the coordinator's hook ran
before a closure, and how many of those read the ps (``ledger_reads``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tests.keras import _tasks_strata_ps as strata
from tests.support import exact_tasks

STEPS = exact_tasks.RECORDS // exact_tasks.GLOBAL_BATCH  # 20 steps per data epoch
BUSY = 1000  # A straggler fit's step first multiplies 128x128 matrices this many times: ~50 ms of CPU.
HOLD_AT, HOLD_BEFORE = 25, 50  # Worker 1's first step in this range of optimizer steps is held for the kill.
LEFT = 5  # Worker 0 waits for the returned worker in a step that leaves at least this many of its fit epoch.
WAIT_SECONDS = 240  # The longest wait of worker 0 (for worker 1's first step, and for its return).


def _sleep(microseconds: Any) -> Any:
    """Graph: waits ``microseconds`` on the worker that runs it (tf.data's SleepDataset: no CPU)."""
    import tensorflow as tf

    one = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
    slow = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(one),
        sleep_microseconds=tf.cast(microseconds, tf.int64),
        output_types=[tf.int64],
        output_shapes=[[]],
    )
    return tf.data.experimental.from_variant(slow, one.element_spec).get_single_element()


def _busy(iterations: int) -> Any:
    """Graph: about ``iterations`` / 20 ms of CPU on the worker that runs it (chained 128x128 matmuls)."""
    import tensorflow as tf

    def body(i: Any, x: Any) -> Any:
        return i + 1, tf.tanh(tf.matmul(x, x) * 0.01)

    start = [tf.constant(0), tf.fill([128, 128], 0.5)]
    return tf.reduce_sum(tf.while_loop(lambda i, x: i < iterations, body, start)[1])


def _straggler(ran: Any) -> Any:
    """The ``before_step`` of the straggler fit: the same CPU work on every worker; each step counted per worker."""
    import tensorflow as tf

    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    with tf.control_dependencies([_busy(BUSY)]):
        return ran.assign_add(tf.one_hot(worker, 2, dtype=tf.int64))


def _wait_until(done: Any) -> Any:
    """Graph: waits until ``done()`` (a boolean read each 50 ms) or :data:`WAIT_SECONDS` passed."""
    import tensorflow as tf

    start = tf.timestamp()

    def more(i: Any) -> Any:
        with tf.control_dependencies([_sleep(50_000)]):
            return i + 1

    def waiting(i: Any) -> Any:
        del i
        return tf.logical_not(done()) & (tf.timestamp() - start < WAIT_SECONDS)

    return tf.while_loop(waiting, more, [tf.constant(0, tf.int64)])[0]


def _lose_then_return(ran: Any, flags: Any) -> Any:
    """The ``before_step`` of the lost fit (module docstring); ``flags``: [worker 1 held its step, worker 1's
    steps since]."""
    import tensorflow as tf

    def bump(index: int) -> Any:
        return tf.raw_ops.ResourceScatterAdd(resource=flags.handle, indices=[index], updates=tf.ones([1], tf.int64))

    def model_step(model: Any) -> Any:
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        iterations = model.optimizer.iterations
        lost, since = flags[0] > 0, flags[1]

        def first_of_worker_1() -> Any:  # Worker 0, until worker 1 took a step of this fit.
            return _wait_until(lambda: ran[1] > 0)

        def held() -> Any:
            with tf.control_dependencies([bump(0)]):
                said = tf.print("HOLD lost", iterations, output_stream=sys.stdout)
            with tf.control_dependencies([said]):
                return _sleep(20_000_000)  # The kill lands within this.

        def wait_for_worker_1() -> Any:  # Worker 0, after the loss, until worker 1 is back and took a step.
            said = tf.print("WAIT lost", iterations, output_stream=sys.stdout)
            with tf.control_dependencies([said]):
                return _wait_until(lambda: flags[1] > 0)

        def after_return() -> Any:
            with tf.control_dependencies([bump(1)]):
                return tf.constant(0, tf.int64)

        def none() -> Any:
            return tf.constant(0, tf.int64)

        on_0, on_1 = tf.equal(worker, 0), tf.equal(worker, 1)
        started = tf.cond(on_0 & tf.equal(ran[1], 0), first_of_worker_1, none)
        first = on_1 & (iterations >= HOLD_AT) & (iterations < HOLD_BEFORE) & tf.logical_not(lost)
        with tf.control_dependencies([started]):
            waited = tf.cond(first, held, none)
        left = STEPS - iterations % STEPS - 1  # The steps of this fit epoch after this one.
        with tf.control_dependencies([waited]):
            joined = tf.case(
                [
                    (lost & on_1, after_return),
                    (lost & on_0 & tf.equal(since, 0) & (left >= LEFT), wait_for_worker_1),
                ],
                default=none,
            )
        with tf.control_dependencies([joined]):
            return ran.assign_add(tf.one_hot(worker, 2, dtype=tf.int64))

    return model_step


def _fit(strategy: Any, data: Any, *, tag: str, epochs: int, before_step: Any) -> dict[str, Any]:
    """One counted fit from ``fit_input(data)``; the counts are also kept at each fit epoch's end (after the
    coordinator's join: every step of the epoch done)."""
    from tfdist import keras
    from tfdist.keras.inputs import fit_input

    with strategy.scope():
        model = exact_tasks.counted_model(print_steps=True, step_tag=tag, before_step=before_step)
    by_epoch: list[list[int]] = []

    class Counts(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            by_epoch.append([int(c) for c in model.counts.numpy()])
            print(f"EPOCH {tag} {epoch}", flush=True)

    x = fit_input(data, strategy=strategy, steps_per_epoch=STEPS)
    model.fit(x, epochs=epochs, steps_per_epoch=STEPS, verbose=0, callbacks=[Counts()])
    return {
        "counts": [int(c) for c in model.counts.numpy()],
        "by_epoch": by_epoch,
        "claimed": data.claimed_steps(),
        "iterations": int(model.optimizer.iterations.numpy()),
    }


def _count_reads(reads: dict[str, int], fit: list[str]) -> None:
    """Counts each call of ``StepLedger.closure_started`` (the coordinator's hook before a closure) under the tag
    ``fit[0]`` of the fit running, and under ``fit[0] + ' ps'`` those that read the ps (it did not know the
    closures begun on that worker)."""
    from tfdist.data.order.ledger import StepLedger

    started = StepLedger.closure_started

    def counted(self: StepLedger, worker: int) -> int | None:
        reads[fit[0]] = reads.get(fit[0], 0) + 1
        if self._runs_known.get(worker) is None:
            reads[fit[0] + " ps"] = reads.get(fit[0] + " ps", 0) + 1
        return started(self, worker)

    StepLedger.closure_started = counted  # type: ignore[method-assign]


def ledger_ps_fits(workdir: str, prefix: str) -> dict[str, Any]:
    """Runs the straggler fit, the lost fit, then a fit without claims (module docstring); returns their
    results."""
    import tensorflow as tf

    import tfdist
    from tfdist.keras.inputs import fit_input

    del workdir
    reads: dict[str, int] = {}
    fit = ["straggler"]
    _count_reads(reads, fit)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("tfdist").setLevel(logging.INFO)
    strategy = tfdist.build_strategy("auto")
    assert isinstance(strategy, tf.distribute.ParameterServerStrategy), type(strategy)
    with strategy.scope():
        ran = tf.Variable(tf.zeros([2], tf.int64), trainable=False, name="ran_straggler")
        ran_lost = tf.Variable(tf.zeros([2], tf.int64), trainable=False, name="ran_lost")
        flags = tf.Variable(tf.zeros([2], tf.int64), trainable=False, name="lost_flags")

    plain = exact_tasks.pipeline(prefix + "-*", num_epochs=None)
    results: dict[str, Any] = {
        "straggler": _fit(strategy, plain, tag="straggler", epochs=2, before_step=lambda m: _straggler(ran))
    }
    results["straggler"]["ran"] = ran.numpy().tolist()

    fit[0] = "lost"
    drawn = strata._pipeline(prefix, "balanced")
    lost = _fit(strategy, drawn, tag="lost", epochs=3, before_step=_lose_then_return(ran_lost, flags))
    lost["ran"], lost["after_return"] = ran_lost.numpy().tolist(), int(flags.numpy()[1])
    lost["numpy"] = [strata.numpy_counts(prefix, "balanced", e * STEPS * exact_tasks.GLOBAL_BATCH) for e in (1, 2, 3)]
    results["lost"] = lost

    fit[0] = "after"
    unclaimed = exact_tasks.pipeline(prefix + "-*", num_epochs=None, order="buffer")
    with strategy.scope():
        model = exact_tasks.counted_model()
    model.fit(fit_input(unclaimed, strategy=strategy, steps_per_epoch=4), epochs=1, steps_per_epoch=4, verbose=0)
    results["after"] = {"iterations": int(model.optimizer.iterations.numpy())}
    results["ledger_reads"] = reads
    return results
