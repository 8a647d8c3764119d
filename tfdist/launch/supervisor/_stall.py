"""The stall inspector: when no training task completed a step for ``stall_seconds``, who stopped and who waits.

Each training task runs a step watchdog (:mod:`tfdist.runtime.watchdog`) that reports, twice a second, how
many steps it completed and where it is. The inspector reads those reports on the supervisor's clock and
:func:`decide` judges them: a stall is ``stall_seconds`` without a completed step in any task, counted from
the last step completed or, before the first, from the first task seen inside a step. Then each task is:

- **stopped** when it runs Python (in a ``tf.py_function`` of its step, or outside TensorFlow), when its
  watchdog went silent (the process is stopped, or native code holds the GIL), or when the supervisor
  knows why (``evidence``: "its link is cut");
- **waiting** when it is blocked inside a TensorFlow call: on its peers, the stopped tasks;
- **unwatched** when it reports nothing (its program does not call ``tfdist.build_strategy``).

A run in which every watched task runs Python outside TensorFlow is not stalled: nobody waits on anybody (a
long evaluation in NumPy, files written after ``fit``); ``timeout`` is for that. The supervisor then asks
every watched task for its stacks (:meth:`StallInspector.dump_stacks`), logs the report and ends the run
(``Outcome.STALLED``) or, in an elastic run, loses the stopped workers.

Example:
    >>> from tfdist.runtime.watchdog import StepReport, Where
    >>> def seen(where):  # a third step at 0 s, and no other since (a report read at 0 s and at 11.5 s)
    ...     reports = [StepReport(task="", attempt=0, pid=1, seq=seq, steps=3, where=where,
    ...                           detail="train.py:9 in step", seconds=12.0, dump_signal=None) for seq in (1, 2)]
    ...     return Observation().observe(reports[0], now=0.0).observe(reports[1], now=11.5)
    >>> tasks = {"worker:0": seen(Where.TENSORFLOW), "worker:1": seen(Where.PY_FUNCTION)}
    >>> decide(tasks, now=9.0, seconds=10.0) is None
    True
    >>> stall = decide(tasks, now=12.0, seconds=10.0)
    >>> stall.stopped, stall.waiting
    (('worker:1',), ('worker:0',))
"""

from __future__ import annotations

import dataclasses
import enum
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping

from tfdist.runtime.watchdog import (
    DUMP_REQUEST,
    REPORT,
    REPORT_SECONDS,
    STACKS,
    WATCH_VAR,
    StepReport,
    WatchTarget,
    Where,
)

UNRESPONSIVE_SECONDS = 10 * REPORT_SECONDS  # a watchdog that has not reported for this long is silent
_POLL_SECONDS = REPORT_SECONDS  # the reports are read as often as they are written
_DUMP_WAIT_SECONDS = 3.0


class Verdict(enum.StrEnum):
    """What the inspector makes of one task in a stall."""

    STOPPED = "stopped"
    WAITING = "waiting"
    UNWATCHED = "unwatched"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observation:
    """What the inspector knows of one task's current attempt, on the supervisor's clock.

    Attributes:
      report: Its watchdog's last report; None before the first.
      seen_at: When that report's ``seq`` was first read.
      progress_at: When it last completed a step, or (before its first) was first seen inside one.
    """

    report: StepReport | None = None
    seen_at: float | None = None
    progress_at: float | None = None

    def observe(self, report: StepReport, now: float) -> Observation:
        """This observation after reading ``report`` at ``now``."""
        last = self.report
        seen_at = now if last is None or report.seq != last.seq else self.seen_at
        progress_at = self.progress_at
        if report.steps > (last.steps if last is not None else 0) or (
            progress_at is None and report.where is not Where.PYTHON
        ):
            progress_at = now
        return Observation(report=report, seen_at=seen_at, progress_at=progress_at)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskVerdict:
    """One task in a stall: its :class:`Verdict` and why, in words."""

    task: str
    verdict: Verdict
    why: str
    in_python: bool = False  # stopped in Python outside TensorFlow (nobody is proven to wait on it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stall:
    """A stall :func:`decide` found: how long no step completed, and every inspected task's verdict."""

    idle_seconds: float
    last_progress: float
    tasks: tuple[TaskVerdict, ...]

    def _named(self, verdict: Verdict) -> tuple[str, ...]:
        return tuple(t.task for t in self.tasks if t.verdict is verdict)

    @property
    def stopped(self) -> tuple[str, ...]:
        """The tasks that stopped progressing."""
        return self._named(Verdict.STOPPED)

    @property
    def waiting(self) -> tuple[str, ...]:
        """The tasks blocked in TensorFlow: waiting on the stopped ones."""
        return self._named(Verdict.WAITING)

    def why(self, task: str) -> str:
        return next(t.why for t in self.tasks if t.task == task)

    def lines(self, seconds: float) -> list[str]:
        """The report, one status line each."""
        lines = [f"stall: no training task completed a step for {self.idle_seconds:.0f}s (--stall-seconds {seconds:g})"]
        lines += [f"stall: {t.task} {t.verdict}: {t.why}" for t in self.tasks]
        if not self.stopped:
            lines.append(
                "stall: no task runs Python: they wait in TensorFlow for one another (a peer it cannot reach, "
                "or a collective not every task entered)"
            )
        return lines


