"""How fast a link carries bytes from one task to another: a short TCP transfer between two tasks.

A :class:`LinkServer` listens on a task's port and counts what a peer sends it; :func:`measure_link` sends to
one for two seconds and returns the rate the peer received at, in bits per second (``tfdist doctor --probe
SECONDS --measure-link`` runs both in every task, each measuring its link to the next task). The rate
includes what TCP and the path cost, as a training job's transfers see it; it is measured while the other
direction may carry the peer's own measurement (full duplex, as a ring all-reduce uses the link).

The rate is the second half of the transfer's: a new connection starts slowly (TCP's slow start takes
several round trips, and a shaped link's queue, full of the other direction's data, lengthens each), while
a training job's connections stay open for the whole run. Over a whole second, a 100 Mbit/s token bucket
measured 75 Mbit/s when the two directions started apart.

Example:
    >>> with LinkServer(0, host="127.0.0.1") as server:
    ...     rate = measure_link(f"127.0.0.1:{server.port}", seconds=0.05, timeout=5)
    ...     served = server.wait(5)
    >>> rate > 1e6, served
    (True, True)
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from types import TracebackType

from tfdist.cluster.address import split_address
from tfdist.cluster.spec import ClusterSpec, Task
from tfdist.errors import ClusterSpecError, require_number

MEASURE_SECONDS = 2.0  # how long measure_link sends by default
_BLOCK = bytes(1 << 16)
_ANSWER = struct.Struct("!Qd")  # the server's answer, network order: bytes received, their steady rate (bit/s)
_POLL = 0.1


class LinkServer:
    """Counts the bytes each connection sends until it ends, and answers with the count, until closed.

    Args:
      port: The port to listen on (0: any free one, see :attr:`port`).
      host: The address to listen on; '' every address of this host.

    Raises:
      OSError: The port cannot be bound (another process listens there, e.g. the task's own server).
    """

    def __init__(self, port: int, *, host: str = "") -> None:
        if not host and socket.has_dualstack_ipv6():  # Every address: IPv6 ones too.
            self._socket = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._socket = socket.create_server((host, port))
        self._socket.settimeout(_POLL)
        self._closed = threading.Event()
        self._measured = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tfdist-link-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._socket.getsockname()[1])

    def wait(self, timeout: float) -> bool:
        """Waits until a peer has measured its link to this server (sent bytes); False after ``timeout``."""
        return self._measured.wait(timeout)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._socket.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                try:
                    got, rate = _drain(conn)
                    conn.sendall(_ANSWER.pack(got, rate))
                except OSError:  # The peer went away (a reachability probe connects and closes at once).
                    continue
            if got:
                self._measured.set()

    def close(self) -> None:
        """Stops listening."""
        self._closed.set()
        self._thread.join()
        self._socket.close()

    def __enter__(self) -> LinkServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _drain(conn: socket.socket) -> tuple[int, float]:
    """Reads until the peer ends its side; returns the bytes read and the rate of the second half of the
    time they took, bits per second (0.0 when they came too fast to time)."""
    conn.settimeout(30.0)
    buffer = bytearray(1 << 20)
    arrivals = [(time.perf_counter(), 0)]  # (when, bytes so far), one per read
    while True:
        n = conn.recv_into(buffer)
        if not n:
            return arrivals[-1][1], _second_half_rate(arrivals)
        arrivals.append((time.perf_counter(), arrivals[-1][1] + n))


def _second_half_rate(arrivals: list[tuple[float, int]]) -> float:
    """Bits per second from the first read in the second half of the time to the last read.

    Example:
        >>> _second_half_rate([(0.0, 0), (1.0, 10), (2.0, 110), (3.0, 210)])  # slow at first, then 100 B/s
        800.0
    """
    end, total = arrivals[-1]
    half = arrivals[0][0] + (end - arrivals[0][0]) / 2
    start, before = next((when, got) for when, got in arrivals if when >= half)
    return (total - before) * 8 / (end - start) if end > start else 0.0


def measure_link(address: str, *, seconds: float = MEASURE_SECONDS, timeout: float = 10.0) -> float:
    """Sends to the :class:`LinkServer` at ``address`` for ``seconds``; returns the bits per second it received.

    The rate is what the server received in the second half of the transfer (the first half is TCP's start);
    the transfer runs until the server has every byte, so what the buffers still held when sending stopped
    counts as well. A transfer too short for the server to time is rated from the first byte sent to the
    server's answer.

    Args:
      address: ``host:port`` of a task running a :class:`LinkServer`.
      seconds: How long to send.
      timeout: Seconds to keep trying to connect (the peer may start later) and to wait for its answer.

    Raises:
      OSError: No connection within ``timeout``, or the peer ended it before answering.
    """
    require_number(ClusterSpecError, "seconds", seconds, above=0, maximum=3600)
    require_number(ClusterSpecError, "timeout", timeout, above=0, maximum=3600)
    host, port = split_address(address)
    with _connect(host, port, timeout) as sock:
        sock.settimeout(timeout + seconds)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            sock.sendall(_BLOCK)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < _ANSWER.size:
            chunk = sock.recv(_ANSWER.size - len(answer))
            if not chunk:
                raise ConnectionError(f"{address} ended the connection before answering")
            answer += chunk
        elapsed = time.perf_counter() - start
    got, rate = _ANSWER.unpack(answer)
    return rate or got * 8 / elapsed


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    """A connection to ``host:port``, retried until ``timeout`` while it is refused or unanswered."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except OSError:
            if time.monotonic() + _POLL >= deadline:
                raise
            time.sleep(_POLL)


def link_peer(spec: ClusterSpec) -> Task | None:
    """The task whose link the current task measures: the next in the cluster's order (the evaluator left out,
    the last task's next the first), as in a ring; None without a current task or another one.

    Example:
        >>> spec = ClusterSpec.local(workers=3, chief=True)
        >>> [link_peer(spec.with_task(t.type, t.index)).name for t in spec.tasks()]
        ['worker:0', 'worker:1', 'worker:2', 'chief:0']
    """
    ring = [t for t in spec.tasks() if t.type != "evaluator"]
    names = [t.name for t in ring]
    me = spec.task.name if spec.task is not None else None
    if me not in names or len(ring) < 2:
        return None
    return ring[(names.index(me) + 1) % len(ring)]
