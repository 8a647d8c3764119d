"""Events a launch injects into its own run, on progress or after a time: faults of a task, its link or its host.

:class:`KillAt` kills a task once (a crash, to test restarts); :class:`LoseAt` takes a worker away and
:class:`ReturnAt` gives it back (elastic training). They are the ``kills``, ``loses`` and ``returns`` of a
:class:`~tfdist.launch.LaunchConfig`.

Three faults last a while instead (``,for=SECONDS`` or ``,until=REGEX``; without either, to the end of the
run): :class:`PartitionAt` cuts the link of a task's simulated host, :class:`SlowLink` slows it, and
:class:`Straggler` lets a task run only a fraction of the time. They are the ``partitions``, ``slow_links``
and ``stragglers`` of a :class:`~tfdist.launch.LaunchConfig` (:mod:`tfdist.launch.faults`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from tfdist.errors import LaunchError, invalid, require_number
from tfdist.launch.network import Link

__all__ = ["KillAt", "LoseAt", "PartitionAt", "ReturnAt", "SlowLink", "Straggler"]

_TASK = r"(?:chief|worker|ps|evaluator):\d+"
_KILL = re.compile(rf"^({_TASK})@(.*)$", re.S)
_VALUED = re.compile(rf"^({_TASK})=([^@]*)(?:@(.*))?$", re.S)  # TASK=VALUE[@TRIGGER]
_WINDOW = re.compile(r"^(.*?)(?:,(for|until)=(.*))?$", re.S)  # split at the first ',for=' or ',until='
_KILL_FORMAT = "TASK:INDEX@SECONDS or TASK:INDEX@after=REGEX, e.g. 'worker:1@20' or 'worker:1@after=Epoch 3/'"
_LASTS = "[,for=SECONDS | ,until=REGEX]"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultEvent:
    """What every injected event has: the task it acts on and its trigger (see :class:`KillAt`).

    A subclass names the :class:`LaunchConfig` argument that holds it (``option``, named in errors) and its
    text form (``form``); ``needs_trigger`` False lets it start with the run when no trigger is given.
    """

    option: ClassVar[str] = "kills"
    form: ClassVar[str] = _KILL_FORMAT
    needs_trigger: ClassVar[bool] = True
    task: str
    seconds: float | None = None
    after: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not re.fullmatch(_TASK, self.task):
            raise invalid(LaunchError, self.option, self.task, "a task 'type:index', e.g. 'worker:1'")
        if self.seconds is None and self.after is None and not self.needs_trigger:
            object.__setattr__(self, "seconds", 0.0)  # from the start of the run
        if (self.seconds is None) == (self.after is None):
            raise invalid(LaunchError, self.option, self, "exactly one trigger: seconds or after", self.form)
        if self.seconds is not None:
            require_number(LaunchError, self.option, self.seconds, minimum=0, fix="Seconds after launch, e.g. 20.")
            object.__setattr__(self, "seconds", float(self.seconds))
        if self.after is not None:
            _check_regex(self.option, self.after, "after")

    @classmethod
    def parse(cls, text: str) -> Any:
        """Parses the text form of this class (``form``); LaunchError naming ``option`` otherwise."""
        raise NotImplementedError

    @classmethod
    def many(cls, values: Any) -> tuple[Any, ...]:
        """``values`` (instances or their text form) as a tuple of this class; LaunchError otherwise."""
        expected = f"a sequence of {cls.__name__} or their text form ({cls.form})"
        if isinstance(values, str):
            raise invalid(LaunchError, cls.option, values, expected, f"Put one in a tuple: ({values!r},).")
        events = tuple(cls.parse(v) if isinstance(v, str) else v for v in as_tuple(values))
        if not all(isinstance(e, cls) for e in events):
            raise invalid(LaunchError, cls.option, values, expected, f"Build them with {cls.__name__}.parse().")
        return events

    def matches(self, task: str, line: str) -> bool:
        """True when ``line``, printed by ``task``, fires this progress trigger."""
        return self.after is not None and re.search(self.after, line) is not None

    def _trigger(self) -> str:
        return f"after={self.after}" if self.after is not None else f"{self.seconds:g}"

    @classmethod
    def _fields(cls, text: Any, pattern: re.Pattern[str]) -> tuple[str, ...]:
        """The groups of ``pattern`` in ``text``; LaunchError in this class's words when it does not match."""
        match = pattern.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise invalid(LaunchError, cls.option, text, cls.form)
        return match.groups()

    @classmethod
    def _trigger_of(cls, text: str, trigger: str | None) -> dict[str, Any]:
        """``seconds`` or ``after`` from a trigger's text (``SECONDS`` or ``after=REGEX``); none when absent."""
        if trigger is None:
            return {}
        if trigger.startswith("after="):
            return {"after": trigger[len("after=") :]}
        try:
            return {"seconds": float(trigger)}
        except ValueError:
            raise invalid(LaunchError, cls.option, text, cls.form) from None