def _judge(task: str, seen: Observation, now: float, evidence: Mapping[str, str]) -> TaskVerdict:
    report = seen.report
    if task in evidence:
        return TaskVerdict(task=task, verdict=Verdict.STOPPED, why=evidence[task])
    if report is None:
        why = "reports no steps (its program does not build its strategy with tfdist.build_strategy)"
        return TaskVerdict(task=task, verdict=Verdict.UNWATCHED, why=why)
    silent = now - (seen.seen_at if seen.seen_at is not None else now)
    if silent >= UNRESPONSIVE_SECONDS:
        why = (
            f"its watchdog has not reported for {silent:.0f}s (the process is stopped, or native code holds "
            f"Python's GIL); it was in {report.where} at {report.detail}"
        )
        return TaskVerdict(task=task, verdict=Verdict.STOPPED, why=why)
    if report.where is Where.TENSORFLOW:
        why = f"blocked in TensorFlow for {report.seconds:.0f}s (on its peers, or its own computation), called at"
        return TaskVerdict(task=task, verdict=Verdict.WAITING, why=f"{why} {report.detail}")
    if report.where is Where.PY_FUNCTION:
        why = f"runs Python in a tf.py_function of its step for {report.seconds:.0f}s, at {report.detail}"
        return TaskVerdict(task=task, verdict=Verdict.STOPPED, why=why)
    why = f"runs Python outside TensorFlow for {report.seconds:.0f}s, at {report.detail}"
    return TaskVerdict(task=task, verdict=Verdict.STOPPED, why=why, in_python=True)


def decide(
    observations: Mapping[str, Observation], *, now: float, seconds: float, evidence: Mapping[str, str] | None = None
) -> Stall | None:
    """The stall among the running training tasks ``observations`` (in launch order), if there is one.

    Args:
      observations: Every running training task's :class:`Observation`.
      now: The supervisor's clock.
      seconds: ``stall_seconds``.
      evidence: Tasks the supervisor knows to be stuck, with why ("its link is cut"): stopped, whatever
        their watchdog says.
    """
    evidence = evidence or {}
    progress = [seen.progress_at for seen in observations.values() if seen.progress_at is not None]
    if not progress or now - max(progress) < seconds:
        return None
    verdicts = tuple(_judge(task, seen, now, evidence) for task, seen in observations.items())
    watched = [v for v in verdicts if v.verdict is not Verdict.UNWATCHED]
    if all(v.in_python for v in watched):
        return None  # Nobody waits on anybody: a long phase of Python everywhere, not a stall of the group.
    return Stall(idle_seconds=now - max(progress), last_progress=max(progress), tasks=verdicts)


