"""What a launch returns: how the run ended (an :class:`Outcome`), each task's end, and their JSON form.

Example:
    >>> from tfdist import ClusterSpec
    >>> from tfdist.launch import LaunchResult, Outcome, TaskResult
    >>> done = TaskResult(task="worker:0", exit_code=0, restarts=0, runs_command=True, output="ok")
    >>> result = LaunchResult(exit_code=0, reason="ok", failed_task=None, tasks=(done,),
    ...                       cluster=ClusterSpec(jobs={"worker": ["127.0.0.1:2222"]}))
    >>> result.reason is Outcome.OK, result.to_dict()["reason"], LaunchResult.from_dict(result.to_dict()) == result
    (True, 'ok', True)
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from tfdist._names import describe_choices
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, invalid
from tfdist.launch.output import NoiseFilter

__all__ = ["LaunchResult", "Outcome", "TaskResult"]

_TAIL = 15  # Lines of the failing task's output in a summary.


class Outcome(enum.StrEnum):
    """How a run ended. The members are strings too: ``Outcome.OK == "ok"``, and JSON writes ``"ok"``.

    Example:
        >>> Outcome("timeout") is Outcome.TIMEOUT, f"run {Outcome.FAILED}"
        (True, 'run failed')
    """

    OK = "ok"  # every command task finished with 0
    FAILED = "failed"  # a task that matters failed for good (restarts used up, too few workers left)
    TIMEOUT = "timeout"  # the run's ``timeout`` passed
    INTERRUPTED = "interrupted"  # SIGINT, SIGTERM, SIGHUP or SIGQUIT stopped the run
    STALLED = "stalled"  # no training task completed a step for ``stall_seconds``


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskResult:
    """How one task ended."""

    task: str
    exit_code: int | None
    restarts: int
    runs_command: bool
    output: str
    pid: int | None = None
    lost: bool = False  # An elastic worker the run went on without (and that did not return).


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchResult:
    """How the whole run ended.

    Attributes:
      exit_code: 0 when every command task succeeded; else the first failing
        task's code (124 on timeout, 130/143 when interrupted, 203 stalled).
      reason: How the run ended, an :class:`Outcome` (a string: 'ok',
        'failed', 'timeout', 'interrupted' or 'stalled'; a plain string is
        read as one).
      failed_task: The task that ended the run, if any (of a stall: the
        first task that stopped, if the inspector could tell).
      tasks: Every task's result.
      cluster: The cluster that ran.
    """

    exit_code: int
    reason: Outcome
    failed_task: str | None
    tasks: tuple[TaskResult, ...]
    cluster: ClusterSpec

    def __post_init__(self) -> None:
        if not isinstance(self.reason, Outcome):
            names = [outcome.value for outcome in Outcome]
            if not isinstance(self.reason, str) or self.reason not in names:
                raise invalid(LaunchError, "reason", self.reason, describe_choices(str(self.reason), names))
            object.__setattr__(self, "reason", Outcome(self.reason))

    def task(self, name: str) -> TaskResult:
        """The result of task ``name`` ('type:index')."""
        for result in self.tasks:
            if result.task == name:
                return result
        raise invalid(LaunchError, "task", name, describe_choices(name, [t.task for t in self.tasks]))

    def summary(self) -> str:
        """A few lines for people: the outcome, restarts and lost workers, and on failure the failing task's last
        lines (not TF's noise).

        Example:
            >>> from tfdist import ClusterSpec
            >>> tasks = tuple(TaskResult(task=f"worker:{i}", exit_code=c, restarts=1, runs_command=True, output="",
            ...                          lost=c != 0) for i, c in enumerate((0, 137)))
            >>> LaunchResult(exit_code=0, reason="ok", failed_task=None, tasks=tasks,
            ...              cluster=ClusterSpec(jobs={"worker": ["h:1", "h:2"]})).summary()
            'run ok (exit 0); restarted 1 time; lost worker:1 (exit 137)'
        """
        restarts = max((task.restarts for task in self.tasks), default=0)
        lost = [f"{task.task} (exit {task.exit_code})" for task in self.tasks if task.lost]
        lines = [
            f"run {self.reason} (exit {self.exit_code})"
            + (f"; {self.failed_task} ended the run" if self.failed_task else "")
            + (f"; restarted {restarts} time{'s' * (restarts != 1)}" if restarts else "")
            + (f"; lost {', '.join(lost)}" if lost and self.reason == Outcome.OK else "")
        ]
        if self.failed_task:
            keep = NoiseFilter()  # TF's start-up noise is not what a failure's last lines should show.
            tail = [line for line in self.task(self.failed_task).output.splitlines() if keep(line)][-_TAIL:]
            lines += [f"  last lines of {self.failed_task}:"] + [f"    {line}" for line in tail]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable form; :meth:`from_dict` reads it back."""
        return {
            "exit_code": self.exit_code,
            "reason": self.reason.value,
            "failed_task": self.failed_task,
            "cluster": self.cluster.cluster_dict(dense=False),
            "tasks": [dataclasses.asdict(task) for task in self.tasks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchResult:
        """The result :meth:`to_dict` wrote."""
        return cls(
            exit_code=data["exit_code"],
            reason=data["reason"],
            failed_task=data["failed_task"],
            tasks=tuple(TaskResult(**task) for task in data["tasks"]),
            cluster=ClusterSpec(jobs=data["cluster"]),
        )
