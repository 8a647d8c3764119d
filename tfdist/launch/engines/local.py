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
from tfdist.launch.engines import _forkserver, _ports
from tfdist.launch.engines._forkserver import ForkedProcess, ForkServers
from tfdist.launch.engines._hosts import Hosts
from tfdist.launch.engines._netns import Namespace
from tfdist.launch.engines._process import LocalProcess
from tfdist.launch.engines._reaper import Reaper
from tfdist.launch.engines.base import Engine, TaskProcess, cluster_of
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

    With ``simulate_hosts`` every task runs on its simulated host (:mod:`tfdist.launch.engines._hosts`), at
    that host's address; the tf.data service on the first host. A host's link can be cut and shaped while
    the run goes on (:meth:`cut_link`, :meth:`shape_link`: the network faults).

    With ``preload`` (see :meth:`place`) the tasks that run this Python on a module, code or a script are
    forked from a fork server that has imported TensorFlow (:mod:`tfdist.launch.engines._forkserver`), except
    in network namespaces.
    """

    name = "local"
    isolates_network = True

    def __init__(self) -> None:
        self._host = "127.0.0.1"
        self._reaper: Reaper | None = None
        self._grace = 5.0
        self._namespace: Namespace | None = None
        self._hosts: Hosts | None = None
        self._task_hosts: dict[str, str] = {}  # task -> its simulated host's address
        self._forks: ForkServers | None = None

    def _network(self, host: str) -> _ports.Ports:
        """Where the ports of ``host`` are: its simulated host's, the private namespace's, or this machine's."""
        if self._hosts is not None and host in self._hosts.addresses:
            return self._hosts.at(host)
        return self._namespace if self._namespace is not None else _ports.HOST

    def place(self, config: LaunchConfig) -> ClusterSpec:
        """Every task on a free port of ``config.host``, or of its simulated host; with ``config.isolate_network``,
        first a private network namespace, with ``config.simulate_hosts`` the hosts (LaunchFailure when this
        machine cannot make them); with ``config.preload`` tasks start through fork servers."""
        self._host, self._grace = config.host, config.grace_seconds
        if config.preload and self._forks is None:
            self._forks = _forkserver.shared() or ForkServers()  # Kept between runs inside sharing().
        tasks = config.task_names()
        if config.simulate_hosts:
            if self._hosts is None:
                self._hosts = Hosts(config.network.hosts(tasks))
            addresses = self._hosts.addresses
            self._task_hosts = {task: addresses[config.network.host_of(task, tasks)] for task in tasks}
            self._host = addresses[0]  # side services (the tf.data service) run on the first host
        elif config.isolate_network and self._namespace is None:
            self._namespace = Namespace()
        hosts = [self._task_hosts.get(task, config.host) for task in tasks]
        for _ in range(_PLACE_TRIES):
            ports = {host: iter(self._network(host).pick(hosts.count(host), host)) for host in dict.fromkeys(hosts)}
            spec = cluster_of(config, {t: _address.join_address(h, next(ports[h])) for t, h in zip(tasks, hosts)})
            where = [_address.split_address(t.address) for t in spec.tasks()]
            taken = [_address.join_address(h, p) for h, p in where if not self._network(h).is_free(h, p)]
            if not taken:
                return spec
            _log.info("Ports %s were taken before start; picking again.", taken)
        raise LaunchFailure(
            f"Could not find free ports for the cluster after {_PLACE_TRIES} tries; is the machine out of ports?"
        )

    def reserve_address(self) -> str:
        return _address.join_address(self._host, self._network(self._host).pick(1, self._host)[0])

    def readdress(self, address: str) -> str:
        return _ports.readdress(address, self._network(_address.split_address(address)[0]))

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        if self._reaper is None:
            self._reaper = Reaper(grace=self._grace)
        reaper = self._reaper
        network = self._network(self._task_hosts.get(task, self._host))
        proc: LocalProcess | ForkedProcess | None = None
        if isinstance(network, Namespace):  # a simulated host, or the private namespace
            argv = network.enter(argv)
        elif self._forks is not None:
            proc = self._forks.start(task, argv, env, on_line, reaper.forget)
        if proc is None:
            proc = LocalProcess(task, argv, env=env, on_line=on_line, on_exit=reaper.forget)
        reaper.watch(proc.pid)
        return proc

    def _simulated_host(self, task: str) -> tuple[Hosts, str]:
        if self._hosts is None or task not in self._task_hosts:
            raise LaunchFailure(f"{task} runs on no simulated host (`simulate_hosts`): no link to change.")
        return self._hosts, self._task_hosts[task]

    def cut_link(self, task: str, cut: bool) -> str:
        hosts, address = self._simulated_host(task)
        hosts.cut(address, cut)
        return address

    def shape_link(self, task: str, rate: str | None) -> str:
        hosts, address = self._simulated_host(task)
        hosts.shape(address, rate)
        return address

    def close(self) -> None:
        forks, self._forks = self._forks, None
        if forks is not None and forks is not _forkserver.shared():
            forks.close()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.close()
        namespace, self._namespace = self._namespace, None
        if namespace is not None:
            namespace.close()
        hosts, self._hosts = self._hosts, None
        if hosts is not None:
            hosts.close()