class StallInspector:
    """The supervisor's stall inspector: the watchdogs' directory, the observations, the stacks.

    Args:
      seconds: ``stall_seconds``.
      log_dir: The run's log directory: the reports and stacks go there (``worker-1.stacks`` beside
        ``worker-1.log``); None: a new directory under the temp directory, kept only if stacks were written.
      status: Where the report's lines go (the supervisor's status sink).
    """

    def __init__(self, seconds: float, log_dir: str | None, status: Callable[[str], None]) -> None:
        self.seconds, self.status = seconds, status
        self.directory = log_dir or tempfile.mkdtemp(prefix="tfdist-stall-")
        self._temporary = log_dir is None
        self._attempts: dict[str, int] = {}
        self._seen: dict[str, Observation] = {}
        self._next_poll = 0.0
        self._started_at: float | None = None
        self._told_unwatched = False
        self._reported: float | None = None  # the last progress of the stall reported last

    def _target(self, task: str) -> WatchTarget:
        return WatchTarget(directory=self.directory, task=task, attempt=self._attempts.get(task, 0))

    def variables(self, task: str, attempt: int) -> dict[str, str]:
        """The variable that asks ``attempt`` of ``task`` for a watchdog; the task is watched afresh from now."""
        self._attempts[task] = attempt
        self._seen[task] = Observation()
        if self._started_at is None:
            self._started_at = time.monotonic()
        return {WATCH_VAR: self._target(task).to_env()}

    def check(self, now: float, running: Mapping[str, int], evidence: Mapping[str, str] | None = None) -> Stall | None:
        """Reads the reports of ``running`` (training task -> its process group) at most every 0.5 s; the stall."""
        if now < self._next_poll:
            return None
        self._next_poll = now + _POLL_SECONDS
        for task in running:
            report = StepReport.read(self._target(task).path(REPORT))
            if report is not None and report.attempt == self._attempts.get(task):
                self._seen[task] = self._seen.get(task, Observation()).observe(report, now)
        self._tell_unwatched(now)
        stall = decide(
            {t: self._seen.get(t, Observation()) for t in running}, now=now, seconds=self.seconds, evidence=evidence
        )
        if stall is None or stall.last_progress == self._reported:
            return None
        self._reported = stall.last_progress
        return stall

    def _tell_unwatched(self, now: float) -> None:
        if self._told_unwatched or self._started_at is None or now - self._started_at < self.seconds:
            return
        self._told_unwatched = True
        if not any(seen.report is not None for seen in self._seen.values()):
            self.status(
                f"stall: no task has reported its steps in {self.seconds:g}s: the inspector sees only programs that "
                "build their strategy with tfdist.build_strategy (or run under tfdist.launch.run_function)"
            )

    def report(self, stall: Stall, running: Mapping[str, int]) -> None:
        """Logs ``stall`` and where each watched task's stacks are (after asking for them)."""
        for line in stall.lines(self.seconds):
            self.status(line)
        written = self.dump_stacks(running)
        done = sorted(path for path in written.values() if path is not None)
        if done:
            self.status(f"stall: every thread's stack: {', '.join(done)}")
        silent = sorted(task for task, path in written.items() if path is None)
        if silent:
            self.status(f"stall: no stacks from {', '.join(silent)} within {_DUMP_WAIT_SECONDS:g}s")

    def dump_stacks(self, running: Mapping[str, int]) -> dict[str, str | None]:
        """Asks every watched task of ``running`` (task -> its process group) to write its stacks.

        Returns task -> its stacks file, or None when nothing was written within a few seconds. A task whose
        watchdog registered the dump signal gets it (only its own process, checked to be in the task's
        process group); any other finds a request file at its next report.
        """
        asked: dict[str, tuple[str, int]] = {}
        for task, group in running.items():
            report = self._seen.get(task, Observation()).report
            if report is None:
                continue
            target = self._target(task)
            path = target.path(STACKS)
            with open(path, "a", encoding="utf-8") as file:
                file.write(
                    f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} the stall inspector asks {task} (pid {report.pid}) "
                    "for every thread's stack\n"
                )
            asked[task] = (path, os.path.getsize(path))
            if not _signal(report, group):
                with open(target.path(DUMP_REQUEST), "w", encoding="utf-8"):
                    pass
        deadline = time.monotonic() + _DUMP_WAIT_SECONDS
        pending = set(asked)
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)
            pending = {task for task in pending if _size(asked[task][0]) <= asked[task][1]}
        return {task: None if task in pending else path for task, (path, _) in asked.items()}

    def close(self) -> None:
        """Removes the reports and requests, and stacks files nothing was written to; a temporary directory
        goes unless it holds stacks."""
        for task in self._attempts:
            target = self._target(task)
            leftovers = [target.path(REPORT), target.path(DUMP_REQUEST), *glob.glob(target.path(REPORT) + ".*.tmp")]
            if _size(target.path(STACKS)) == 0:
                leftovers.append(target.path(STACKS))
            for path in leftovers:
                try:
                    os.remove(path)
                except OSError:
                    pass
        if self._temporary and not os.listdir(self.directory):
            shutil.rmtree(self.directory, ignore_errors=True)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _signal(report: StepReport, group: int) -> bool:
    """Sends the dump signal to the reporting process if it has one and belongs to the task's process group."""
    if report.dump_signal is None:
        return False
    try:
        if os.getpgid(report.pid) != group:
            return False
        os.kill(report.pid, report.dump_signal)
    except OSError:  # gone, or not ours
        return False
    return True
