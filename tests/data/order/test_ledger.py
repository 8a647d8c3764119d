"""The ledger of parameter-server claims in one process: steps given back are claimed again, once each.

The coordinator's part (``started``, ``failed``) is called by hand here; the real runs, where TF's
ClusterCoordinator calls it as a worker dies, are in tests/keras/test_ledger_ps.py and
tests/keras/test_resume_ps.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import tensorflow as tf

from tests.support.records import ID_ONLY, example
from tfdist.data import write_tfrecords
from tfdist.data.order.claims import claim_options, claimed_steps
from tfdist.data.order.index import epoch_order
from tfdist.data.order.ledger import StepLedger
from tfdist.data.records.files import list_files


def _steps(ledger: StepLedger, worker: int) -> Iterator[Any]:
    """``worker``'s claims, one at a time (nothing claimed ahead, as in the claimed steps' datasets)."""
    return iter(ledger.steps_for(tf.constant(worker, tf.int64)).with_options(claim_options()))


def test_a_failed_run_gives_back_exactly_the_claims_it_made() -> None:
    ledger = StepLedger(workers=2)
    one, two = _steps(ledger, 0), _steps(ledger, 1)
    assert [int(next(one)), int(next(two)), int(next(one))] == [0, 1, 2]
    since = ledger.started(1)  # A closure starts on worker 1: it claims 3 and 4, then its worker dies.
    assert [int(next(two)), int(next(two))] == [3, 4]
    made, steps = ledger.failed(1, since)
    assert (made, steps) == (3, [3, 4]) and ledger.pending() == [3, 4]
    assert ledger.failed(1, made) == (3, [])  # The same run put back again: nothing more.
    assert [int(next(one)) for _ in range(3)] == [3, 4, 5]  # Given back first, in order, then fresh.
    assert ledger.pending() == [] and int(ledger.counter.numpy()) == 6


def test_a_closure_gives_back_the_claims_made_since_its_begin_and_reads_only_then() -> None:
    # The coordinator's hooks: the closures begun are counted in Python while closures end, and the ps is read
    # only when a closure fails (and once per worker at the start).
    ledger = StepLedger(workers=2)
    begin = tf.function(lambda worker: ledger.begin(tf.constant(worker, tf.int64)))
    one, two = _steps(ledger, 0), _steps(ledger, 1)
    assert ledger.closure_started(1) == 0  # Read once.
    begin(1)
    assert int(next(two)) == 0
    ledger.closure_ended(1, 0, True)
    runs, ledger._runs = ledger._runs, None  # Known now: nothing read (a read would fail).
    assert ledger.closure_started(1) == 1
    ledger._runs = runs
    begin(1)
    assert [int(next(two)), int(next(two))] == [1, 2]
    assert ledger.closure_failed(1, 1) == 2 and ledger.pending() == [1, 2]  # Its worker died: steps 1 and 2.
    assert ledger.closure_failed(1, 2) == 2 and ledger.pending() == [1, 2]  # Put back again: nothing more.
    # A closure lost before its function ran (no begin): its worker's last claims were trained.
    assert ledger.closure_started(1) == 2
    assert [int(next(one)), int(next(one))] == [1, 2]
    assert ledger.closure_failed(1, 2) == 2 and ledger.pending() == []
    # A closure that ended in an error: the count is read again before the next one.
    begin(0)
    ledger.closure_ended(0, None, False)
    assert ledger.closure_started(0) == 1 and int(next(one)) == 3


def test_a_claim_cut_in_the_middle_is_given_back_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker dies while the ps runs its claim: the ps cancels the rest of the call, so the step was taken
    # (the counter moved) but never recorded as the worker's claim, nor accounted.
    from tfdist.data.order import ledger as module
    from tfdist.data.order.ledger import count_up

    monkeypatch.setattr(module, "SETTLE", (0.0,))
    ledger = StepLedger(workers=2)
    one = _steps(ledger, 0)
    assert int(next(one)) == 0
    since = ledger.started(1)
    assert int(count_up(ledger.counter)) == 1  # Worker 1's claim, cut right after it took fresh step 1.
    assert ledger.orphans() == ([1], [])
    made, steps = ledger.failed(1, since)
    assert (made, steps) == (0, [1]) and ledger.pending() == [1]
    assert ledger.orphans() == ([], []) and ledger.failed(1, made) == (0, [])  # Given back once.
    # A take cut the same way: step 1 given back, taken (both counters moved), never recorded.
    assert int(count_up(ledger._available, limit=0)) == -1 and int(count_up(ledger._taken)) == 0
    assert ledger.orphans() == ([], [0])
    assert ledger.failed(1, made) == (0, [1])
    assert [int(next(one)) for _ in range(2)] == [1, 2]  # Step 1 once more, then fresh.
    assert ledger.orphans() == ([], [])


def test_a_claim_in_flight_on_a_live_worker_is_not_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfdist.data.order import ledger as module
    from tfdist.data.order.ledger import count_up

    ledger = StepLedger(workers=2)
    assert int(count_up(ledger.counter)) == 0  # Worker 0's claim took step 0; its record is on its way.
    accounted = threading.Timer(0.2, lambda: module._mark(ledger._fresh, tf.constant(0, tf.int64)))
    monkeypatch.setattr(module, "SETTLE", (1.0,))
    accounted.start()
    assert ledger.failed(1, ledger.started(1)) == (0, [])
    accounted.join()


def test_a_run_that_claimed_nothing_gives_back_nothing() -> None:
    # A worker lost between two steps: its last claim was trained, and the closure sent to it never claimed.
    ledger = StepLedger(workers=2)
    steps = _steps(ledger, 1)
    assert int(next(steps)) == 0
    assert ledger.failed(1, ledger.started(1)) == (1, [])
    assert int(next(_steps(ledger, 0))) == 1


def test_unknown_claims_give_back_nothing_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    ledger = StepLedger(workers=1)
    with caplog.at_level(logging.ERROR, logger="tfdist.data"):
        assert ledger.failed(0, None) == (None, [])
    assert "a step it claimed is not trained again" in caplog.text


def test_concurrent_claims_take_each_step_given_back_once() -> None:
    # 4 workers claim side by side while the coordinator gives back 150 steps: each fresh step is claimed once,
    # and each step given back once more, whoever takes it (a claim that loses the race claims a fresh step).
    ledger = StepLedger(workers=4)
    got: list[int] = []
    lock, done = threading.Lock(), threading.Event()

    def claim(worker: int) -> None:
        steps = _steps(ledger, worker)
        mine = []
        while not done.is_set():
            mine.append(int(next(steps)))
        mine += [int(next(steps)) for _ in range(50)]  # After the last give-back: 200 claims take them all.
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=claim, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    while int(ledger.counter.numpy()) < 300:
        time.sleep(0.001)
    given = list(range(0, 300, 2))
    for step in given:  # Claimed already; given back as a failed run's claims are, while the others claim.
        ledger._give_back(step)
    done.set()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert ledger.pending() == []
    assert Counter(got) == Counter(range(int(ledger.counter.numpy()))) + Counter(given)


def test_a_backup_saves_the_ledger_and_a_restore_goes_on_with_it(tmp_path) -> None:
    saved = StepLedger(workers=2)
    steps = _steps(saved, 0)
    [next(steps) for _ in range(5)]
    saved.failed(0, 3)  # Steps 3 and 4 given back, not claimed again before the backup.
    backup = tf.train.Checkpoint()
    assert not saved.restore(backup, None)  # Nothing to restore; saved with the backup from now on.
    path = backup.write(str(tmp_path / "backup"))

    restored = StepLedger(workers=2)
    assert restored.restore(tf.train.Checkpoint(), path)
    assert restored.resume(3) == 5 and restored.pending() == [3, 4]
    again = _steps(restored, 1)
    assert [int(next(again)) for _ in range(3)] == [3, 4, 5]

    # A backup made before the ledger (or without ResumeInput): the claims go on at fit's step.
    plain = tf.train.Checkpoint(v=tf.Variable(1)).write(str(tmp_path / "plain"))
    fresh = StepLedger(workers=2)
    assert not fresh.restore(tf.train.Checkpoint(), plain)
    assert fresh.resume(7) == 7 and int(next(_steps(fresh, 0))) == 7


def test_claimed_steps_read_a_step_given_back_again(tmp_path) -> None:
    prefix = str(tmp_path / "part")
    write_tfrecords((example(i) for i in range(40)), prefix, num_shards=2)
    listing = list_files([prefix + "-*"])
    order = epoch_order(listing, block=2, streams=2, window=0, seed=5, shuffle=True, compression=None)
    ledger = StepLedger(workers=1)
    paths = [f.path for f in listing.files]
    batches = iter(claimed_steps(order, paths, compression="", global_batch=4, counter=ledger, passes=1))

    def ids() -> list[int]:
        return sorted(int(tf.io.parse_single_example(r, ID_ONLY)["id"]) for r in next(batches))

    first = [ids(), ids()]
    ledger.failed(0, 1)  # Step 1's run failed: it is read again next.
    assert ids() == first[1]
    rest = [ids() for _ in range(8)]  # Steps 2..9: the data epoch's other records, each once.
    assert sorted(i for b in first + rest for i in b) == list(range(40))
    with pytest.raises(StopIteration):
        next(batches)
