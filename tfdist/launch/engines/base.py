"""The engine adapter: where tasks run. Supervision (restarts, faults, stopping) lives in the runner, once.

An engine places every task (gives it an address), starts a task's command with the environment the
supervisor built, streams its output lines, reports its exit and delivers signals. It never decides to
restart or stop anything: :func:`tfdist.launch.supervisor.runner.run_config` does, the same way for every engine.

Example:
    >>> import sys
    >>> from tfdist.launch.config import LaunchConfig
    >>> engine = LocalEngine()
    >>> spec = engine.place(LaunchConfig(command=("python",), workers=2))
    >>> lines = []
    >>> hello = [sys.executable, "-c", "import sys; sys.stdout.write('hi' + chr(10))"]
    >>> task = engine.start("worker:0", hello, {}, lambda t, l: lines.append(l))
    >>> task.wait(30), spec.num_workers
    (0, 2)
    >>> task.release(5); engine.close(); lines
    ['hi']
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from typing import ClassVar, Optional, Protocol, runtime_checkable

from tfdist.cluster import address as _address
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchFailure
from tfdist.launch.engines._process import LineSink, LocalProcess
from tfdist.launch.engines._reaper import Reaper
from tfdist.launch.config import LaunchConfig

__all__ = ["Engine", "TaskProcess", "LineSink", "LocalEngine"]

_log = logging.getLogger("tfdist.launch")


@runtime_checkable
class TaskProcess(Protocol):
    """One started attempt of one task, as an engine runs it."""

    @property
    def pid(self) -> Optional[int]:
        """A local process id for reports and leak checks; None when the task is not a local process."""

    def poll(self) -> Optional[int]:
        """None while running; else the shell-style exit code (death by signal N is 128 + N)."""

    def signal(self, sig: int) -> None:
        """Delivers ``sig`` to the task and everything it started; cheap, never blocks, no-op once gone."""

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """The exit code, or None if still running after ``timeout`` seconds. Does not wait for output."""

    def release(self, timeout: float) -> None:
        """After exit: stops leftovers (grandchildren) and delivers the last output lines within ``timeout`` s."""


class Engine(abc.ABC):
    """Places and runs tasks; see the module docstring for what an engine must not do."""

    name: ClassVar[str]

    @abc.abstractmethod
    def place(self, config: LaunchConfig) -> ClusterSpec:
        """Gives every task of ``config`` an address; called once per run, before any :meth:`start`.

        Raises:
          LaunchError: ``config`` cannot run on this engine.
          LaunchFailure: The engine lacks resources (ports, nodes) right now.
        """

    @abc.abstractmethod
    def reserve_address(self) -> str:
        """A free ``host:port`` for a side service (the tf.data dispatcher, started as 'data-service:0')."""

    @abc.abstractmethod
    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        """Starts ``argv`` as ``task`` with exactly ``env``; again on a restart (same task, same address).

        ``on_line(task, line)`` gets every output line (stdout and stderr), from any thread.

        Raises:
          LaunchFailure: The task could not be started; nothing of it is left running.
        """

    def lost(self, task: str) -> bool:
        """Whether ``task``'s last attempt ended because its place is gone (its node left the cluster).

        The supervisor then counts the task as lost (elastic runs) instead of restarting it where it cannot
        run. Default: never; a local process always has this machine.
        """
        return False

    def deciding(self, task: str) -> bool:
        """Whether the engine cannot yet tell if ``task``'s last attempt ended by a loss (see :meth:`lost`).

        While it is True the supervisor holds the exited tasks of that pass (and keeps serving timeouts,
        signals and fault injections); cheap, never blocks. Default: never.
        """
        return False

    def returned(self) -> dict[str, str]:
        """Lost tasks whose place is back since the last call, each with its (possibly new) ``host:port``.

        Polled often by the supervisor: cheap, never blocks. Default: none.
        """
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to do by default.
        """Frees the engine's resources after the run; idempotent."""


class LocalEngine(Engine):
    """Every task is a process on this machine, in a process group of its own.

    A reaper process (in its own session) stops every task group if the launcher dies, even by SIGKILL.
    """

    name = "local"

    def __init__(self) -> None:
        self._host = "127.0.0.1"
        self._reaper: Optional[Reaper] = None
        self._grace = 5.0

    def place(self, config: LaunchConfig) -> ClusterSpec:
        self._host, self._grace = config.host, config.grace_seconds
        for _ in range(10):
            spec = ClusterSpec.local(workers=config.workers, ps=config.ps, chief=config.chief,
                                     evaluator=config.evaluator, host=config.host)
            taken = [t.address for t in spec.tasks()
                     if not _address.port_is_free(*_address.split_address(t.address))]
            if not taken:
                return spec
            _log.info("Ports %s were taken before start; picking again.", taken)
        raise LaunchFailure("Could not find free ports for the cluster after 10 tries; is the machine out of ports?")

    def reserve_address(self) -> str:
        return f"{self._host}:{_address.free_ports(1, self._host)[0]}"

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        if self._reaper is None:
            self._reaper = Reaper(grace=self._grace)
        reaper = self._reaper
        proc = LocalProcess(task, argv, env=env, on_line=on_line, on_exit=reaper.forget)
        if proc.pid is not None:
            reaper.watch(proc.pid)
        return proc

    def close(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.close()
