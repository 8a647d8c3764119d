"""Where the tasks listen: this machine's loopback, a private namespace, or simulated hosts with shaped links.

:class:`Network` is the option group of :class:`~tfdist.launch.LaunchConfig` for it. With
``simulate_hosts=N`` the local engine puts the tasks on N hosts, each a network namespace with an address
of its own on a private bridge (:mod:`tfdist.launch.engines._hosts`); task ``k`` (in launch order) is on
host ``k mod N``. :class:`Link` shapes the hosts' links: every host's (``'1gbit'``) or the host of one task
(``'worker:1=100mbit'``), each way, with ``tc``'s token bucket. Bandwidth is all it shapes: latency and
loss need the kernel's ``netem``, which tfdist does not use.

Example:
    >>> from tfdist.launch import Link, Network
    >>> network = Network(simulate_hosts=2, links=("1gbit", "worker:1=100mbit"))
    >>> network.links[1], network.links[1].bits_per_second
    (Link(rate='100mbit', task='worker:1'), 100000000)
    >>> [(task, host_address(index), network.rate_of(task, ["worker:0", "worker:1"])) for index, task in
    ...  enumerate(["worker:0", "worker:1"])]
    [('worker:0', '10.9.0.1', '1gbit'), ('worker:1', '10.9.0.2', '100mbit')]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from tfdist._names import describe_choices
from tfdist._options import option
from tfdist.errors import LaunchError, invalid, require_bool, require_int, require_number, require_type

__all__ = ["Link", "Network"]

MAX_HOSTS = 250  # one /24 on the private bridge
SUBNET = "10.9.0"  # the hosts' addresses: SUBNET.1, SUBNET.2, ... (only inside the private network)
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_TASK = re.compile(r"^(chief|worker|ps|evaluator):\d+$")
_MIN_RATE, _MAX_RATE = 10**4, 10**12  # 10 kbit/s to 1 tbit/s
_LINK_FORMAT = (
    "RATE or TASK=RATE, with RATE a number and bit, kbit, mbit, gbit or tbit, e.g. '1gbit' or 'worker:1=100mbit'"
)


def host_address(index: int) -> str:
    """The address of simulated host ``index`` (from 0) on the private bridge: ``10.9.0.(index + 1)``."""
    return f"{SUBNET}.{index + 1}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Link:
    """The rate of a simulated host's link, each way: every host's (``task`` None) or the host of ``task``.

    Attributes:
      rate: Bits per second with a unit, as ``tc`` writes it: ``'1gbit'``, ``'100mbit'``, ``'2.5gbit'``
        (10 kbit/s to 1 tbit/s).
      task: A task ('worker:1'): the link of the host it runs on. None: every host's.

    Example:
        >>> Link.parse("worker:1=100MBit"), str(Link(rate="1gbit"))
        (Link(rate='100mbit', task='worker:1'), '1gbit')
        >>> Link.parse("1 gigabit")
        Traceback (most recent call last):
        ...
        tfdist.errors.LaunchError: Invalid value for `links`. Received: '1 gigabit'. Expected RATE or TASK=RATE, \
