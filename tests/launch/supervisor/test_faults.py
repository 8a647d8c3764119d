"""Fault injections fire on progress, and carry what the run had recorded the moment their line was read."""

from __future__ import annotations

from pathlib import Path

from tfdist.cluster import elastic
from tfdist.launch.events import KillAt, ReturnAt
from tfdist.launch.supervisor._faults import FaultInjector


def test_a_line_trigger_snapshots_the_boundaries_as_its_line_is_read_not_when_the_supervisor_acts(
    tmp_path: Path,
) -> None:
    # The leader prints the trigger line, then records the boundary of that epoch before the supervisor's next
    # pass: the return must see only the boundaries recorded before its line, so it joins at this epoch's end.
    directory = str(tmp_path)
    elastic.write_boundary(directory, generation=1, epoch=0, world_size=2)
    faults = FaultInjector(
        [ReturnAt(task="worker:2", after="^STEP 1 15$"), KillAt(task="worker:1", seconds=5)],
        snapshot=lambda: elastic.recorded(directory),
    )
    faults.on_line("worker:0", "STEP 1 14")
    faults.on_line("worker:0", "STEP 1 15")
    elastic.write_boundary(directory, generation=1, epoch=1, world_size=2)  # training went on meanwhile
    faults.on_line("worker:0", "STEP 1 15")  # fires once only
    fired = faults.due(1.0)
    assert [(str(f.event), f.seen) for f in fired] == [
        ("worker:2@after=^STEP 1 15$", frozenset({"epoch-g0001-e000000.json"}))
    ]
    seen: set[str] = set()
    assert [r["epoch"] for r in elastic.read_boundaries(directory, seen, only=fired[0].seen)] == [0]
    assert [r["epoch"] for r in elastic.read_boundaries(directory, seen)] == [1]  # left for the join
    # A timed event snapshots when it is due.
    (timed,) = faults.due(6.0)
    assert str(timed.event) == "worker:1@5" and timed.seen == elastic.recorded(directory)
    assert len(timed.seen) == 2 and faults.due(7.0) == []


def test_without_a_snapshot_nothing_is_recorded() -> None:
    faults = FaultInjector([KillAt(task="worker:1", after="boom")])
    faults.on_line("worker:0", "boom")
    (fired,) = faults.due(0.0)
    assert fired.seen == frozenset() and fired.when == "after worker:0 printed /boom/ (0.0s)"
