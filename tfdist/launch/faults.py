"""Fault injection, the option group of :class:`~tfdist.launch.LaunchConfig`: kills, stragglers, cut and slow links.

Each option holds events of :mod:`tfdist.launch.events`, given as values or in their text form (as the
``tfdist-launch`` flags take them). The supervisor applies them (:mod:`tfdist.launch.supervisor._faults`,
:mod:`tfdist.launch.supervisor._impair`); faults that act on a link need simulated hosts.

Example:
    >>> faults = Faults(kills=("worker:1@after=Epoch 3/",), stragglers=("worker:1=0.25",),
    ...                 partitions=("worker:0@after=^STEP 5$,for=20",))
    >>> [str(event) for event in faults.events()]
    ['worker:1@after=Epoch 3/', 'worker:1=0.25', 'worker:0@after=^STEP 5$,for=20']
    >>> faults.check(["worker:0", "worker:1"], simulate_hosts=0)
    Traceback (most recent call last):
    ...
    tfdist.errors.LaunchError: Invalid value for `partitions`. Received: 'worker:0@after=^STEP 5$,for=20'. Expected \
`simulate_hosts` as well (a link to cut is a simulated host's). Set `simulate_hosts` to N >= 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfdist._names import describe_choices
from tfdist._options import option
from tfdist.errors import LaunchError, invalid
from tfdist.launch.events import FaultEvent, KillAt, PartitionAt, SlowLink, Straggler

__all__ = ["Faults"]

_NEED_HOSTS = {
    "partitions": "a link to cut is a simulated host's",
    "slow_links": "a link to slow is a simulated host's",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Faults:
    """Fault injection for tests of recovery.

    Attributes:
      kills: :class:`KillAt` values or their text form, e.g.
        ``("worker:1@after=Epoch 3/",)``.
      stragglers: :class:`Straggler` values or text ('worker:1=0.25'): the task runs that fraction of the time.
      partitions: :class:`PartitionAt` values or text ('worker:1@after=REGEX,for=20'): its host's link is cut
        (needs ``simulate_hosts``).
      slow_links: :class:`SlowLink` values or text ('worker:1=10mbit@after=REGEX'): its host's link is slowed
        (needs ``simulate_hosts``).
    """

    kills: tuple[KillAt, ...] = option(
        (),
        help="SIGKILL a task once (fault injection): worker:1@after='Epoch 3/' when any task prints a line "
        "matching the regex, or worker:1@20 after 20 s",
        flag="--kill",
        metavar="TASK@TRIGGER",
    )
    stragglers: tuple[Straggler, ...] = option(
        (),
        help="make a task a straggler: worker:1=0.25 runs it a quarter of the time (SIGSTOP/SIGCONT every 0.1 s), "
        "from the start or @TRIGGER as for `kills`, for a while with ,for=SECONDS or ,until=REGEX",
        flag="--straggler",
        metavar="TASK=FRACTION[@TRIGGER][,for=S]",
    )
    partitions: tuple[PartitionAt, ...] = option(
        (),
        help="cut the link of a task's simulated host, both ways: worker:1@after=REGEX (TRIGGER as for `kills`), "
        "back after ,for=SECONDS or when a line matches ,until=REGEX (needs `simulate_hosts`)",
        flag="--partition",
        metavar="TASK@TRIGGER[,for=S]",
    )
    slow_links: tuple[SlowLink, ...] = option(
        (),
        help="slow the link of a task's simulated host: worker:1=100mbit from the start, or @TRIGGER as for "
        "`kills`, for a while with ,for=SECONDS or ,until=REGEX (needs `simulate_hosts`)",
        flag="--slow-link",
        metavar="TASK=RATE[@TRIGGER][,for=S]",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "kills", KillAt.many(self.kills))
        object.__setattr__(self, "stragglers", Straggler.many(self.stragglers))
        object.__setattr__(self, "partitions", PartitionAt.many(self.partitions))
        object.__setattr__(self, "slow_links", SlowLink.many(self.slow_links))

    def events(self) -> tuple[FaultEvent, ...]:
        """Every event of the group, kills first."""
        return self.kills + self.stragglers + self.partitions + self.slow_links

    def check(self, tasks: Sequence[str], *, simulate_hosts: int) -> None:
        """LaunchError unless every event's task is one of ``tasks`` and the link faults have simulated hosts."""
        for event in self.events():
            if event.task not in tasks:
                raise invalid(LaunchError, event.option, event.task, describe_choices(event.task, tasks))
            if event.option in _NEED_HOSTS and not simulate_hosts:
                raise invalid(
                    LaunchError,
                    event.option,
                    str(event),
                    f"`simulate_hosts` as well ({_NEED_HOSTS[event.option]})",
                    "Set `simulate_hosts` to N >= 1.",
                )
