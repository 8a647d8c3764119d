"""The engine adapter: where tasks run. Supervision (restarts, faults, stopping) lives in the runner, once.

An engine places every task (gives it an address), starts a task's command with the environment the
supervisor built, streams its output lines, reports its exit and delivers signals. It never decides to
restart or stop anything: :func:`tfdist.launch.supervisor.runner.run_config` does, the same way for every engine.

The engines: :class:`~tfdist.launch.engines.local.LocalEngine` (processes on this machine, the default) and
:class:`~tfdist.launch.engines.ray.engine.RayEngine`; :func:`~tfdist.launch.engines.registry.register_engine` adds one.

Example:
    >>> from tfdist.launch import Engine, LocalEngine
    >>> issubclass(LocalEngine, Engine), LocalEngine.name, LocalEngine.isolates_network, Engine.isolates_network
    (True, 'local', True, False)
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchError, LaunchFailure, invalid
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines import _ports
from tfdist.launch.output import LineSink

__all__ = ["Engine", "TaskProcess"]


@runtime_checkable
class TaskProcess(Protocol):
    """One started attempt of one task, as an engine runs it."""

    @property
    def pid(self) -> int | None:
        """A local process id for reports and leak checks; None when the task is not a local process."""

    def poll(self) -> int | None:
        """None while running; else the shell-style exit code (death by signal N is 128 + N)."""

    def signal(self, sig: int) -> None:
        """Delivers ``sig`` to the task and everything it started; cheap, never blocks, no-op once gone."""

    def wait(self, timeout: float | None) -> int | None:
        """The exit code, or None if still running after ``timeout`` seconds. Does not wait for output."""

    def release(self, timeout: float) -> None:
        """After exit: stops leftovers (grandchildren) and delivers the last output lines within ``timeout`` s."""


def refuse_network_isolation(config: LaunchConfig, engine: str) -> None:
    """LaunchError when ``config`` asks for private network namespaces, which only the local engine makes."""
    config.network.refuse_namespaces(
        "the local engine",
        f"Network namespaces are a local-engine feature; drop `{{option}}` with the {engine} engine.",
    )


def cluster_of(config: LaunchConfig, addresses: Mapping[str, str]) -> ClusterSpec:
    """The cluster of ``config``'s tasks at ``addresses`` (task name -> 'host:port'), in task order."""
    jobs: dict[str, list[str]] = {}
    for task in config.task_names():
        jobs.setdefault(task.split(":")[0], []).append(addresses[task])
    return ClusterSpec(jobs={job: dict(enumerate(found)) for job, found in jobs.items()})


def placed_service(address: str | None, engine: str) -> str:
    """The data-service address ``engine`` placed with the tasks; LaunchError when none was (see reserve_address)."""
    if address is None:
        raise invalid(
            LaunchError,
            "data service",
            None,
            f"a data-service task placed by {engine}.place",
            "Set data_service_workers in the LaunchConfig before placing.",
        )
    return address


class Engine(abc.ABC):
    """Places and runs tasks; see the module docstring for what an engine must not do."""

    name: ClassVar[str]
    isolates_network: ClassVar[bool] = False  # whether it can run ``isolate_network`` configs

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

    def readdress(self, address: str) -> str:
        """Where a task placed at ``address`` starts again after its group stopped (an elastic regroup).

        ``address`` while its port can be bound; else a new free port on the same host. Default: asked in
        this machine's network, other machines' addresses kept as they are (their engine picked them).
        """
        return _ports.readdress(address, _ports.HOST)

    def cut_link(self, task: str, cut: bool) -> str:
        """Cuts the link of the simulated host ``task`` runs on (``partitions``), or mends it (``cut`` False);
        returns that host's address. Only engines with simulated hosts can.

        Raises:
          LaunchFailure: This engine has no simulated hosts, or the link could not be changed.
        """
        raise LaunchFailure(f"The {self.name} engine has no simulated hosts: no link to cut.", field="partitions")

    def shape_link(self, task: str, rate: str | None) -> str:
        """Shapes the link of the simulated host ``task`` runs on to ``rate`` (``slow_links``); None: to its own
        rate again. Returns that host's address. Only engines with simulated hosts can.

        Raises:
          LaunchFailure: This engine has no simulated hosts, or the link could not be changed.
        """
        raise LaunchFailure(f"The {self.name} engine has no simulated hosts: no link to slow.", field="slow_links")

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to do by default.
        """Frees the engine's resources after the run; idempotent."""
