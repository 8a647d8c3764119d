"""The step watchdog: a thread in a training task that reads the task's Python stacks and tells the launcher's
stall inspector whether the task completes steps, and where it is when it does not.

Every step of ``model.fit`` or of a custom loop is a call from Python into TensorFlow (the train function, a
``tf.function``) that returns. The watchdog samples every thread's stack every 0.1 s
(``sys._current_frames()``) and counts a step each time the main thread's TensorFlow call of the last sample
has returned. Where the task is (:class:`Where`):

- ``tensorflow``: the main thread is inside a TensorFlow call and no Python of the step runs: it waits in
  TensorFlow, for a collective's peers or for its own computation;
- ``py_function``: inside a TensorFlow call, a ``tf.py_function`` body runs Python (user code, a sleep, a
  lock), on the TensorFlow thread that called it;
- ``python``: the main thread runs Python outside any TensorFlow call (the code between steps).

Twice a second it replaces ``TASK.json`` in the launcher's directory with a :class:`StepReport`. It writes
every thread's stack (:mod:`faulthandler`) into ``TASK.stacks`` when asked: on ``SIGUSR1``, registered when
nothing else handles that signal (the dump is written even while native code holds the GIL), or when a
request file ``TASK.dump`` appears. The launcher asks for the watchdog with one variable, ``TFDIST_STEP_WATCH``
(a :class:`WatchTarget`); :func:`watch_steps` starts it once per process (:func:`tfdist.build_strategy` and
tfdist's function task program call it; without the variable it does nothing).

Example:
    >>> target = WatchTarget(directory="/tmp/run", task="worker:1", attempt=2)
    >>> WatchTarget.from_env(target.to_env()) == target, target.path(".stacks")
    (True, '/tmp/run/worker-1.stacks')
    >>> watch_steps({})  # not asked for: no thread
    False
"""

from __future__ import annotations

import dataclasses
import enum
import faulthandler
import json
import linecache
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import IO, Any

from tfdist._compat.frames import PY_FUNCTION_FILE, tensorflow_prefix

WATCH_VAR = "TFDIST_STEP_WATCH"
SAMPLE_SECONDS = 0.1  # between two looks at the stacks
REPORT_SECONDS = 0.5  # between two reports
DUMP_SIGNAL = signal.SIGUSR1
REPORT, STACKS, DUMP_REQUEST = ".json", ".stacks", ".dump"  # the files of one task, after its name

_log = logging.getLogger("tfdist.runtime")


class Where(enum.StrEnum):
    """Where a task's main thread is (see the module docstring)."""

    TENSORFLOW = "tensorflow"
    PY_FUNCTION = "py_function"
    PYTHON = "python"


@dataclasses.dataclass(frozen=True, kw_only=True)
class WatchTarget:
    """Where one task's watchdog reports: ``directory``, under the file names of ``task`` and its ``attempt``."""

    directory: str
    task: str
    attempt: int = 0

    def path(self, suffix: str) -> str:
        """The task's file with ``suffix`` (:data:`REPORT`, :data:`STACKS`, :data:`DUMP_REQUEST`)."""
        return os.path.join(self.directory, self.task.replace(":", "-") + suffix)

    def to_env(self) -> str:
        """The value of :data:`WATCH_VAR` that asks a task for this watchdog."""
        return json.dumps({"directory": self.directory, "task": self.task, "attempt": self.attempt})

    @classmethod
    def from_env(cls, text: str) -> WatchTarget | None:
        """The target in :data:`WATCH_VAR`'s value; None when it is empty or not one."""
        try:
            data = json.loads(text) if text else {}
            return cls(directory=str(data["directory"]), task=str(data["task"]), attempt=int(data["attempt"]))
        except (ValueError, TypeError, KeyError):
            return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepReport:
    """What a task's watchdog last said.

    Attributes:
      task: The launcher's name of the task.
      attempt: Which start of the task this is (the launcher's restart count).
      pid: The process that reports.
      seq: Counts the reports: a report the launcher saw before has the same one.
      steps: TensorFlow calls of the main thread seen to return so far (at least that many).
      where: Where the task is now.
      detail: The code it runs there, in one line (``train.py:20 in slow: time.sleep(60)``).
      seconds: How long it has been there (in this place and the same TensorFlow call).
      dump_signal: The signal that makes it write its stacks; None: only the request file does.
    """

    task: str
    attempt: int
    pid: int
    seq: int
    steps: int
    where: Where
    detail: str
    seconds: float
    dump_signal: int | None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def read(cls, path: str) -> StepReport | None:
        """The report in ``path``; None when there is none (yet) or it is not one."""
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
            return cls(**{**data, "where": Where(data["where"])})
        except (OSError, ValueError, TypeError, KeyError):
            return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """One look at the stacks: where the main thread is, its TensorFlow call, and the frame that says where."""

    where: Where
    call: FrameType | None  # the main thread's current TensorFlow call (outermost frame of the innermost TF block)
    frame: FrameType | None  # the code to show: the py_function's, the Python's, or the TF call's caller


