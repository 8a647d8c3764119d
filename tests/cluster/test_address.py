"""Free ports: above the kernel's ephemeral range, reserved across the pickers of this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist.cluster import address as _address


@pytest.fixture
def ports_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of its own (so the machine's reservations stay out) and its reservations file."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    return tmp_path / f"tfdist-ports-{os.getuid()}"


def _kernel_range(path: Path, low: int, high: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path.write_text(f"{low}\t{high}\n")
    monkeypatch.setattr(_address, "_EPHEMERAL_RANGE", str(path))


def test_ports_come_from_above_the_ephemeral_range_and_are_reserved(
    ports_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _kernel_range(tmp_path / "range", 32768, 60999, monkeypatch)
    ports = _address.free_ports(6)
    assert len(set(ports)) == 6
    assert all(61000 <= port <= 65535 for port in ports), ports
    for port in ports:  # Each one binds on every interface, as TensorFlow's server binds it.
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))
    assert sorted(int(port) for port in json.loads(ports_file.read_text())) == sorted(ports)


def test_two_pickers_never_get_the_same_port(ports_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 quiet ports: this process takes 4, another process (the same reservations file) the other 4.
    _kernel_range(tmp_path / "range", 1024, 65527, monkeypatch)
    monkeypatch.setattr(_address, "_MIN_SPAN", 8)
    quiet = set(range(65528, 65536))
    if not all(_address.port_is_free("127.0.0.1", port) for port in quiet):
        pytest.skip("a program on this machine listens on a port of 65528-65535")
    mine = _address.free_ports(4)
    code = (
        "from tfdist.cluster import address as a; "
        f"a._EPHEMERAL_RANGE = {str(tmp_path / 'range')!r}; a._MIN_SPAN = 8; print(*a.free_ports(4))"
    )
    other = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    theirs = [int(port) for port in other.stdout.split()]
    assert set(mine) | set(theirs) == quiet, (mine, theirs)
    # Every quiet port is reserved now: the next one comes from the kernel.
    assert not set(_address.free_ports(1)) & quiet


def test_reservations_expire(ports_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _kernel_range(tmp_path / "range", 1024, 65533, monkeypatch)
    monkeypatch.setattr(_address, "_MIN_SPAN", 2)
    quiet = {65534, 65535}
    if not all(_address.port_is_free("127.0.0.1", port) for port in quiet):
        pytest.skip("a program on this machine listens on port 65534 or 65535")
    stale = _address.time.time() - _address.RESERVE_SECONDS - 1
    ports_file.write_text(json.dumps({"65534": stale, "65535": _address.time.time()}))
    assert _address.free_ports(1) == [65534]  # The stale reservation is given up; the fresh one holds.
    ports_file.write_text("not json")  # A broken file is started again.
    assert set(_address.free_ports(2)) == quiet


def test_without_a_known_range_the_kernel_picks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_address, "_EPHEMERAL_RANGE", str(tmp_path / "missing"))
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = _address.free_ports(3)
    assert len(set(ports)) == 3 and all(low <= port <= high for port in ports), ports
