"""The elastic part of the launcher's supervisor: losing, returning and regrouping workers (``--min-workers``).

:class:`ElasticSupervision` is a mixin of :class:`tfdist.launch.supervisor.runner._Supervisor`; it holds the rules of a
membership change and uses the supervisor's records, engine and start/stop methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from tfdist.cluster import elastic as _boundaries
from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.launch.supervisor import membership as elastic
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import Engine

__all__ = ["ElasticSupervision"]

Outcome = tuple[int, str, Optional[str]]
_NOT_STARTED_CODE = 1


class NotStarted:
    """The attempt of a worker whose start failed (its engine could not run it): it has exited at once."""

    pid: Optional[int] = None

    def poll(self) -> Optional[int]:
        return _NOT_STARTED_CODE

    def signal(self, sig: int) -> None:
        pass

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        return _NOT_STARTED_CODE

    def release(self, timeout: float) -> None:
        pass


class ElasticSupervision:
    """Membership changes of an elastic run; mixed into the supervisor, which provides the attributes below."""

    config: LaunchConfig
    status: Callable[[str], None]
    engine: Engine
    spec: ClusterSpec
    full_spec: ClusterSpec
    membership: elastic.Membership
    tasks: Mapping[str, Any]  # name -> the supervisor's task record
    finished: dict[str, int]
    away: list[str]
    available: list[str]
    elastic_dir: Optional[str]
    _boundaries_seen: set[str]
    unstartable: dict[str, str]  # worker -> why its last start failed; the run loop counts it as lost

    if TYPE_CHECKING:
        def stop(self, records: Sequence[Any], grace: Optional[float] = None) -> None: ...
        def _start(self, task: str) -> None: ...
        def _in_group(self, task: str) -> bool: ...

    def _elastic_worker(self, task: str) -> bool:
        return self.elastic_dir is not None and task in self.membership.workers

    def _start_failed(self, record: Any, reason: str) -> None:
        """An elastic worker the engine could not start (its Ray node left): it counts as exited, then lost."""
        self.status(f"elastic: {record.name} could not start ({reason}); it is lost")
        record.proc = NotStarted()
        record.watch_exit()
        self.finished.pop(record.name, None)
        self.unstartable[record.name] = reason

    def _lose(self, task: str, why: str, also: Sequence[str] = ()) -> Optional[Outcome]:
        """``task`` (a worker) leaves, with the workers in ``also`` (the same node): killed, kept away; the
        group goes on without them or the run fails."""
        if task not in self.membership.workers or self.tasks[task].poll() == 0:
            self.status(f"elastic: {task} is not in the group or has finished; nothing to lose")
            return None
        leaving = [task] + [t for t in also if t != task and t in self.membership.workers]
        self.status(f"elastic: losing {', '.join(leaving)} {why}")
        for name in leaving:
            record = self.tasks[name]
            if record.proc is not None:
                self.stop([record], grace=0)  # SIGKILL, reap, and read its last output
                self.finished[name] = record.poll() if record.poll() is not None else 137
            self.away.append(name)
        left = tuple(w for w in self.membership.workers if w not in leaving)
        minimum = self.config.min_workers or 0
        if len(left) < minimum:
            self.status(f"elastic: lost {', '.join(self.away)}; {len(left)} worker(s) left, below --min-workers "
                        f"{minimum}; stopping the run")
            return self.finished.get(task, 1) or 1, "failed", task
        self._regroup(left, f"{', '.join(leaving)} lost")
        return None

    def _return(self, task: str, why: str) -> None:
        if task not in self.away:
            self.status(f"elastic: {task} returned {why}, but it was not away; ignored")
            return
        self._check_boundaries()  # boundaries recorded before the return do not count for it
        self.away.remove(task)
        self.available.append(task)
        if self.config.mode == "parameter_server":
            self.status(f"elastic: {task} is available again {why}; it rejoins now")
            self._grow("the coordinator reconnects")
        else:
            self.status(f"elastic: {task} is available again {why}; it joins at the next epoch boundary")

    def _check_returns(self) -> None:
        """Lost workers whose place the engine has again (a Ray node joined): returns, as with ``--return``."""
        for task, address in self.engine.returned().items():
            if task not in self.away:
                continue
            job, index = split_task_name(task)
            if self.config.mode == "parameter_server" and self.full_spec.jobs[job][index] != address:
                self.status(f"elastic: {task} was placed again at {address}, but the coordinator only knows "
                            f"{self.full_spec.jobs[job][index]}; it stays away")
                continue
            jobs = {name: dict(addresses) for name, addresses in self.full_spec.jobs.items()}
            jobs[job][index] = address
            self.full_spec = ClusterSpec(jobs=jobs)
            self._return(task, f"(the engine placed it again, at {address})")

    def _grow(self, why: str) -> None:
        room = (self.config.max_workers or self.config.workers) - len(self.membership.workers)
        joining, self.available = self.available[:max(room, 0)], self.available[max(room, 0):]
        if joining:
            self._regroup(self.membership.workers + tuple(joining), f"{', '.join(joining)} joined; {why}")

    def _regroup(self, workers: tuple[str, ...], why: str) -> None:
        """A new generation: collectives restart the training group with a new TF_CONFIG; ps runs go on."""
        before = set(self.membership.workers)
        self.membership = elastic.Membership(generation=self.membership.generation + 1, workers=workers)
        size = self.membership.world_size(self.full_spec)
        self.status(f"elastic: membership {self.membership.generation}: world size {size} "
                    f"(workers {', '.join(self.membership.workers)}); {why}")
        if self.config.mode == "parameter_server":
            for name in [w for w in self.membership.workers if w not in before]:
                self.tasks[name].restarts += 1
                self._start(name)
            return
        group = [t for t in self.tasks if self._in_group(t)]
        # SIGKILL, no grace: the backup of the last epoch is written, and TF's preemption handler would
        # catch a SIGTERM and let the old group train on (even to the end of fit, deleting the backup).
        # Every old attempt is released too (exited ones included), so none of their readers outlives it.
        self.stop([self.tasks[t] for t in self.tasks if not t.startswith("evaluator")], grace=0)
        self.spec = self.membership.spec(self.full_spec)
        for name in sorted(group, key=lambda n: self.config.runs_command(n)):  # servers first
            self.tasks[name].restarts += 1
            self._start(name)

    def _check_boundaries(self) -> None:
        """Epoch boundaries the training leader recorded; a returned worker joins at the first new one."""
        if self.elastic_dir is None:
            return
        for record in _boundaries.read_boundaries(self.elastic_dir, self._boundaries_seen):
            if record.get("generation") != self.membership.generation:
                continue
            self.status(f"elastic: epoch {record.get('epoch')} backed up (membership {record.get('generation')}, "
                        f"world size {record.get('world_size')})")
            if self.available:
                self._grow(f"epoch {record.get('epoch')} backed up")
                return
