"""Faults that last, applied by the supervisor: a cut link, a slowed link, a straggler.

The real runs are plain Python programs on simulated hosts (no TensorFlow): the bytes on the wire and the CPU
a task gets are measured directly. TensorFlow under these faults: tests/keras/test_elastic.py (a cut link
under elastic MultiWorkerMirroredStrategy) and tests/keras/test_ledger_ps.py (a straggler under parameter
servers).
"""

from __future__ import annotations

import re
import signal
import sys
import time
from typing import Any, cast

import pytest

from tests.support.processes import assert_all_gone
from tfdist import launch
from tfdist.launch import LaunchConfig, PartitionAt, SlowLink, Straggler
from tfdist.launch.engines.base import Engine
from tfdist.launch.supervisor._impair import Ends, Impairments, Throttle, ending

PY = sys.executable

# worker:0 sends a numbered UDP datagram to worker:1 every 10 ms for SECONDS and prints every gap of more
# than 0.3 s between echoes; worker:1 echoes them. With PEER_TIMEOUT, worker:0 gives its peer up (exit 1)
# after that long without an echo, as a collective's peer does; alone in its group it has no peer (exit 0).
ECHO = """
import json, os, socket, sys, time
seconds, peer_timeout = float(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else None
spec = json.loads(os.environ["TF_CONFIG"]); me = spec["task"]["index"]; workers = spec["cluster"]["worker"]
if len(workers) == 1:
    print("ALONE", flush=True); sys.exit(0)
host, port = workers[1].rsplit(":", 1)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if me == 1:
    udp.bind((host, int(port))); udp.settimeout(seconds + 30)
    while (data := udp.recvfrom(64))[0] != b"end":
        udp.sendto(*data)
    sys.exit(0)
udp.settimeout(0.01)
start = last = time.monotonic(); echoes = 0
while time.monotonic() - start < seconds:
    udp.sendto(b"ping", (host, int(port)))
    try:
        while udp.recvfrom(64):
            now = time.monotonic(); echoes += 1
            if now - last > 0.3:
                print(f"GAP {now - last:.3f}", flush=True)
            last = now
            if echoes == 20:
                print("ECHO 20", flush=True)
    except OSError:
        if peer_timeout is not None and time.monotonic() - last > peer_timeout:
            print("PEER LOST", flush=True); sys.exit(1)
udp.sendto(b"end", (host, int(port)))
print("ECHOES", echoes, flush=True)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_cut_link_stops_the_bytes_both_ways_and_its_return_restores_them() -> None:
    statuses: list[str] = []
    result = launch.run(
        [PY, "-c", ECHO, "5"],
        workers=2,
        simulate_hosts=2,
        partitions=("worker:1@after=^ECHO 20$,for=1.5",),
        timeout=60,
        on_status=statuses.append,
    )
    assert result.exit_code == 0, result.summary() + "\n".join(statuses)
    out = result.task("worker:0").output
    gaps = [float(g) for g in re.findall(r"^GAP (\S+)$", out, re.M)]
    assert len(gaps) == 1 and 1.5 <= gaps[0] <= 2.0, out  # no echo for the 1.5 s cut, at once after it
    assert int(re.findall(r"^ECHOES (\d+)$", out, re.M)[0]) > 100, out  # ...and every 10 ms before and after
    cut = [s for s in statuses if "link cut" in s]
    back = [s for s in statuses if "link is back" in s]
    assert cut == [
        "fault injection: worker:1's link cut (host 10.9.0.2: worker:1) after worker:0 printed /^ECHO 20$/ "
        + cut[0].rsplit("/ ", 1)[1]
    ], statuses
    assert cut[0].endswith("; for 1.5 s") and len(back) == 1, statuses
    assert re.search(r"back \(host 10\.9\.0\.2: worker:1\) after 1\.[5-9] s \(at \d+\.\ds\)$", back[0]), back
    assert_all_gone([t.pid for t in result.tasks])


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
@pytest.mark.parametrize("elastic", [False, True])
def test_a_peer_that_fails_of_a_cut_link_fails_the_run_or_the_cut_worker_is_lost(elastic: bool) -> None:
    statuses: list[str] = []
    result = launch.run(
        [PY, "-c", ECHO, "30", "1.0"],
        workers=2,
        simulate_hosts=2,
        partitions=("worker:1@after=^ECHO 20$",),
        timeout=60,
        grace_seconds=1,
        on_status=statuses.append,
        min_workers=1 if elastic else None,
    )
    assert "PEER LOST" in result.task("worker:0").output
    if not elastic:  # fail fast, saying why
        assert (result.exit_code, result.failed_task) == (1, "worker:0"), result.summary()
        assert "worker:0 exited with 1 while the link of worker:1 is cut" in statuses, statuses
    else:  # the unreachable worker leaves, not its peer; the group of one goes on
        assert result.exit_code == 0, result.summary() + "\n".join(statuses)
        assert "elastic: losing worker:1 (its link is cut; worker:0 exited with 1)" in statuses, statuses
        assert "ALONE" in result.task("worker:0").output and result.task("worker:1").lost
    assert_all_gone([t.pid for t in result.tasks])


# worker:1 sends to worker:0 without end; worker:0 measures the rate it receives for 1.5 s, prints PHASE 1, waits
# 0.5 s (the slow link's trigger), measures again, prints PHASE 2, waits, and measures a third time.
PHASES = """
import json, os, socket, sys, time
spec = json.loads(os.environ["TF_CONFIG"]); me = spec["task"]["index"]; workers = spec["cluster"]["worker"]
host, port = workers[0].rsplit(":", 1)
if me == 1:
    for _ in range(400):
        try:
            conn = socket.create_connection((host, int(port)), timeout=10); break
        except OSError:
            time.sleep(0.05)
    block = b"x" * (1 << 16)
    try:
        while True:
            conn.sendall(block)
    except OSError:
        sys.exit(0)