class StackSampler:
    """Tells :class:`Where` a thread is from its stacks.

    Args:
      main: The thread whose steps count (its ``ident``).
      prefix: Returns the directory of TensorFlow's Python files (None before TensorFlow is imported);
        default :func:`tfdist._compat.frames.tensorflow_prefix`.
    """

    def __init__(self, main: int, prefix: Callable[[], str | None] = tensorflow_prefix) -> None:
        self._main = main
        self._prefix = prefix

    def sample(self, frames: Mapping[int, FrameType]) -> Sample:
        """Where the main thread of ``frames`` (``sys._current_frames()``) is."""
        frame = frames.get(self._main)
        prefix = self._prefix()
        if frame is None or prefix is None or not frame.f_code.co_filename.startswith(prefix):
            return Sample(where=Where.PYTHON, call=None, frame=frame)
        call = frame
        while call.f_back is not None and call.f_back.f_code.co_filename.startswith(prefix):
            call = call.f_back
        py_function = prefix + PY_FUNCTION_FILE
        for ident, top in frames.items():
            if ident != self._main and _runs(top, py_function):
                return Sample(where=Where.PY_FUNCTION, call=call, frame=top)
        return Sample(where=Where.TENSORFLOW, call=call, frame=call.f_back)


def _runs(frame: FrameType | None, filename: str) -> bool:
    """Whether a frame of ``filename`` is on the stack that ends at ``frame``."""
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return True
        frame = frame.f_back
    return False


def describe(frame: FrameType | None) -> str:
    """``file.py:LINE in function: source line`` for a frame, in one line."""
    if frame is None:
        return "(no Python frame)"
    code, line = frame.f_code, frame.f_lineno or 0
    source = linecache.getline(code.co_filename, line).strip()
    return f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}" + (f": {source}" if source else "")


class StepCounter:
    """Turns samples into steps and the time spent in one place: the watchdog's state, apart from its thread.

    Example:
        >>> counter = StepCounter()
        >>> counter.add(Sample(where=Where.PYTHON, call=None, frame=None), now=0.0)
        >>> counter.steps, counter.since
        (0, 0.0)
    """

    def __init__(self) -> None:
        self.steps = 0
        self.since = 0.0
        self.last: Sample | None = None

    def add(self, sample: Sample, now: float) -> None:
        """Counts a step when the TensorFlow call of the last sample is not this one's."""
        last = self.last
        if last is not None and last.call is not None and sample.call is not last.call:
            self.steps += 1
        if last is None or sample.where != last.where or sample.call is not last.call:
            self.since = now
        self.last = sample  # Keeps its frames alive until the next sample: their ids cannot be reused.


class Watchdog:
    """The thread that samples, reports and dumps for one task (see the module docstring)."""

    def __init__(self, target: WatchTarget, main: int, stacks: IO[str], dump_signal: int | None) -> None:
        self.target, self.pid = target, os.getpid()
        self._sampler = StackSampler(main)
        self._counter = StepCounter()
        self._stacks, self._dump_signal = stacks, dump_signal
        self._seq = 0
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="tfdist-step-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self.pid == os.getpid() and self._thread.is_alive()

    def _run(self) -> None:
        next_report = 0.0
        while True:
            time.sleep(SAMPLE_SECONDS)
            try:
                now = time.monotonic()
                self._counter.add(self._sampler.sample(sys._current_frames()), now)
                if now >= next_report:
                    next_report = now + REPORT_SECONDS
                    self._report(now)
                    self._dump_if_asked()
            except Exception:  # The task goes on without a watchdog rather than fail.
                if not self._failed:
                    _log.warning(
                        "The step watchdog failed; the stall inspector no longer sees %s.",
                        self.target.task,
                        exc_info=True,
                    )
                self._failed = True

    def _report(self, now: float) -> None:
        counter, self._seq = self._counter, self._seq + 1
        last = counter.last
        report = StepReport(
            task=self.target.task,
            attempt=self.target.attempt,
            pid=self.pid,
            seq=self._seq,
            steps=counter.steps,
            where=last.where if last is not None else Where.PYTHON,
            detail=describe(last.frame if last is not None else None),
            seconds=round(now - counter.since, 1),
            dump_signal=self._dump_signal,
        )
        path = self.target.path(REPORT)
        partial = f"{path}.{self.pid}.tmp"
        try:
            with open(partial, "w", encoding="utf-8") as file:
                file.write(report.to_json())
            os.replace(partial, path)
        except OSError:
            pass  # The launcher removed its directory: the run is ending.

    def _dump_if_asked(self) -> None:
        request = self.target.path(DUMP_REQUEST)
        if os.path.exists(request):
            faulthandler.dump_traceback(file=self._stacks, all_threads=True)
            try:
                os.remove(request)
            except OSError:
                pass


_lock = threading.Lock()
_running: Watchdog | None = None


def watch_steps(environ: Mapping[str, str] | None = None) -> bool:
    """Starts this process's step watchdog if the launcher asks for one (``TFDIST_STEP_WATCH``); once per process.

    Returns whether a watchdog runs. The thread that calls it first is the one whose steps count (the main
    thread, where ``fit`` or the custom loop runs).
    """
    global _running
    target = WatchTarget.from_env((os.environ if environ is None else environ).get(WATCH_VAR, ""))
    if target is None:
        return False
    with _lock:
        if _running is not None and _running.alive():
            return True
        stacks = open(target.path(STACKS), "a", encoding="utf-8")  # open for good: faulthandler writes to it
        dump_signal = _register_dump(stacks)
        _running = Watchdog(target, threading.get_ident(), stacks, dump_signal)
        _running.start()
    how = f"on signal {dump_signal}" if dump_signal is not None else "on request"
    _log.info("Step watchdog on for %s: stacks %s into %s.", target.task, how, target.path(STACKS))
    return True


def _register_dump(stacks: IO[Any]) -> int | None:
    """Registers :data:`DUMP_SIGNAL` to write every thread's stack into ``stacks``, unless something handles it."""
    if signal.getsignal(DUMP_SIGNAL) is not signal.SIG_DFL:
        return None
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True, chain=False)
    return int(DUMP_SIGNAL)
