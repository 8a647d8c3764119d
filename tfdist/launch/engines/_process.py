"""One local task process: started in its own session, output streamed line by line, always reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence

from tfdist.errors import LaunchFailure
from tfdist.launch.output import LineSink, pump_lines
from tfdist.runtime import exit_codes


class LocalProcess:
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
        self.task = task
        self._on_line = on_line
        self._on_exit = on_exit
        self._released = False
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
        self._reader = threading.Thread(target=self._pump, name=f"tfdist-{task}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        # Lines also end at a lone '\r': a progress bar's updates are lines too.
        pump_lines([self._proc.stdout, self._proc.stderr], lambda line: self._on_line(self.task, line))

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def poll(self) -> int | None:
        """The exit code when finished (a death by signal N is 128 + N), else None."""
        code = self._proc.poll()
        return None if code is None else exit_codes.from_returncode(code)

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the task's whole process group, unless the task is released."""
        if self._released:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, or None if the task still runs after ``timeout`` seconds (output is not awaited)."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def release(self, timeout: float) -> None:
        """After exit: SIGKILLs what is left in the task's group, then reads its last output (<= ``timeout`` s)."""
        if self._released or self._proc.poll() is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)  # Grandchildren holding the output pipe go too.
        except (ProcessLookupError, PermissionError):
            pass
        self._released = True
        self._reader.join(max(0.0, timeout))
        if self._on_exit is not None:
            self._on_exit(self._proc.pid)