conn, _ = socket.create_server((host, int(port))).accept()
def rate(seconds):
    got, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        got += len(conn.recv(1 << 20))
    return got * 8 / (time.monotonic() - start)
def idle(seconds):
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        conn.recv(1 << 20)
idle(0.5)
for phase in (1, 2, 3):
    print("RATE", phase, rate(1.5), flush=True)
    if phase < 3:
        print("PHASE", phase, flush=True); idle(0.7)
conn.close()
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_slowed_link_carries_its_new_rate_then_its_own_again() -> None:
    statuses: list[str] = []
    result = launch.run(
        [PY, "-c", PHASES],
        workers=2,
        simulate_hosts=2,
        links=("100mbit",),
        slow_links=("worker:1=10mbit@after=^PHASE 1$,until=^PHASE 2$",),
        timeout=60,
        on_status=statuses.append,
    )
    assert result.exit_code == 0, result.summary() + "\n".join(statuses)
    rates = {int(p): float(r) for p, r in re.findall(r"^RATE (\d) (\S+)$", result.task("worker:0").output, re.M)}
    sys.stderr.write(f"measured bits/s: {rates}\n")
    for phase, rate in ((1, 100e6), (2, 10e6), (3, 100e6)):
        assert 0.8 * rate <= rates[phase] <= 1.2 * rate, rates
    assert any("worker:1's link slowed to 10mbit (host 10.9.0.2: worker:1)" in s for s in statuses), statuses
    assert any("worker:1's link is 100mbit again (host 10.9.0.2: worker:1)" in s for s in statuses), statuses


