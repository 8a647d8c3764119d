"""The link probe behind ``tfdist doctor --probe --measure-link``: a server that counts, a sender that times."""

from __future__ import annotations

import socket
import time

import pytest

from tfdist import ClusterSpec
from tfdist.cluster.throughput import _ANSWER, LinkServer, link_peer, measure_link
from tfdist.errors import ClusterSpecError


def test_a_measurement_counts_every_byte_and_the_server_knows_it_was_measured() -> None:
    with LinkServer(0, host="127.0.0.1") as server:
        with socket.create_connection(("127.0.0.1", server.port)):
            pass  # A reachability probe: connects and leaves, measures nothing.
        assert not server.wait(0.2)
        rate = measure_link(f"127.0.0.1:{server.port}", seconds=0.1, timeout=5)
        assert server.wait(5)
    assert 1e8 < rate < 1e12  # Loopback: far above 100 Mbit/s.


def test_the_rate_is_the_second_half_of_the_transfer_so_a_slow_start_does_not_lower_it() -> None:
    block = bytes(1 << 16)
    with LinkServer(0, host="127.0.0.1") as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        start = time.perf_counter()
        sock.sendall(block)  # A slow start: one block, then nothing for half the time...
        time.sleep(0.5)
        while time.perf_counter() - start < 1.0:  # ...then as fast as loopback goes.
            sock.sendall(block)
        sock.shutdown(socket.SHUT_WR)
        got, rate = _ANSWER.unpack(sock.recv(_ANSWER.size, socket.MSG_WAITALL))
        whole = got * 8 / (time.perf_counter() - start)
    assert got > 10 * len(block)
    assert rate > 1.6 * whole  # The whole transfer's average counts the idle half; the rate does not.


def test_a_peer_that_starts_late_is_waited_for_and_one_that_never_starts_is_an_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(OSError):
        measure_link(f"127.0.0.1:{port}", seconds=0.05, timeout=0.5)
    assert 0.4 < time.monotonic() - start < 3
    with pytest.raises(ClusterSpecError, match="`seconds`. Received: 0"):
        measure_link(f"127.0.0.1:{port}", seconds=0)


def test_a_taken_port_cannot_be_served() -> None:
    with LinkServer(0, host="127.0.0.1") as server, pytest.raises(OSError):
        LinkServer(server.port, host="127.0.0.1")


def test_each_task_measures_its_link_to_the_next_as_in_a_ring() -> None:
    spec = ClusterSpec.local(workers=2, chief=True, evaluator=True)
    peers = {t.name: link_peer(spec.with_task(t.type, t.index)) for t in spec.tasks() if t.type != "evaluator"}
    assert {name: peer.name for name, peer in peers.items() if peer} == {
        "chief:0": "worker:0",
        "worker:0": "worker:1",
        "worker:1": "chief:0",
    }
    assert link_peer(spec) is None  # No current task.
    assert link_peer(spec.with_task("evaluator", 0)) is None
    assert link_peer(ClusterSpec.local(workers=1).with_task("worker", 0)) is None