with RATE a number and bit, kbit, mbit, gbit or tbit, e.g. '1gbit' or 'worker:1=100mbit'.
    """

    rate: str
    task: str | None = None

    def __post_init__(self) -> None:
        match = _RATE.match(self.rate.strip().lower()) if isinstance(self.rate, str) else None
        if match is None:
            raise invalid(LaunchError, "links", self.rate, _LINK_FORMAT)
        bits = float(match.group(1)) * _UNITS[match.group(2)]
        if not _MIN_RATE <= bits <= _MAX_RATE:
            raise invalid(LaunchError, "links", self.rate, "a rate from 10kbit to 1tbit", "E.g. '1gbit'.")
        object.__setattr__(self, "rate", self.rate.strip().lower())
        if self.task is not None and (not isinstance(self.task, str) or not _TASK.match(self.task)):
            raise invalid(LaunchError, "links", self.task, "a task 'type:index', e.g. 'worker:1', or None")

    @property
    def bits_per_second(self) -> int:
        """The rate in bits per second."""
        match = _RATE.match(self.rate)
        assert match is not None  # checked when made
        return round(float(match.group(1)) * _UNITS[match.group(2)])

    @classmethod
    def parse(cls, text: str) -> Link:
        """Parses ``RATE`` or ``TASK=RATE``."""
        if not isinstance(text, str):
            raise invalid(LaunchError, "links", text, _LINK_FORMAT)
        task, sep, rate = text.strip().rpartition("=")
        try:
            return cls(rate=rate, task=task.strip() if sep else None)
        except LaunchError:
            raise invalid(LaunchError, "links", text, _LINK_FORMAT) from None

    @classmethod
    def from_bits(cls, bits_per_second: float) -> Link:
        """The link of a measured rate: three significant digits in the largest unit it reaches.

        Example:
            >>> Link.from_bits(941_234_567).rate, Link.from_bits(1.5e10).rate, Link.from_bits(999_700).rate
            ('941mbit', '15gbit', '1mbit')
        """
        require_number(
            LaunchError,
            "bits_per_second",
            bits_per_second,
            minimum=_MIN_RATE,
            maximum=_MAX_RATE,
            fix="Links run from 10kbit to 1tbit.",
        )
        for unit, size in sorted(_UNITS.items(), key=lambda item: -item[1]):
            value = float(f"{bits_per_second / size:.3g}")
            if value >= 1:
                return cls(rate=f"{value:g}{unit}")
        raise AssertionError("unreachable: the rate is at least 10kbit")

    @classmethod
    def many(cls, values: Any) -> tuple[Link, ...]:
        """``values`` (links or their text form) as a tuple of links; LaunchError otherwise."""
        expected = "a sequence of Link or 'RATE' / 'TASK=RATE' strings"
        if isinstance(values, str):
            raise invalid(LaunchError, "links", values, expected, f"Put one in a tuple: ({values!r},).")
        try:
            items = tuple(values)
        except TypeError:
            raise invalid(LaunchError, "links", values, expected) from None
        links = tuple(cls.parse(v) if isinstance(v, str) else v for v in items)
        if not all(isinstance(link, cls) for link in links):
            raise invalid(LaunchError, "links", values, expected, "Build them with Link.parse().")
        return links

    def __str__(self) -> str:
        return self.rate if self.task is None else f"{self.task}={self.rate}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Network:
    """Where the tasks listen.

    Attributes:
      host: Address the tasks use (not with ``simulate_hosts``: the hosts have their own).
      isolate_network: Run the cluster in a private network namespace.
      simulate_hosts: Put the tasks on this many simulated hosts (network namespaces on a private bridge,
        addresses ``10.9.0.1``, ``10.9.0.2``, ...; task ``k`` in launch order on host ``k mod N``), at most
        one per task. 0: none. The launcher stays outside, as with ``isolate_network``.
      links: The hosts' link rates (:class:`Link` or text): one for every host, and any per task's host.
        Empty: unshaped.
    """

    host: str = "127.0.0.1"
    isolate_network: bool = option(False, help="run the cluster in a private network namespace with only loopback")
    simulate_hosts: int = option(
        0,
        help="put the tasks on N simulated hosts: network namespaces with their own addresses (10.9.0.1, ...) on a "
        "private bridge, task k on host k mod N",
        metavar="N",
    )
    links: tuple[Link, ...] = option(
        (),
        help="shape the simulated hosts' links, each way (tc tbf): RATE for every host (1gbit, 100mbit), "
        "TASK=RATE for the host of one task (worker:1=100mbit); bandwidth only, no latency or loss",
        flag="--link",
        metavar="[TASK=]RATE",
    )

    def __post_init__(self) -> None:
        require_type(LaunchError, "host", self.host, str, "a host name or address, e.g. '127.0.0.1'")
        require_bool(LaunchError, "isolate_network", self.isolate_network)
        require_int(LaunchError, "simulate_hosts", self.simulate_hosts, minimum=0, maximum=MAX_HOSTS)
        object.__setattr__(self, "links", Link.many(self.links))
        if self.links and not self.simulate_hosts:
            raise invalid(
                LaunchError, "links", self.links[0], "`simulate_hosts` as well", "Set `simulate_hosts` to N >= 1."
            )
        if self.simulate_hosts and self.host != "127.0.0.1":
            raise invalid(
                LaunchError,
                "host",
                self.host,
                "'127.0.0.1' with `simulate_hosts` (the simulated hosts have addresses of their own)",
                "Leave `host` unset.",
            )
        if len([link for link in self.links if link.task is None]) > 1:
            raise invalid(LaunchError, "links", self.links, "at most one RATE for every host", "Keep one.")

    def refuse_namespaces(self, expected: str, fix: str) -> None:
        """LaunchError naming ``isolate_network`` or ``simulate_hosts`` when either is set, for places that
        cannot make network namespaces; ``fix`` may name the option as ``{option}``."""
        for name in ("isolate_network", "simulate_hosts"):
            if getattr(self, name):
                raise invalid(LaunchError, name, getattr(self, name), expected, fix.format(option=name))

    def check_tasks(self, tasks: Sequence[str]) -> None:
        """LaunchError unless the hosts and links fit ``tasks`` (every task, in launch order)."""
        if self.simulate_hosts > len(tasks):
            raise invalid(
                LaunchError,
                "simulate_hosts",
                self.simulate_hosts,
                f"at most one host per task ({len(tasks)})",
                f"Use simulate_hosts={len(tasks)} for a host per task.",
            )
        for link in self.links:
            if link.task is not None and link.task not in tasks:
                raise invalid(LaunchError, "links", str(link), describe_choices(link.task, tasks))
        for task in tasks:
            self.rate_of(task, tasks)

    def host_of(self, task: str, tasks: Sequence[str]) -> int:
        """The index of the simulated host that ``task`` (one of ``tasks``, in launch order) runs on."""
        return list(tasks).index(task) % self.simulate_hosts

    def rate_of(self, task: str, tasks: Sequence[str]) -> str | None:
        """The link rate of ``task``'s host ('1gbit'), None when unshaped; LaunchError when its host's tasks
        ask for different rates."""
        host = self.host_of(task, tasks)
        every = [link.rate for link in self.links if link.task is None]
        own = {link.rate for link in self.links if link.task is not None and self.host_of(link.task, tasks) == host}
        if len(own) > 1:
            raise invalid(
                LaunchError,
                "links",
                sorted(own),
                f"one rate for host {host_address(host)} (its tasks share its link)",
                "Give its tasks the same rate, or use more `simulate_hosts`.",
            )
        return next(iter(own), every[0] if every else None)

    def hosts(self, tasks: Sequence[str]) -> list[tuple[str, str | None]]:
        """Every simulated host's (address, link rate or None), in order."""
        first = {self.host_of(task, tasks): task for task in reversed(tasks)}
        return [(host_address(i), self.rate_of(first[i], tasks)) for i in range(self.simulate_hosts)]


def describe_hosts(network: Network, tasks: Sequence[str]) -> str:
    """One line on the simulated hosts: each one's address, tasks and link.

    Example:
        >>> describe_hosts(Network(simulate_hosts=2, links=("1gbit",)), ["chief:0", "worker:0", "worker:1"])
        'simulated hosts on a private bridge, unreachable from outside: 10.9.0.1 (chief:0, worker:1; 1gbit), \
10.9.0.2 (worker:0; 1gbit)'
    """
    hosts = []
    for index, (address, rate) in enumerate(network.hosts(tasks)):
        on = [task for task in tasks if network.host_of(task, tasks) == index]
        hosts.append(f"{address} ({', '.join(on)}; {rate or 'unshaped'})")
    return "simulated hosts on a private bridge, unreachable from outside: " + ", ".join(hosts)