# Each task burns CPU in one thread and prints, every second, the share of that second it ran.
BURN = """
import os, time
task, second = os.environ["TFDIST_TASK"], 0
while True:
    start, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - start < 1.0:
        pass
    print("SHARE", task, second, round((time.process_time() - cpu) / (time.monotonic() - start), 3), flush=True)
    second += 1
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(90)
def test_a_straggler_runs_its_fraction_of_the_time_then_all_of_it_and_stops_when_asked() -> None:
    statuses: list[str] = []
    result = launch.run(
        [PY, "-c", BURN],
        workers=2,
        stragglers=("worker:1=0.25,until=^SHARE worker:1 3 ",),
        timeout=8,
        grace_seconds=1,
        on_status=statuses.append,
    )
    assert result.reason == "timeout", result.summary()  # they burn until stopped: a straggler is stopped too
    shares = {
        (task, int(second)): float(share)
        for task, second, share in re.findall(
            r"^SHARE (\S+) (\d+) (\S+)$", "\n".join(t.output for t in result.tasks), re.M
        )
    }
    sys.stderr.write(f"measured shares: {shares}\n")
    slowed = [shares[("worker:1", s)] / shares[("worker:0", s)] for s in (1, 2)]
    again = [shares[("worker:1", s)] / shares[("worker:0", s)] for s in (5, 6) if ("worker:1", s) in shares]
    assert all(0.1 <= ratio <= 0.4 for ratio in slowed), shares  # a quarter of the time
    assert again and all(ratio >= 0.6 for ratio in again), shares  # all of it after the window
    assert "timeout after 8s; stopping every task" in statuses, statuses
    assert any("worker:1 runs all the time again after" in s for s in statuses), statuses
    assert_all_gone([t.pid for t in result.tasks])


class _Links(Engine):
    """An engine with links only: records what the supervisor asked of them."""

    name = "links"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def place(self, config: LaunchConfig) -> Any:
        raise NotImplementedError

    def reserve_address(self) -> str:
        raise NotImplementedError

    def start(self, task: str, argv: Any, env: Any, on_line: Any) -> Any:
        raise NotImplementedError

    def cut_link(self, task: str, cut: bool) -> str:
        self.calls.append(("cut", task, cut))
        return "10.9.0.2"

    def shape_link(self, task: str, rate: str | None) -> str:
        self.calls.append(("shape", task, rate))
        return "10.9.0.2"


def test_impairments_apply_end_and_blame_the_unreachable() -> None:
    config = LaunchConfig(command=("x",), workers=3, chief=True, simulate_hosts=3, links=("1gbit",))
    engine, statuses = _Links(), cast(list[str], [])
    impairments = Impairments(config, engine, statuses.append, lambda task: None)
    first = PartitionAt(task="worker:1", after="^A$", for_seconds=5)
    end = impairments.start(first, "after worker:0 printed /^A$/ (2.0s)", 2.0)
    assert end == Ends(task="worker:1", seconds=7.0, of=first)
    # 4 tasks on 3 hosts: chief:0 and worker:2 share the first.
    assert impairments.cut_off() == ["worker:1"] and impairments.on_host_of("worker:2") == ["chief:0", "worker:2"]
    assert impairments.blame("worker:0", 1, elastic_workers=["worker:0", "worker:1", "worker:2"]) == ("worker:1",)
    assert impairments.blame("worker:1", 1, elastic_workers=["worker:0", "worker:1"]) == ("worker:1",)
    assert impairments.blame("worker:0", 1, elastic_workers=()) == ()
    assert statuses[-1] == "worker:0 exited with 1 while the link of worker:1 is cut"
    # A second cut of the same link replaces the first: the first one's end does nothing, the second's mends it.
    second = PartitionAt(task="worker:1", seconds=3, until="^B$")
    second_end = impairments.start(second, "at 3.0s", 3.0)
    assert not impairments.end(end, "at 7.0s") and impairments.cut_off() == ["worker:1"]
    assert second_end is not None and impairments.end(second_end, "after worker:0 printed /^B$/ (9.0s)")
    assert impairments.cut_off() == []
    assert engine.calls == [("cut", "worker:1", True), ("cut", "worker:1", True), ("cut", "worker:1", False)]
    # One cut per host: worker:2's replaces chief:0's (they share a host), and ending chief:0's does nothing.
    on_host = PartitionAt(task="chief:0", seconds=1, for_seconds=1)
    on_host_end = impairments.start(on_host, "at 1.0s", 1.0)
    assert impairments.start(PartitionAt(task="worker:2", seconds=1.5), "at 1.5s", 1.5) is None  # to the end
    assert on_host_end is not None and not impairments.end(on_host_end, "at 2.0s")
    assert impairments.cut_off() == ["chief:0", "worker:2"]
    engine.calls.clear()
    slow = SlowLink(task="chief:0", rate="10mbit")
    assert impairments.start(slow, "at 0.0s", 0.0) is None  # to the end of the run
    assert engine.calls == [("shape", "chief:0", "10mbit")]
    assert statuses[-1] == (
        "fault injection: chief:0's link slowed to 10mbit (host 10.9.0.2: chief:0, worker:2) at 0.0s; to the end "
        "of the run"
    )
    assert ending(Straggler(task="worker:1", fraction=0.5), elapsed=1.0) is None
    impairments.close()


class _Recorded:
    """A task process that records the signals it gets."""

    pid = None

    def __init__(self) -> None:
        self.signals: list[int] = []

    def signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_a_throttle_stops_and_continues_each_period_and_continues_everything_when_closed() -> None:
    proc = _Recorded()
    throttle = Throttle(lambda task: proc)  # type: ignore[arg-type,return-value]
    throttle.set("worker:1", 0.5)
    time.sleep(0.55)
    throttle.set("worker:1", None)
    time.sleep(0.25)
    stops = proc.signals.count(signal.SIGSTOP)
    assert 4 <= stops <= 7 and proc.signals.count(signal.SIGCONT) == stops, proc.signals  # one pair per period
    throttle.close()
    assert proc.signals[-1] == signal.SIGCONT and proc.signals.count(signal.SIGSTOP) == stops
