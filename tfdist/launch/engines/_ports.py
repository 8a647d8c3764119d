"""Port questions (free ports, whether a host is this machine) asked in the network the tasks run in.

The local engine asks :data:`HOST` (this process's network) or, with ``isolate_network``, the holder of its
private namespace (:mod:`tfdist.launch.engines._netns`), which answers with this same code from inside.

Example:
    >>> first, second = HOST.pick(2, "127.0.0.1")
    >>> first != second, HOST.is_free("127.0.0.1", first), HOST.is_local("remote-node.invalid")
    (True, True, False)
    >>> readdress("remote-node.invalid:2222", HOST)  # another machine's address is kept as it is
    'remote-node.invalid:2222'
"""

from __future__ import annotations

import logging
import socket
from typing import Protocol

from tfdist.cluster import address as _address
from tfdist.errors import LaunchError, LaunchFailure

_log = logging.getLogger("tfdist.launch")


class Ports(Protocol):
    """Ports of one network (this machine's, or a private namespace's)."""

    def pick(self, count: int, host: str) -> list[int]:
        """``count`` distinct ports that were free on ``host`` a moment ago; LaunchError for a host that is
        not one of this network's, LaunchFailure when none can be picked."""

    def is_free(self, host: str, port: int) -> bool:
        """Whether ``port`` can be bound on every interface right now (``host`` picks IPv4 or IPv6)."""

    def is_local(self, host: str) -> bool:
        """Whether ``host`` names this network's machine (loopback, or an address a socket can bind)."""


class HostPorts:
    """The ports of the network this process is in."""

    def pick(self, count: int, host: str) -> list[int]:
        return _address.free_ports(count, host)

    def is_free(self, host: str, port: int) -> bool:
        return _address.port_is_free(host, port)

    def is_local(self, host: str) -> bool:
        if _address.is_loopback(host):
            return True
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
        except (OSError, UnicodeError):  # another machine, or a name this machine cannot resolve
            return False
        return True


HOST = HostPorts()


def readdress(address: str, ports: Ports) -> str:
    """Where a task placed at ``address`` starts again: there while its port can be bound; else on a new free
    port of the same host. Another machine's address is kept unchecked, and so is ``address`` when no port
    can be picked (logged: never a bad-input error in the middle of a run)."""
    host, port = _address.split_address(address)
    if not ports.is_local(host) or ports.is_free(host, port):
        return address
    try:
        return _address.join_address(host, ports.pick(1, host)[0])
    except (LaunchError, LaunchFailure) as err:
        _log.warning("Could not pick a new port on %s (%s); keeping %s.", host, err, address)
        return address
