"""Task addresses: validation of ``host:port`` and picking free local ports."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import re
import socket

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


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns ``count`` distinct ports that were free on ``host`` a moment ago.

    All sockets stay open until every port is picked, so the ports differ.
    Another process may still take one before it is used: the launcher checks
    again (see :func:`port_is_free`) just before starting any task.

    Example:
        >>> from tfdist.cluster import free_ports
        >>> first, second = free_ports(2)
        >>> first != second
        True
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
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
