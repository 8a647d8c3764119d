"""The supervisor of one launch: starts the tasks on an engine, follows their exits and applies the rules.

Its whole state is one :class:`~tfdist.launch.supervisor._group.Group`, changed only here; the elastic rules
(:mod:`~tfdist.launch.supervisor._elastic`), the fault injections (:mod:`~tfdist.launch.supervisor._faults`)
and the stall inspector (:mod:`~tfdist.launch.supervisor._stall`) answer it with values; the faults that last
are applied by :mod:`~tfdist.launch.supervisor._impair`.
:mod:`tfdist.launch.supervisor.runner` builds it and runs it to the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

from tfdist.cluster import elastic as cluster_elastic
from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.errors import LaunchFailure
from tfdist.launch import environment
from tfdist.launch import output as _tf_logs
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import Engine, LineSink
from tfdist.launch.events import FaultEvent, KillAt, LoseAt, PartitionAt, ReturnAt, SlowLink, Straggler
from tfdist.launch.supervisor import membership
from tfdist.launch.supervisor._elastic import ElasticRules, Regroup
from tfdist.launch.supervisor._faults import FaultInjector, Fired
from tfdist.launch.supervisor._group import KILLED, Ending, Group, NotStarted, TaskRecord
from tfdist.launch.supervisor._impair import Ends, Impairments
from tfdist.launch.supervisor._stall import StallInspector
from tfdist.launch.tasks.programs import TaskProgram
from tfdist.runtime import exit_codes

_log = logging.getLogger("tfdist.launch")
StatusSink = Callable[[str], None]
DATA_SERVICE_TASK = "data-service:0"
_KILL_WAIT, _DRAIN_SECONDS, _PASS_SECONDS = 10.0, 2.0, 0.05


def _restart_delay(restart: int) -> float:
    """Seconds before restart number ``restart`` (1-based): the first at once (its tasks are reaped, their ports
    free), then 1, 2, 4... s, at most 10, so that a task that fails at start-up does not spin.

    >>> [_restart_delay(n) for n in (1, 2, 3, 4, 6)]
    [0.0, 1.0, 2.0, 4.0, 10.0]
    """
    return 0.0 if restart <= 1 else min(2.0 ** (restart - 2), 10.0)


class Supervisor:
    """The rules every engine shares: start order, fail-fast, restart groups, fault injection, elastic
    membership, stopping. It owns the run's :class:`Group` and is the only one to change it."""

    def __init__(
        self,
        config: LaunchConfig,
        engine: Engine,
        spec: ClusterSpec,
        sink: LineSink | None,
        status: StatusSink,
        base_env: Mapping[str, str],
    ) -> None:
        self.config, self.engine, self.status = config, engine, status
        self.base_env = dict(base_env)
        self.tf_keras = environment.tasks_have_tf_keras(config, base_env)  # TF_USE_LEGACY_KERAS=1 only with it.
        # TensorFlow's INFO records and start-up noise stay in the log files, out of the console: every task
        # (servers, the user's command, the data service) imports TF. TF_CPP_MIN_LOG_LEVEL=0 shows them.
        tf_info = _tf_logs.wants_tf_info({**base_env, **config.env})
        self._console = sink if tf_info else _tf_logs.quiet_sink(sink)
        events = config.faults.events() + config.loses + config.returns
        self.faults = FaultInjector(events, snapshot=self._boundaries_on_disk)
        self.rules = ElasticRules(config)
        self.impairments = Impairments(config, engine, status, lambda task: self.group.tasks[task].proc)
        self.stall = (
            None if config.stall_seconds is None else StallInspector(config.stall_seconds, config.log_dir, status)
        )
        self._on_event: dict[type[FaultEvent], Callable[[Fired], Ending | None]] = {
            KillAt: lambda fired: self._kill(fired.event.task, fired.when),
            LoseAt: lambda fired: self._lose(fired.event.task, fired.when),
            ReturnAt: lambda fired: self._return(fired.event.task, fired.when, recorded=fired.seen),
            **dict.fromkeys((Straggler, PartitionAt, SlowLink), self._impair),
            Ends: self._end_impairment,
        }

        def _log_path(name: str) -> str | None:
            return os.path.join(config.log_dir, name.replace(":", "-") + ".log") if config.log_dir else None

        tasks = {
            name: TaskRecord(
                name, config.command if config.runs_command(name) else environment.server_argv(), _log_path(name)
            )
            for name in config.task_names()
        }
        data_service = None
        if config.data_service_workers:
            address = engine.reserve_address()
            self.base_env["TFDIST_DATA_SERVICE"] = f"grpc://{address}"
            host, port = address.rsplit(":", 1)  # the workers report this host (a simulated host's own)
            argv = TaskProgram.DATA_SERVICE.argv(
                "--workers", str(config.data_service_workers), "--host", host, "--port", port
            )
            data_service = TaskRecord(DATA_SERVICE_TASK, argv, _log_path("data-service"))
        workers = tuple(name for name in config.task_names() if name.startswith("worker:"))
        self.group = Group(
            config=config,
            tasks=tasks,
            data_service=data_service,
            spec=spec,
            membership=membership.Membership(generation=0, workers=workers),
            elastic_dir=tempfile.mkdtemp(prefix="tfdist-elastic-") if config.min_workers is not None else None,
        )

    def request_stop(self, signum: int) -> None:
        """A stop signal arrived (from a signal handler): the run ends at its next pass."""
        self.group.stop_signal = signum

    def _on_line(self, task: str, line: str) -> None:
        """Every output line of every task: kept, logged, checked against progress triggers, passed on."""
        record = self.group.data_service if task == DATA_SERVICE_TASK else self.group.tasks[task]
        assert record is not None
        record.lines.append(line)
        if record.log is not None:
            record.log.write(line + "\n")
            record.log.flush()
        self.faults.on_line(task, line)
        if self._console is not None:
            try:
                self._console(task, line)
            except Exception:
                _log.exception("The output callback failed; task output is no longer passed on.")
                self._console = None

    # ---- starting and stopping --------------------------------------------------------------------------------

    def _launch(self, record: TaskRecord, env: Mapping[str, str]) -> None:
        if record.log is not None:
            record.log.write(f"--- tfdist-launch: {record.name} start #{record.restarts}\n")
        record.proc = self.engine.start(record.name, record.argv, env, self._on_line)
        record.watch_exit()
        self.group.finished.pop(record.name, None)

    def _start(self, task: str) -> None:
        group, record = self.group, self.group.tasks[task]
        tf_task = group.membership.tf_task(task) if self.config.mode == "collective" else task
        env = environment.child_env(
            self.base_env, self.config, group.spec, tf_task, record.restarts, tf_keras=self.tf_keras
        )
        env[environment.TASK_VAR] = task  # the launcher's stable name; TF_CONFIG holds this generation's index
        env.update(membership.membership_variables(group.membership, group.full_spec))
        if group.elastic_dir is not None:
            env[cluster_elastic.ELASTIC_DIR_VAR] = group.elastic_dir
        if self.stall is not None:
            env.update(self.stall.variables(task, record.restarts))
        try:
            self._launch(record, env)
        except LaunchFailure as err:
            if not group.elastic_worker(task):
                raise
            self._start_failed(record, str(err))  # a loss of that worker, not the end of the run
            return
        role = "command" if self.config.runs_command(task) else "TF server"
        task_type, index = split_task_name(tf_task)
        self.status(
            f"{task} started ({role}, pid {record.proc.pid if record.proc else None}, "
            f"{group.spec.jobs[task_type][index]})"
        )

    def _start_failed(self, record: TaskRecord, reason: str) -> None:
        """An elastic worker the engine could not start (its Ray node left): it counts as exited, then lost."""
        self.status(f"elastic: {record.name} could not start ({reason}); it is lost")
        record.proc = NotStarted()
        record.watch_exit()
        self.group.finished.pop(record.name, None)
        self.group.unstartable[record.name] = reason

    def _restart(self, task: str, code: int) -> None:
        group = self.group
        group.restarts_used += 1
        names = group.restart_group(task)
        delay = _restart_delay(group.restarts_used)
        self.status(
            f"{task} exited with {code}; restart {group.restarts_used}/{self.config.max_restarts} "
            f"of {', '.join(names)} in {delay:.0f}s"
        )
        self.stop([group.tasks[name] for name in names])
        time.sleep(delay)
        for name in group.servers_first(names):
            group.tasks[name].restarts += 1
            self._start(name)

    def stop(self, records: Sequence[TaskRecord], grace: float | None = None) -> None:
        """SIGTERM to all, one shared grace deadline, SIGKILL to the rest, then reap and read the last output."""
        procs = [r.proc for r in records if r.proc is not None]
        for proc in procs:
            proc.signal(signal.SIGTERM if grace != 0 else signal.SIGKILL)
        deadline = time.monotonic() + (self.config.grace_seconds if grace is None else grace)
        for proc in procs:
            proc.wait(max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.poll() is None:
                proc.signal(signal.SIGKILL)
        for proc in procs:
            if proc.wait(_KILL_WAIT) is None:
                _log.warning("pid %s did not die %.0fs after SIGKILL (uninterruptible I/O?)", proc.pid, _KILL_WAIT)
        drain = time.monotonic() + _DRAIN_SECONDS
        for proc in procs:
            proc.release(max(0.0, drain - time.monotonic()))

    def stop_all(self) -> None:
        self.impairments.close()  # stragglers run again, so that the SIGTERM lands
        group = self.group
        self.stop(list(group.tasks.values())[::-1] + ([group.data_service] if group.data_service else []))
        for record in group.records():
            if record.log is not None:
                record.log.close()
        if group.elastic_dir is not None:
            shutil.rmtree(group.elastic_dir, ignore_errors=True)
        if self.stall is not None:
            self.stall.close()

    # ---- fault injection --------------------------------------------------------------------------------------

    def _inject_faults(self, elapsed: float) -> Ending | None:
        """Fires due fault injections (--kill, --lose, --return); the ending when the run must end."""
        for fired in self.faults.due(elapsed):
            ending = self._on_event[type(fired.event)](fired)
            if ending is not None:
                return ending
        return None

    def _impair(self, fired: Fired) -> Ending | None:
        """A fault that lasts begins (a straggler, a cut or slow link); its end is injected in turn.

        TensorFlow's parameter-server coordinator sets no deadline on a worker's RPCs: it never learns that a
        worker was cut off, and its fit may wait for it even after the link is back. So an elastic
        parameter-server run loses a cut worker at once (as a preempted one) and it returns with its link.
        """
        assert isinstance(fired.event, (Straggler, PartitionAt, SlowLink))
        end = self.impairments.start(fired.event, fired.when, fired.at)
        if end is not None:
            self.faults.add(end)
        if isinstance(fired.event, PartitionAt) and self.config.mode == "parameter_server" and self.group.elastic_dir:
            cut = [t for t in self.impairments.on_host_of(fired.event.task) if t in self.group.membership.workers]
            if cut:
                return self._lose(cut[0], "(its link is cut: the coordinator cannot reach it)", cut[1:])
        return None

    def _end_impairment(self, fired: Fired) -> None:
        """A fault that lasts ends; a worker lost because its link was cut returns with its link."""
        assert isinstance(fired.event, Ends)
        if self.impairments.end(fired.event, fired.when) and isinstance(fired.event.of, PartitionAt):
            for task in self.impairments.on_host_of(fired.event.task):
                if task in self.group.away:
                    self._return(task, f"(its link is back {fired.when})")

    def _kill(self, task: str, when: str) -> None:
        self.status(f"fault injection: SIGKILL {task} {when}")
        proc = self.group.tasks[task].proc
        if proc is not None:
            proc.signal(signal.SIGKILL)

    # ---- the stall inspector ----------------------------------------------------------------------------------

    def _check_stall(self, now: float) -> Ending | None:
        """With ``stall_seconds``: a stall is reported, then ends the run or (elastic) loses the stopped workers."""
        group = self.group
        if self.stall is None:
            return None
        running = {  # the training tasks at work, each with its process group
            name: record.proc.pid
            for name, record in group.tasks.items()
            if group.membership.trains(name) and record.proc is not None and record.proc.pid and record.poll() is None
        }
        cut = {task: "its link is cut" for task in self.impairments.cut_off()}
        stall = self.stall.check(now, running, evidence=cut)
        if stall is None:
            return None
        self.stall.report(stall, running)
        stuck = stall.stopped
        if stuck and all(group.elastic_worker(task) for task in stuck):
            return self._lose(stuck[0], f"(stalled: {stall.why(stuck[0])})", also=stuck[1:])
        self.status(f"stall: stopping the run ({', '.join(stuck) + ' stopped' if stuck else 'every task waits'})")
        return Ending.stalled(stuck[0] if stuck else None)

    # ---- elastic membership: the rules decide, the supervisor applies -------------------------------------------

    def _lose(self, task: str, why: str, also: Sequence[str] = ()) -> Ending | None:
        """``task`` (a worker) leaves, with the workers in ``also`` (the same node): killed, kept away; the
        group goes on without them or the run fails."""
        group = self.group
        if task not in group.membership.workers or group.tasks[task].poll() == 0:
            self.status(f"elastic: {task} is not in the group or has finished; nothing to lose")
            return None
        leaving = self.rules.leaving(task, also, group.membership)
        self.status(f"elastic: losing {', '.join(leaving)} {why}")
        for name in leaving:
            record = group.tasks[name]
            if record.proc is not None:
                self.stop([record], grace=0)  # SIGKILL, reap, and read its last output
                code = record.poll()
                group.finished[name] = code if code is not None else KILLED
            group.away.append(name)
        left = self.rules.remaining(group.membership, leaving)
        if not self.rules.enough(left):
            self.status(
                f"elastic: lost {', '.join(group.away)}; {len(left)} worker(s) left, below --min-workers "
                f"{self.rules.minimum}; stopping the run"
            )
            return Ending.failed(exit_codes.TOO_FEW_WORKERS, task)  # its own code: the lost worker's may be 0 or 137
        self._apply(self.rules.regroup(group.membership, left, group.full_spec, f"{', '.join(leaving)} lost"))
        return None

    def _boundaries_on_disk(self) -> frozenset[str]:
        """The epoch boundaries recorded so far (called from a reader thread when a trigger line fires)."""
        directory = self.group.elastic_dir
        return cluster_elastic.recorded(directory) if directory is not None else frozenset()

    def _return(self, task: str, why: str, recorded: frozenset[str] | None = None) -> None:
        """``task`` is back; it joins at the first boundary recorded after ``recorded`` (the boundaries on disk
        when its trigger fired; None: those on disk now)."""
        group = self.group
        if task not in group.away:
            self.status(f"elastic: {task} returned {why}, but it was not away; ignored")
            return
        self._check_boundaries(only=recorded)  # boundaries recorded before the return do not count for it
        group.away.remove(task)
        group.available.append(task)
        if self.rules.rejoins_at_once:
            self.status(f"elastic: {task} is available again {why}; it rejoins now")
            self._grow("the coordinator reconnects")
        elif self._leader_records_boundaries():
            self.status(f"elastic: {task} is available again {why}; it joins at the next epoch boundary")
        else:
            group.unannounced = True
            self.status(
                f"elastic: {task} is available again {why}; it joins at the next epoch boundary the training "
                f"leader records, but no leader has said it records them (tfdist.keras."
                f"ElasticEpochs() in fit's callbacks does, as fit begins): until it does, {task} waits"
            )

    def _leader_records_boundaries(self) -> bool:
        group = self.group
        return group.elastic_dir is not None and cluster_elastic.announced(group.elastic_dir)

    def _grow(self, why: str) -> None:
        group = self.group
        joining = self.rules.joining(group.membership, group.available)
        if joining:
            workers = group.membership.workers + joining
            self._apply(
                self.rules.regroup(
                    group.membership, workers, group.full_spec, f"{', '.join(joining)} joined; {why}", joined=joining
                )
            )

    def _apply(self, change: Regroup) -> None:
        """Makes ``change`` the current generation: stops what it stops, draws the cluster again, starts."""
        group = self.group
        group.membership = change.membership
        group.available = [t for t in group.available if t not in change.joined]
        self.status(change.message)
        if change.stop:
            self.stop([group.tasks[name] for name in change.stop], grace=0)
        if change.new_spec:  # after the stop: the old attempts' ports are free again
            group.spec = group.membership.spec(group.full_spec, readdress=self.engine.readdress)
        for name in change.start:
            group.tasks[name].restarts += 1
            self._start(name)

    def _check_returns(self) -> None:
        """Lost workers whose place the engine has again (a Ray node joined): returns, as with ``--return``."""
        group = self.group
        for task, address in self.engine.returned().items():
            if task not in group.away:
                continue
            full = self.rules.placed_again(group.full_spec, task, address)
            if full is None:
                job, index = split_task_name(task)
                self.status(
                    f"elastic: {task} was placed again at {address}, but the coordinator only knows "
                    f"{group.full_spec.jobs[job][index]}; it stays away"
                )
                continue
            group.full_spec = full
            self._return(task, f"(the engine placed it again, at {address})")

    def _check_boundaries(self, only: frozenset[str] | None = None) -> None:
        """Epoch boundaries the training leader recorded (``only`` those of these names); a returned worker joins
        at the first new one."""
        group = self.group
        if group.elastic_dir is None:
            return
        if group.unannounced and group.available and self._leader_records_boundaries():
            group.unannounced = False
            self.status(
                f"elastic: the training leader records epoch boundaries now; {', '.join(group.available)} "
                "joins at the next"
            )
        for record in cluster_elastic.read_boundaries(group.elastic_dir, group.boundaries_seen, only=only):
            if record.get("generation") != group.membership.generation:
                continue
            self.status(
                f"elastic: epoch {record.get('epoch')} backed up (membership {record.get('generation')}, "
                f"world size {record.get('world_size')})"
            )
            if group.available and record.get("last"):
                self.status("elastic: that was the last epoch of the fit; nobody joins after it")
            elif group.available:
                self._grow(f"epoch {record.get('epoch')} backed up")
                return

    # ---- the run ------------------------------------------------------------------------------------------------

    def run(self, deadline: float | None, t0: float) -> Ending:
        group = self.group
        if group.data_service is not None:
            self._launch(group.data_service, dict(self.base_env))
            self.status(
                f"tf.data service started ({self.base_env['TFDIST_DATA_SERVICE']}, "
                f"{self.config.data_service_workers} worker(s))"
            )
        for task in group.servers_first(list(group.tasks)):
            self._start(task)
        cmd_tasks = [t for t in group.tasks if self.config.ends_run(t)]
        while True:
            if group.stop_signal is not None:
                return Ending.interrupted(group.stop_signal)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.status(f"timeout after {self.config.timeout:g}s; stopping every task")
                return Ending.timeout()
            ending = self._inject_faults(now - t0) or self._check_stall(now)
            if ending is not None:
                return ending
            self._check_boundaries()
            self._check_returns()
            # In exit order, not task order: when a collective member crashes, its peers fail of the collective
            # error just after it, and one pass may see them all; the first to fail is the one restarted or lost.
            exited = [
                (task, record, code)
                for task, record in group.tasks.items()
                if (code := record.poll()) is not None and task not in group.finished and task not in group.away
            ]
            if any(code != 0 and self.engine.deciding(task) for task, _, code in exited):
                time.sleep(_PASS_SECONDS)  # the engine cannot tell yet whether a node left: keep the order
                continue
            ending = self._handle_exits(sorted(exited, key=lambda item: item[1].exit_time()))
            if ending is not None:
                return ending
            if all(group.finished.get(t) == 0 for t in cmd_tasks if t not in group.away and t not in group.available):
                serving = [t for t in group.tasks if self.config.runs_command(t) and t not in group.finished]
                if serving:
                    self.status(f"the coordinator is done; stopping {', '.join(serving)}, which serve until stopped")
                return Ending.ok()
            time.sleep(_PASS_SECONDS)

    def _handle_exits(self, exited: Sequence[tuple[str, TaskRecord, int]]) -> Ending | None:
        """Handles the exits of one pass, first to end first, until one restarts or regroups the others."""
        group = self.group
        for task, _, code in exited:
            group.finished[task] = code
            runs_cmd = self.config.runs_command(task)
            if code == 0 and runs_cmd:
                self.status(f"{task} finished")
                continue
            # A collective regroup restarts the peer that failed of an unreachable worker; that worker leaves.
            regroups = group.elastic_dir is not None and self.config.mode == "collective"
            workers = group.membership.workers if regroups else ()
            cut = self.impairments.blame(task, code, elastic_workers=workers) if code != 0 else ()
            if cut:
                return self._lose(cut[0], f"(its link is cut; {task} exited with {code})", cut[1:])
            # A task whose place is gone (its Ray node left) cannot restart there: no restart is spent on it.
            unstartable = group.unstartable.pop(task, None)
            node_left = code != 0 and unstartable is None and self.engine.lost(task)
            gone = node_left or unstartable is not None
            if code != 0 and group.restarts_used < self.config.max_restarts and not gone:
                self._restart(task, code)
                return None  # the rest of this pass were attempts the restart replaced
            if code != 0 and group.elastic_worker(task):
                also = [w for w in group.membership.workers if w != task and self.engine.lost(w)] if node_left else []
                why = (
                    f"(it could not start: {unstartable})"
                    if unstartable is not None
                    else "(its node left the cluster)"
                    if node_left
                    else f"(exit code {code}, restarts used up)"
                )
                return self._lose(task, why, also)
            if code != 0 and (runs_cmd or task.startswith("ps")):
                self.status(
                    f"{task} failed with exit code {code}" + ("; its node left the cluster" if node_left else "")
                )
                return Ending.failed(code, task)
            self.status(f"{task} (TF server) exited with {code}; the coordinator works on without it")
        return None
