"""Task addresses: validation of ``host:port`` and picking free local ports."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import random
import re
import socket
import tempfile
import time
from collections.abc import Iterator

from tfdist.errors import ClusterSpecError, LaunchError, LaunchFailure, invalid

__all__ = ["free_ports"]

_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?)"
_ADDRESS = re.compile(rf"^(?P<host>{_HOST}):(?P<port>[0-9]{{1,5}})$")
_SCHEME = re.compile(r"^[a-z+]+://")
_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")  # RFC 1123, plus '_' (Docker names).
_MAX_HOST = 253  # A DNS name's longest text form.
_DOTTED_QUAD = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")


def _host_problem(host: str) -> str | None:
    """Why ``host`` (the part before ':port', brackets kept) cannot name a machine, or None."""
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "an IPv6 address inside the brackets"
        return None
    if _DOTTED_QUAD.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "an IPv4 address of four numbers 0-255 without leading zeros"
        return None
    if len(host) > _MAX_HOST:
        return f"a host name of at most {_MAX_HOST} characters"
    if not all(_LABEL.match(label) for label in host.split(".")):
        return "a host name of dot-separated labels of 1-63 letters, digits, '-' or '_'"
    return None


def check_address(field: str, value: object) -> str:
    """Returns ``value`` when it is a valid ``host:port``; raises ClusterSpecError."""
    if not isinstance(value, str):
        raise invalid(
            ClusterSpecError,
            field,
            value,
            "a 'host:port' string",
            "Write each task address as a string such as 'worker-0.svc:2222'.",
        )
    if _SCHEME.match(value):
        raise invalid(
            ClusterSpecError,
            field,
            value,
            "a bare 'host:port' without a scheme",
            f"Drop the '{value.split('://')[0]}://' prefix; the protocol goes in the top-level 'rpc_layer' field.",
        )
    match = _ADDRESS.match(value)
    if match is None:
        raise invalid(
            ClusterSpecError,
            field,
            value,
            "'host:port' (IPv6 hosts in brackets, e.g. '[::1]:2222')",
            "Add the port after a colon, e.g. 'localhost:2222'.",
        )
    port_text = match.group("port")
    if not 1 <= int(port_text) <= 65535 or port_text.startswith("0"):
        raise invalid(
            ClusterSpecError,
            field,
            value,
            "a port in 1..65535 written without leading zeros",
            "Pick a port in 1..65535 (0 means 'any' and cannot be dialled).",
        )
    problem = _host_problem(match.group("host"))
    if problem:
        raise invalid(ClusterSpecError, field, value, problem, "Write the host as DNS or `hostname -f` names it.")
    return value


def same_endpoint_key(address: str) -> str:
    """``address`` as one machine sees it: host names are case-insensitive.

    Example:
        >>> same_endpoint_key("Worker-0.Example.COM:2222")
        'worker-0.example.com:2222'
    """
    return address.lower()


def is_loopback(host: str) -> bool:
    """True for names of this machine's loopback interface ('localhost', 127.x.x.x, ::1)."""
    host = host.strip("[]").lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_address(address: str) -> tuple[str, int]:
    """Splits a valid ``host:port`` into ``(host, port)``, unbracketing IPv6."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    """Joins ``host`` and ``port``, bracketing IPv6 hosts."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


RESERVE_SECONDS = 120.0  # How long another picker on this machine leaves a picked port alone.
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_MIN_SPAN = 1024  # Fewer ports above the ephemeral range than this: the kernel picks.
_TRIES = 64  # Random ports tried per port picked.


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``count`` distinct ports that were free on ``host`` a moment ago.

    A task binds its port seconds after the launcher picked it (TensorFlow starts first), and any listener
    that binds port 0 meanwhile may be given the same one by the kernel. So on Linux the ports come from above
    the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), where no port-0 bind and no
    outgoing connection lands, and each pick is reserved for :data:`RESERVE_SECONDS` in a file that every
    picker on this machine reads under a lock (``tfdist-ports-UID`` in the temporary directory): two
    launchers never pick the same port. Where that range is too small, the kernel picks. Another program
    may still take a port first: the launcher checks again (see :func:`port_is_free`) just before starting
    any task.

    Example:
        >>> from tfdist.cluster import free_ports
        >>> first, second = free_ports(2)
        >>> first != second
        True
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    span = _quiet_span()
    if span is None:
        return _kernel_ports(count, host, family)
    _kernel_ports(1, host, family)  # Raises when ``host`` is not this machine's.
    picker = random.Random()
    with _reservations() as reserved:
        ports: list[int] = []
        for _ in range(count):
            for _ in range(_TRIES):
                port = picker.choice(span)
                if port not in reserved and port_is_free(host, port):  # Every pick is reserved at once.
                    break
            else:  # The range is full of reservations and listeners: let the kernel pick.
                port = _kernel_ports(1, host, family)[0]
            ports.append(port)
            reserved[port] = time.time()
        return ports


def _quiet_span() -> range | None:
    """The ports above the kernel's ephemeral range (None: unknown, or fewer than :data:`_MIN_SPAN`)."""
    try:
        with open(_EPHEMERAL_RANGE, encoding="ascii") as ranges:
            _, high = (int(part) for part in ranges.read().split())
    except (OSError, ValueError):
        return None
    span = range(max(high + 1, 1024), 65536)
    return span if len(span) >= _MIN_SPAN else None


@contextlib.contextmanager
def _reservations() -> Iterator[dict[int, float]]:
    """This machine's reserved ports (port -> when), under an exclusive lock; written back at the end.
    Without a lockable file (another OS, a read-only temporary directory) the reservations are this call's."""
    path = os.path.join(tempfile.gettempdir(), f"tfdist-ports-{os.getuid()}")
    try:
        import fcntl

        ledger = open(path, "a+", encoding="ascii")
    except (ImportError, OSError):
        yield {}
        return
    with ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)
        ledger.seek(0)
        try:
            kept = {int(port): float(when) for port, when in json.loads(ledger.read() or "{}").items()}
        except (ValueError, AttributeError):  # A broken file: start again.
            kept = {}
        now = time.time()
        reserved = {port: when for port, when in kept.items() if now - when < RESERVE_SECONDS}
        yield reserved
        ledger.seek(0)
        ledger.truncate()
        ledger.write(json.dumps({str(port): when for port, when in reserved.items()}))


def _kernel_ports(count: int, host: str, family: socket.AddressFamily) -> list[int]:
    """``count`` distinct ports the kernel picks on ``host`` (binds to port 0); bad hosts raise."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            try:
                sock = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
                sock.bind((host, 0))
            except (socket.gaierror, UnicodeError) as err:  # A name that resolves to nothing: the input is wrong.
                raise invalid(
                    LaunchError,
                    "host",
                    host,
                    f"an address of this machine ({err})",
                    "Use 127.0.0.1 for a local cluster.",
                ) from err
            except OSError as err:
                if err.errno == errno.EADDRNOTAVAIL:  # A real address, but not one of this machine's.
                    raise invalid(
                        LaunchError, "host", host, "an address of this machine", "Use 127.0.0.1 for a local cluster."
                    ) from err
                raise LaunchFailure(
                    f"Cannot pick a free port on {host!r}: {err}. Check that ports and file descriptors are left.",
                    field="host",
                    value=host,
                ) from err
            ports.append(sock.getsockname()[1])
        return ports


def port_is_free(host: str, port: int) -> bool:
    """True when ``port`` can be bound on every interface right now.

    TensorFlow's gRPC server binds ``*:port`` whatever host the cluster names,
    so a port counts as free only when the wildcard bind succeeds.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            return False
    return True
