"""One child task: started in its own session, output streamed and kept, always reaped."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Optional

LineSink = Callable[[str, str], None]  # (task, line) -> None
_KEEP_LINES = 20000


def exit_code(returncode: int) -> int:
    """Shell-style exit code: a death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Child:
    """A task process whose output is prefixed, streamed, logged and kept.

    Example:
        >>> import sys
        >>> child = Child("worker:0", [sys.executable, "-c", "import sys; sys.stdout.write('hi')"], env=None)
        >>> child.start(); child.wait(10)
        0
        >>> child.lines[-1]
        'hi'
    """

    def __init__(self, task: str, argv: Sequence[str], *, env: Optional[dict[str, str]],
                 sink: Optional[LineSink] = None, log_path: Optional[str] = None) -> None:
        self.task = task
        self.argv = list(argv)
        self.env = env
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self.restarts = 0
        self.started_at = 0.0
        self._sink = sink
        self._log_path = log_path
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._reader: Optional[threading.Thread] = None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc else None

    def start(self, env: Optional[dict[str, str]] = None) -> None:
        """Starts (or restarts) the process in a new session."""
        if env is not None:
            self.env = env
        self._proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.started_at = time.monotonic()
        log = open(self._log_path, "ab") if self._log_path else None  # noqa: SIM115 - closed by reader.
        if log is not None:
            log.write(f"--- tfdist-launch: {self.task} start #{self.restarts} pid {self._proc.pid}\n".encode())
        self._reader = threading.Thread(target=self._pump, args=(self._proc.stdout, log),
                                        name=f"tfdist-{self.task}", daemon=True)
        self._reader.start()

    def _pump(self, stream: IO[bytes], log: Optional[IO[bytes]]) -> None:
        try:
            for raw in iter(stream.readline, b""):
                if log is not None:
                    log.write(raw)
                    log.flush()
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                self.lines.append(line)
                if self._sink is not None:
                    self._sink(self.task, line)
        finally:
            stream.close()
            if log is not None:
                log.close()

    def poll(self) -> Optional[int]:
        """The exit code when finished, else None."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        return None if code is None else exit_code(code)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def signal(self, sig: int) -> None:
        """Sends ``sig`` to the task's whole process group."""
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Waits for exit and for the output to drain; the exit code, or None on timeout."""
        if self._proc is None:
            return None
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._reader is not None:
            self._reader.join(5)
        return self.poll()

    def stop(self, grace: float) -> Optional[int]:
        """SIGTERM, then SIGKILL after ``grace`` seconds; always reaps."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self.signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.signal(signal.SIGKILL)
        self.wait()
        # Grandchildren in the task's group go too, even when the task itself has exited.
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.poll()
