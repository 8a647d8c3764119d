"""Simulated hosts for the local engine's ``simulate_hosts`` runs: network namespaces on a private bridge.

One private namespace (:class:`~tfdist.launch.engines._netns.Namespace`, rootless where the kernel allows)
holds the switch: a bridge, ``tfdist0``. Each host is a namespace of its own, made from inside that one, with
an ``eth0`` whose other end is a port of the bridge, and its address (``10.9.0.1/24``, ``10.9.0.2/24``,
...: :func:`tfdist.launch.network.host_address`). A link rate shapes both ends with ``tc``'s token bucket
(``tbf``): ``eth0`` what the host sends, the bridge port what it receives, so every host has a full-duplex
link of that rate, and a transfer between two hosts runs at the slower of their links. Nothing of it is
reachable from this machine's network; it is gone when the namespaces' holders end (:meth:`Hosts.close`).

Network faults act on a host's link while the run goes on: :meth:`Hosts.cut` takes its bridge port down
(every packet to and from the host is dropped; its ``eth0`` loses carrier, its connections stay open) and up
again; :meth:`Hosts.shape` gives both ends another rate, and the host's own back.

Example (not run here: it needs ``unshare``, ``ip`` and ``tc``)::

    hosts = Hosts([("10.9.0.1", "1gbit"), ("10.9.0.2", None)])
    port = hosts.at("10.9.0.2").pick(1, "10.9.0.2")[0]   # asked inside that host
    argv = hosts.at("10.9.0.1").enter(["python", "client.py", f"10.9.0.2:{port}"])
    hosts.close()
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from tfdist.errors import LaunchFailure
from tfdist.launch.engines._netns import Namespace, require_tool
from tfdist.launch.network import Link

OPTION = "simulate_hosts"
BRIDGE = "tfdist0"
PREFIX = 24
_LATENCY = "50ms"  # how long a packet may wait in the token bucket's queue: its length at the rate
_MIN_BURST = 128 * 1024  # bytes the bucket holds: at least two GSO segments...
_BURST_SECONDS = 0.004  # ...and 4 ms at the rate, so a fast link is not held back by timer resolution


def tbf(device: str, rate: str, bits_per_second: int, verb: str = "add") -> str:
    """The ``tc`` command (batch form) that shapes ``device`` to ``rate`` (``verb`` 'replace': shapes it again).

    Example:
        >>> tbf("eth0", "1gbit", 10**9)
        'qdisc add dev eth0 root tbf rate 1gbit burst 500000 latency 50ms'
    """
    burst = max(_MIN_BURST, round(bits_per_second / 8 * _BURST_SECONDS))
    return f"qdisc {verb} dev {device} root tbf rate {rate} burst {burst} latency {_LATENCY}"


def _run(namespace: Namespace, argv: Sequence[str], commands: Sequence[str]) -> None:
    """Runs ``argv`` inside ``namespace`` with ``commands`` as its batch input; LaunchFailure if it fails."""
    done = subprocess.run(
        namespace.enter(argv), input="\n".join(commands) + "\n", capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise LaunchFailure(
            f"`{OPTION}`: `{' '.join(argv)}` failed (exit {done.returncode}) with "
            f"{done.stderr.strip()[-2000:] or 'no message'} on {commands!r}.",
            field=OPTION,
            value=True,
        )


class Hosts:
    """Simulated hosts on a private bridge, open until :meth:`close`.

    Args:
      hosts: Each host's address on the bridge and its link rate (``'1gbit'``; None: unshaped), in order.
      rootless: As for :class:`~tfdist.launch.engines._netns.Namespace`.

    Raises:
      LaunchFailure: This machine cannot make the namespaces, or lacks ``ip`` or ``tc`` (or a qdisc).
    """

    def __init__(self, hosts: Sequence[tuple[str, str | None]], *, rootless: bool | None = None) -> None:
        ip, tc = require_tool("ip", OPTION), require_tool("tc", OPTION)
        self._ip, self._tc = ip, tc
        self._rates = dict(hosts)  # each host's own rate
        self._shaped = {address for address, rate in hosts if rate is not None}  # hosts with a tbf now
        self._switch = Namespace(rootless=rootless, option=OPTION)
        self._hosts: dict[str, Namespace] = {}
        try:
            for address, _ in hosts:
                self._hosts[address] = Namespace(inside=self._switch, option=OPTION)
            self._wire(ip, tc, hosts)
        except BaseException:
            self.close()
            raise

    def _wire(self, ip: str, tc: str, hosts: Sequence[tuple[str, str | None]]) -> None:
        """The bridge and its ports in the switch; each host's ``eth0``, address and shaping in the host."""
        bridge = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up"]
        shaping = []
        for index, (address, rate) in enumerate(hosts):
            port = f"h{index}"
            bridge += [
                f"link add {port} type veth peer name eth0 netns {self._hosts[address].pid}",
                f"link set {port} master {BRIDGE}",
                f"link set {port} up",
            ]
            if rate is not None:
                shaping.append(tbf(port, rate, _bits(rate)))
        _run(self._switch, [ip, "-batch", "-"], bridge)
        if shaping:
            _run(self._switch, [tc, "-batch", "-"], shaping)
        for address, rate in hosts:
            host = self._hosts[address]
            _run(host, [ip, "-batch", "-"], [f"addr add {address}/{PREFIX} dev eth0", "link set eth0 up"])
            if rate is not None:
                _run(host, [tc, "-batch", "-"], [tbf("eth0", rate, _bits(rate))])

    @property
    def addresses(self) -> list[str]:
        """The hosts' addresses, in order."""
        return list(self._hosts)

    def at(self, address: str) -> Namespace:
        """The host whose address is ``address`` (KeyError for another)."""
        return self._hosts[address]

    def _port(self, address: str) -> str:
        """The bridge port of the host at ``address`` (the other end of its ``eth0``)."""
        return f"h{list(self._hosts).index(address)}"

    def cut(self, address: str, cut: bool = True) -> None:
        """Cuts the link of the host at ``address`` (its bridge port down: nothing passes, either way), or mends
        it (``cut`` False); LaunchFailure if ``ip`` fails."""
        _run(self._switch, [self._ip, "-batch", "-"], [f"link set {self._port(address)} {'down' if cut else 'up'}"])

    def shape(self, address: str, rate: str | None) -> None:
        """Shapes both ends of the link of the host at ``address`` to ``rate``; None: to its own rate again
        (unshaped, if it had none). LaunchFailure if ``tc`` fails."""
        rate = rate or self._rates[address]
        ends = ((self._switch, self._port(address)), (self._hosts[address], "eth0"))
        if rate is None and address in self._shaped:
            for namespace, device in ends:
                _run(namespace, [self._tc, "-batch", "-"], [f"qdisc del dev {device} root"])
            self._shaped.discard(address)
        elif rate is not None:
            for namespace, device in ends:
                _run(namespace, [self._tc, "-batch", "-"], [tbf(device, rate, _bits(rate), verb="replace")])
            self._shaped.add(address)

    def close(self) -> None:
        """Ends every host's holder, then the switch's: the namespaces, bridge and links go with them."""
        for host in self._hosts.values():
            host.close()
        self._switch.close()


def _bits(rate: str) -> int:
    return Link(rate=rate).bits_per_second
