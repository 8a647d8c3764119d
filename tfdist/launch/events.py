"""Events a launch injects into its own run, on progress or after a time: kill, lose or return a task.

:class:`KillAt` kills a task once (a crash, to test restarts); :class:`LoseAt` takes a worker away and
:class:`ReturnAt` gives it back (elastic training). They are the ``kills``, ``loses`` and ``returns`` of a
:class:`~tfdist.launch.LaunchConfig`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from tfdist.errors import LaunchError, invalid, require_number

__all__ = ["KillAt", "LoseAt", "ReturnAt"]

_KILL = re.compile(r"^(chief|worker|ps|evaluator):(\d+)@(.*)$", re.S)
_KILL_FORMAT = "TASK:INDEX@SECONDS or TASK:INDEX@after=REGEX, e.g. 'worker:1@20' or 'worker:1@after=Epoch 3/'"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillAt:
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

    option: ClassVar[str] = "kills"  # The LaunchConfig argument that holds these, named in errors.
    task: str
    seconds: float | None = None
    after: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not re.fullmatch(r"(chief|worker|ps|evaluator):\d+", self.task):
            raise invalid(LaunchError, self.option, self.task, "a task 'type:index', e.g. 'worker:1'")
        if (self.seconds is None) == (self.after is None):
            raise invalid(LaunchError, self.option, self, "exactly one trigger: seconds or after", _KILL_FORMAT)
        if self.seconds is not None:
            require_number(LaunchError, self.option, self.seconds, minimum=0, fix="Seconds after launch, e.g. 20.")
            object.__setattr__(self, "seconds", float(self.seconds))
        if self.after is not None:
            if not isinstance(self.after, str) or not self.after:
                raise invalid(LaunchError, self.option, self.after, "a non-empty regular expression after 'after='")
            try:
                re.compile(self.after)
            except re.error as err:
                raise invalid(LaunchError, self.option, self.after, f"a valid regular expression ({err})") from None

    @classmethod
    def parse(cls, text: str) -> KillAt:
        """Parses ``TASK:INDEX@SECONDS`` or ``TASK:INDEX@after=REGEX``."""
        match = _KILL.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise invalid(LaunchError, cls.option, text, _KILL_FORMAT)
        task, trigger = f"{match.group(1)}:{match.group(2)}", match.group(3)
        if trigger.startswith("after="):
            return cls(task=task, after=trigger[len("after=") :])
        try:
            seconds = float(trigger)
        except ValueError:
            raise invalid(LaunchError, cls.option, text, _KILL_FORMAT) from None
        return cls(task=task, seconds=seconds)

    @classmethod
    def many(cls, values: Any) -> tuple[KillAt, ...]:
        """``values`` (instances or their text form) as a tuple of this class; LaunchError otherwise."""
        expected = f"a sequence of {cls.__name__} or 'TASK:INDEX@...' strings"
        if isinstance(values, str):
            raise invalid(LaunchError, cls.option, values, expected, f"Put one in a tuple: ({values!r},).")
        events = tuple(cls.parse(v) if isinstance(v, str) else v for v in as_tuple(values))
        if not all(isinstance(e, cls) for e in events):
            raise invalid(LaunchError, cls.option, values, expected, f"Build them with {cls.__name__}.parse().")
        return events

    def matches(self, task: str, line: str) -> bool:
        """True when ``line``, printed by ``task``, fires this progress trigger."""
        return self.after is not None and re.search(self.after, line) is not None

    def __str__(self) -> str:
        return f"{self.task}@after={self.after}" if self.after is not None else f"{self.task}@{self.seconds:g}"


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


def as_tuple(value: Any) -> tuple[Any, ...]:
    """``value`` as a tuple, or a tuple holding it when it is not iterable (so checks can reject it)."""
    try:
        return tuple(value)
    except TypeError:
        return (value,)
