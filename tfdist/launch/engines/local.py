"""The local engine: every task is a process on this machine, optionally in a private network namespace.

Example:
    >>> import sys
    >>> from tfdist.launch import LaunchConfig, LocalEngine
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

import logging
from collections.abc import Mapping, Sequence

from tfdist.cluster import address as _address
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import LaunchFailure
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines import _ports
from tfdist.launch.engines._netns import Namespace
from tfdist.launch.engines._process import LocalProcess
from tfdist.launch.engines._reaper import Reaper
from tfdist.launch.engines.base import Engine, TaskProcess
from tfdist.launch.output import LineSink

__all__ = ["LocalEngine"]

_log = logging.getLogger("tfdist.launch")
_PLACE_TRIES = 10


class LocalEngine(Engine):
    """Every task is a process on this machine, in a process group of its own.

    A reaper process (in its own session) stops every task group if the launcher dies, even by SIGKILL.

    With ``isolate_network`` (see :meth:`place`) every task, the tf.data service included, runs in one private
    network namespace that has only loopback (:mod:`tfdist.launch.engines._netns`): the tasks reach each other
    there, and nothing outside reaches them. The launcher stays outside; the engine picks ports and checks
    them inside the namespace.
    """

    name = "local"
    isolates_network = True

    def __init__(self) -> None:
        self._host = "127.0.0.1"
        self._reaper: Reaper | None = None
        self._grace = 5.0
        self._namespace: Namespace | None = None

    @property
    def _network(self) -> _ports.Ports:
        """Where the tasks' ports are: the private namespace's, or this machine's."""
        return self._namespace if self._namespace is not None else _ports.HOST

    def place(self, config: LaunchConfig) -> ClusterSpec:
        """Every task on a free port of ``config.host``; with ``config.isolate_network``, first a private
        network namespace (LaunchFailure when this machine cannot make one)."""
        self._host, self._grace = config.host, config.grace_seconds
        if config.isolate_network and self._namespace is None:
            self._namespace = Namespace()
        counts = config.task_counts()
        for _ in range(_PLACE_TRIES):
            ports = iter(self._network.pick(sum(counts.values()), config.host))
            spec = ClusterSpec(
                jobs={
                    job: {i: _address.join_address(config.host, next(ports)) for i in range(count)}
                    for job, count in counts.items()
                }
            )
            taken = [t.address for t in spec.tasks() if not self._network.is_free(*_address.split_address(t.address))]
            if not taken:
                return spec
            _log.info("Ports %s were taken before start; picking again.", taken)
        raise LaunchFailure(
            f"Could not find free ports for the cluster after {_PLACE_TRIES} tries; is the machine out of ports?"
        )

    def reserve_address(self) -> str:
        return _address.join_address(self._host, self._network.pick(1, self._host)[0])

    def readdress(self, address: str) -> str:
        return _ports.readdress(address, self._network)

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        if self._reaper is None:
            self._reaper = Reaper(grace=self._grace)
        reaper = self._reaper
        if self._namespace is not None:
            argv = self._namespace.enter(argv)
        proc = LocalProcess(task, argv, env=env, on_line=on_line, on_exit=reaper.forget)
        if proc.pid is not None:
            reaper.watch(proc.pid)
        return proc

    def close(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.close()
        namespace, self._namespace = self._namespace, None
        if namespace is not None:
            namespace.close()
