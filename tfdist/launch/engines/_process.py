"""One local task process: started in its own session, output streamed line by line, always reaped."""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from tfdist.errors import LaunchFailure
from tfdist.launch.output import LineSink, pump_lines
from tfdist.runtime import exit_codes


class GroupProcess(abc.ABC):
    """A task process that leads a session (and process group) of its own; a thread pumps its output lines.

    Subclasses start the process, then call :meth:`_start_pump`; they say how to read its return code
    (:meth:`_returncode`, Popen's style: -N for a death by signal N) and how to wait for it (:meth:`_block`).
    """

    def __init__(self, task: str, on_line: LineSink, on_exit: Callable[[int], None] | None) -> None:
        self.task = task
        self._on_line = on_line
        self._on_exit = on_exit
        self._released = False
        self._reader: threading.Thread | None = None

    def _start_pump(self, streams: Sequence[IO[bytes] | None]) -> None:
        # Lines also end at a lone '\r': a progress bar's updates are lines too.
        def _pump() -> None:
            pump_lines(streams, lambda line: self._on_line(self.task, line))

        self._reader = threading.Thread(target=_pump, name=f"tfdist-{self.task}", daemon=True)
        self._reader.start()

    @property
    @abc.abstractmethod
    def pid(self) -> int:
        """The process id, which is also its process group's id."""

    @abc.abstractmethod
    def _returncode(self) -> int | None:
        """None while running, else the return code as :class:`subprocess.Popen` gives it."""

    @abc.abstractmethod
    def _block(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` s for the end; True once the process has ended."""

    def poll(self) -> int | None:
        """The exit code when finished (a death by signal N is 128 + N), else None."""
        code = self._returncode()
        return None if code is None else exit_codes.from_returncode(code)

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the task's whole process group, unless the task is released."""
        if self._released:
            return
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if the task still runs after ``timeout`` seconds (output is not awaited)."""
        return self.poll() if self._block(timeout) else None

    def release(self, timeout: float) -> None:
        """After exit: SIGKILLs what is left in the task's group, then reads its last output (<= ``timeout`` s)."""
        if self._released or self._returncode() is None:
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)  # Grandchildren holding the output pipe go too.
        except (ProcessLookupError, PermissionError):
            pass
        self._released = True
        if self._reader is not None:
            self._reader.join(max(0.0, timeout))
        if self._on_exit is not None:
            self._on_exit(self.pid)


class LocalProcess(GroupProcess):
    """A task process in a session (and process group) of its own.

    Example:
        >>> import sys
        >>> lines = []
        >>> hello = [sys.executable, "-c", "import sys; sys.stdout.write('hi' + chr(10))"]
        >>> proc = LocalProcess("worker:0", hello, env=None,
        ...                     on_line=lambda task, line: lines.append((task, line)))
        >>> proc.wait(10)
        0
        >>> proc.release(5); lines
        [('worker:0', 'hi')]
    """

    def __init__(
        self,
        task: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None,
        on_line: LineSink,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(task, on_line, on_exit)
        try:
            self._proc = subprocess.Popen(
                list(argv),
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,  # A pipe of its own: a line is never cut by the other stream.
                start_new_session=True,
            )
        except OSError as err:
            raise LaunchFailure(f"Could not start {task} ({argv[0]!r}): {err.strerror or err}.") from err
        self._start_pump([self._proc.stdout, self._proc.stderr])

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _returncode(self) -> int | None:
        return self._proc.poll()

    def _block(self, timeout: float | None) -> bool:
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