def _check_regex(option: str, value: Any, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise invalid(LaunchError, option, value, f"a non-empty regular expression after '{name}='")
    try:
        re.compile(value)
    except re.error as err:
        raise invalid(LaunchError, option, value, f"a valid regular expression ({err})") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillAt(FaultEvent):
    """Fault injection: SIGKILL ``task`` (e.g. 'worker:1') once, on progress or after a time.

    Give exactly one trigger. ``after`` (a regular expression) fires the first
    time any task prints a matching line, so the fault lands at the same point
    of the work however fast the machine is; ``seconds`` fires that long after
    launch. Errors name the :class:`LaunchConfig` argument that holds these
    (``option``: ``kills``, ``loses``, ``returns``).

    Example:
        >>> KillAt.parse("worker:1@20")
        KillAt(task='worker:1', seconds=20.0, after=None)
        >>> KillAt.parse("ps:0@after=Epoch 3/").after
        'Epoch 3/'
        >>> KillAt(task="worker:1", after="epoch 2 saved").matches("worker:0", "epoch 2 saved")
        True
    """

    @classmethod
    def parse(cls, text: str) -> KillAt:
        """Parses ``TASK:INDEX@SECONDS`` or ``TASK:INDEX@after=REGEX``."""
        task, trigger = cls._fields(text, _KILL)
        return cls(task=task, **cls._trigger_of(text, trigger))

    def __str__(self) -> str:
        return f"{self.task}@{self._trigger()}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoseAt(KillAt):
    """Elastic fault injection: SIGKILL a worker and keep it away (a machine that leaves).

    Same triggers as :class:`KillAt`.

    Example:
        >>> LoseAt.parse("worker:2@after=epoch 2 end")
        LoseAt(task='worker:2', seconds=None, after='epoch 2 end')
    """

    option: ClassVar[str] = "loses"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReturnAt(KillAt):
    """Elastic fault injection: a lost worker is available again (the machine came back).

    Same triggers as :class:`KillAt`; the group grows at the next epoch boundary.

    Example:
        >>> str(ReturnAt.parse("worker:2@after=epoch 4 end"))
        'worker:2@after=epoch 4 end'
    """

    option: ClassVar[str] = "returns"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LastingFault(FaultEvent):
    """A fault that starts on its trigger and lasts ``for_seconds``, or until a line matches ``until``, or
    (neither) to the end of the run. Its text form ends with ``,for=SECONDS`` or ``,until=REGEX``: the text
    is split at the first of them, so a trigger's own regular expression cannot hold either."""

    for_seconds: float | None = None
    until: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.for_seconds is not None and self.until is not None:
            raise invalid(LaunchError, self.option, self, "at most one end: for_seconds or until", self.form)
        if self.for_seconds is not None:
            require_number(LaunchError, self.option, self.for_seconds, above=0, fix="Seconds the fault lasts, e.g. 20.")
            object.__setattr__(self, "for_seconds", float(self.for_seconds))
        if self.until is not None:
            _check_regex(self.option, self.until, "until")

    @classmethod
    def _window_of(cls, text: Any) -> tuple[str, dict[str, Any]]:
        """The text before its window, and the window's ``for_seconds`` or ``until``."""
        head, end, value = cls._fields(text, _WINDOW)
        if end == "until":
            return head, {"until": value}
        if end == "for":
            try:
                return head, {"for_seconds": float(value)}
            except ValueError:
                raise invalid(LaunchError, cls.option, text, cls.form) from None
        return head, {}

    def _window(self) -> str:
        if self.for_seconds is not None:
            return f",for={self.for_seconds:g}"
        return f",until={self.until}" if self.until is not None else ""

    def lasts(self) -> str:
        """How long it lasts, in words: 'for 20 s', 'until a line matches /.../', 'to the end of the run'."""
        if self.for_seconds is not None:
            return f"for {self.for_seconds:g} s"
        return f"until a line matches /{self.until}/" if self.until is not None else "to the end of the run"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PartitionAt(LastingFault):
    """Network fault: cut the link of ``task``'s simulated host, both ways, on its trigger, for a while.

    Every packet to and from that host is dropped (its port on the private bridge goes down): connections
    stay open and retransmit, as when a cable is pulled; every task on that host is cut off with it. The
    link comes back after ``for_seconds``, when a line matches ``until``, or never (neither). Needs
    ``simulate_hosts``. Give exactly one trigger, as for :class:`KillAt`.

    Example:
        >>> PartitionAt.parse("worker:1@after=Epoch 3/,for=20")
        PartitionAt(task='worker:1', seconds=None, after='Epoch 3/', for_seconds=20.0, until=None)
        >>> str(PartitionAt(task="worker:1", seconds=5, until="^BEGIN 3")), PartitionAt.parse("worker:1@9").lasts()
        ('worker:1@5,until=^BEGIN 3', 'to the end of the run')
    """

    option: ClassVar[str] = "partitions"
    form: ClassVar[str] = (
        f"TASK:INDEX@TRIGGER{_LASTS}, TRIGGER SECONDS or after=REGEX, e.g. 'worker:1@after=Epoch 3/,for=20'"
    )

    @classmethod
    def parse(cls, text: str) -> PartitionAt:
        """Parses ``TASK:INDEX@TRIGGER[,for=SECONDS | ,until=REGEX]``."""
        head, window = cls._window_of(text)
        task, trigger = cls._fields(head, _KILL)
        return cls(task=task, **cls._trigger_of(text, trigger), **window)

    def __str__(self) -> str:
        return f"{self.task}@{self._trigger()}{self._window()}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlowLink(LastingFault):
    """Network fault: the link of ``task``'s simulated host runs at ``rate``, each way, for a while.

    From the start of the run without a trigger (as ``links`` would shape it), else from its trigger; then
    the host's own rate (its ``links`` one, or unshaped) comes back after ``for_seconds``, when a line
    matches ``until``, or never. Bandwidth only, as ``links`` (``tc``'s token bucket). Needs
    ``simulate_hosts``.

    Example:
        >>> SlowLink.parse("worker:1=100mbit")
        SlowLink(task='worker:1', seconds=0.0, after=None, for_seconds=None, until=None, rate='100mbit')
        >>> str(SlowLink.parse("worker:1=10MBit@after=^EPOCH 2,for=30"))
        'worker:1=10mbit@after=^EPOCH 2,for=30'
    """

    option: ClassVar[str] = "slow_links"
    form: ClassVar[str] = (
        f"TASK:INDEX=RATE[@TRIGGER]{_LASTS}, RATE as for `links`, e.g. 'worker:1=100mbit' or "
        "'worker:1=10mbit@after=Epoch 3/,for=20'"
    )
    needs_trigger: ClassVar[bool] = False
    rate: str

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            object.__setattr__(self, "rate", Link(rate=self.rate).rate)
        except LaunchError as err:
            raise invalid(LaunchError, self.option, self.rate, err.expected or "a rate", err.fix or "") from None

    @classmethod
    def parse(cls, text: str) -> SlowLink:
        """Parses ``TASK:INDEX=RATE[@TRIGGER][,for=SECONDS | ,until=REGEX]``."""
        head, window = cls._window_of(text)
        task, rate, trigger = cls._fields(head, _VALUED)
        return cls(task=task, rate=rate.strip(), **cls._trigger_of(text, trigger), **window)

    def __str__(self) -> str:
        trigger = "" if self.seconds == 0 else f"@{self._trigger()}"
        return f"{self.task}={self.rate}{trigger}{self._window()}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Straggler(LastingFault):
    """Fault: ``task`` runs ``fraction`` of the time (of a core, for one thread), for a while.

    The supervisor stops and continues the task's process group (SIGSTOP, SIGCONT) in periods of 0.1 s:
    running ``fraction`` of each, with all its threads. Rootless and on any local run; from the start of
    the run without a trigger, else from its trigger, until ``for_seconds``, ``until`` or the end.

    Example:
        >>> Straggler.parse("worker:1=0.25")
        Straggler(task='worker:1', seconds=0.0, after=None, for_seconds=None, until=None, fraction=0.25)
        >>> str(Straggler.parse("worker:1=0.5@30,until=^EPOCH 3"))
        'worker:1=0.5@30,until=^EPOCH 3'
    """

    option: ClassVar[str] = "stragglers"
    form: ClassVar[str] = f"TASK:INDEX=FRACTION[@TRIGGER]{_LASTS}, FRACTION from 0.01 to 0.99, e.g. 'worker:1=0.25'"
    needs_trigger: ClassVar[bool] = False
    fraction: float

    def __post_init__(self) -> None:
        super().__post_init__()
        require_number(
            LaunchError, self.option, self.fraction, minimum=0.01, maximum=0.99, fix="E.g. 0.25: a quarter of the time."
        )
        object.__setattr__(self, "fraction", float(self.fraction))

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """Parses ``TASK:INDEX=FRACTION[@TRIGGER][,for=SECONDS | ,until=REGEX]``."""
        head, window = cls._window_of(text)
        task, fraction, trigger = cls._fields(head, _VALUED)
        try:
            value = float(fraction)
        except ValueError:
            raise invalid(LaunchError, cls.option, text, cls.form) from None
        return cls(task=task, fraction=value, **cls._trigger_of(text, trigger), **window)

    def __str__(self) -> str:
        trigger = "" if self.seconds == 0 else f"@{self._trigger()}"
        return f"{self.task}={self.fraction:g}{trigger}{self._window()}"


def as_tuple(value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple, or a tuple holding it when it is not iterable (so checks can reject it)."""
    try:
        return tuple(value)
    except TypeError:
        return (value,)
