"""The supervisor's state, in one place: every task's record, the training group of this generation, and
how the run ends (:class:`Ending`).

Only the supervisor (:mod:`tfdist.launch.supervisor.runner`) changes a :class:`Group`; its collaborators (the
elastic rules, the fault injections) get what they need as arguments and answer with values.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import threading
import time
from collections.abc import Sequence
from typing import IO

from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import TaskProcess
from tfdist.launch.results import Outcome
from tfdist.launch.supervisor.membership import Membership
from tfdist.runtime import exit_codes

_KEEP_LINES = 20000  # output lines kept per task for the result (the log files keep all)
KILLED = exit_codes.from_signal(signal.SIGKILL)  # the code of a worker the supervisor killed, if it reports none


class TaskRecord:
    """The supervisor's record of one task across its attempts."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str | None) -> None:
        self.name, self.argv = name, tuple(argv)
        self.proc: TaskProcess | None = None
        self.restarts = 0
        self.ended_at: float | None = None  # when the current attempt exited (monotonic), set by its waiter
        self.waiter: threading.Thread | None = None
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self.log: IO[str] | None = open(log_path, "a", encoding="utf-8") if log_path else None

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def watch_exit(self) -> None:
        """Stamps the exit of the current attempt as it happens (a daemon thread that lives as long as it)."""
        proc, self.ended_at = self.proc, None

        def _stamp() -> None:
            if proc is not None and proc.wait(None) is not None and self.proc is proc:
                self.ended_at = time.monotonic()

        self.waiter = threading.Thread(target=_stamp, name=f"tfdist-exit-{self.name}", daemon=True)
        self.waiter.start()

    def exit_time(self) -> float:
        """When the current attempt (which has exited) ended; failures are handled in this order."""
        if self.waiter is not None:
            self.waiter.join(1.0)  # the process is gone: its waiter stamps at once
        return self.ended_at if self.ended_at is not None else time.monotonic()


class NotStarted:
    """The attempt of a worker whose start failed (its engine could not run it): it has exited at once."""

    pid: int | None = None

    def poll(self) -> int | None:
        return exit_codes.FAILED

    def signal(self, sig: int) -> None:
        pass

    def wait(self, timeout: float | None) -> int | None:
        return exit_codes.FAILED

    def release(self, timeout: float) -> None:
        pass


class Group:
    """Everything the supervisor knows of a run while it goes on (a mutable record: one per run).

    Attributes:
      config: What runs.
      tasks: Every task's record, by launcher name ('worker:1'), in launch order.
      data_service: The tf.data service's record, when the run has one.
      full_spec: Every task's address (a returned worker's new one included).
      spec: This generation's cluster (the present workers, renumbered).
      membership: This generation of the training group.
      finished: The exit code of every task whose current attempt ended and was handled.
      away: Lost workers.
      available: Returned workers waiting for the next epoch boundary.
      unstartable: Workers whose last start failed, with why; counted as lost when handled.
      elastic_dir: Where the training leader records epoch boundaries (elastic runs only).
      boundaries_seen: The boundary files already read.
      unannounced: Whether a worker returned while the group's leader had not said it records epoch
        boundaries (the supervisor says once when it does).
      restarts_used: Restarts spent so far (of ``config.max_restarts``).
      stop_signal: The signal that asked the run to stop, once one did.
    """

    def __init__(
        self,
        *,
        config: LaunchConfig,
        tasks: dict[str, TaskRecord],
        data_service: TaskRecord | None,
        spec: ClusterSpec,
        membership: Membership,
        elastic_dir: str | None,
    ) -> None:
        self.config, self.tasks, self.data_service = config, tasks, data_service
        self.full_spec = self.spec = spec
        self.membership = membership
        self.finished: dict[str, int] = {}
        self.away: list[str] = []
        self.available: list[str] = []
        self.unstartable: dict[str, str] = {}
        self.elastic_dir = elastic_dir
        self.boundaries_seen: set[str] = set()
        self.unannounced = False
        self.restarts_used = 0
        self.stop_signal: int | None = None

    def records(self) -> list[TaskRecord]:
        """Every record, the data service's last."""
        return list(self.tasks.values()) + ([self.data_service] if self.data_service is not None else [])

    def elastic_worker(self, task: str) -> bool:
        """Whether ``task`` is a worker of an elastic run's group (it may be lost instead of failing the run)."""
        return self.elastic_dir is not None and task in self.membership.workers

    def restart_group(self, task: str) -> list[str]:
        """The tasks that restart together when ``task`` failed."""
        task_type = split_task_name(task)[0]
        if task_type == "evaluator":
            return [task]
        if self.config.mode == "parameter_server" and task_type == "worker":
            return [task]  # The coordinator reschedules its closures.
        # A lost ps loses variables; collectives cannot continue with a new peer: restart the training group.
        return [t for t in self.tasks if self.membership.trains(t)]

    def servers_first(self, names: Sequence[str]) -> list[str]:
        """``names`` in start order: the TF servers before the tasks that run the command."""
        return sorted(names, key=self.config.runs_command)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ending:
    """How a supervised run ended: its :class:`~tfdist.launch.results.Outcome`, exit code and the task that
    ended it.

    Example:
        >>> Ending.failed(7, "worker:1"), Ending.timeout().exit_code, Ending.interrupted(15).exit_code
        (Ending(outcome=<Outcome.FAILED: 'failed'>, exit_code=7, failed_task='worker:1'), 124, 143)
    """

    outcome: Outcome
    exit_code: int
    failed_task: str | None = None

    @classmethod
    def ok(cls) -> Ending:
        return cls(outcome=Outcome.OK, exit_code=exit_codes.OK)

    @classmethod
    def failed(cls, code: int, task: str) -> Ending:
        return cls(outcome=Outcome.FAILED, exit_code=code, failed_task=task)

    @classmethod
    def timeout(cls) -> Ending:
        return cls(outcome=Outcome.TIMEOUT, exit_code=exit_codes.TIMEOUT)

    @classmethod
    def interrupted(cls, signum: int) -> Ending:
        return cls(outcome=Outcome.INTERRUPTED, exit_code=exit_codes.from_signal(signum))

    @classmethod
    def stalled(cls, task: str | None) -> Ending:
        """No training task completed a step for ``stall_seconds``; ``task`` stopped first (None: none is known)."""
        return cls(outcome=Outcome.STALLED, exit_code=exit_codes.STALLED, failed_task=task)
