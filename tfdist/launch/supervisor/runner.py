"""Runs a whole cluster as local processes and supervises it to the end.

Example:
    >>> import sys
    >>> from tfdist import launch
    >>> result = launch.run([sys.executable, "-c", "import sys; sys.stdout.write('ok')"], workers=2, timeout=60)
    >>> result.exit_code, result.task("worker:1").output.strip()
    (0, 'ok')
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import IO, Any, Optional, Union

from tfdist.cluster.spec import ClusterSpec, split_task_name
from tfdist.errors import LaunchError, LaunchFailure, check_keywords, invalid
from tfdist.cluster import elastic as _boundaries
from tfdist.launch import environment
from tfdist.launch.supervisor import _netns
from tfdist.launch import output as _tf_logs
from tfdist.launch.supervisor import membership as elastic
from tfdist.launch.supervisor._elastic import ElasticSupervision
from tfdist.launch.config import KillAt, LaunchConfig, LoseAt, ReturnAt
from tfdist.launch.engines.base import Engine, LineSink, LocalEngine, TaskProcess
from tfdist.launch.engines.registry import engine_for
from tfdist.launch.results import LaunchResult, TaskResult

__all__ = ["run", "run_config", "EXPOSURE_WARNING"]

_log = logging.getLogger("tfdist.launch")
StatusSink = Callable[[str], None]
DATA_SERVICE_TASK = "data-service:0"
EXPOSURE_WARNING = ("TensorFlow's gRPC servers listen on every interface (*:PORT) whatever host the cluster "
                    "names, without authentication (tensorflow#11689); use --isolate-network to keep a local "
                    "cluster unreachable from outside.")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_TIMEOUT_CODE, _KEEP_LINES = 124, 20000
_KILL_WAIT, _DRAIN_SECONDS = 10.0, 2.0
_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(LaunchConfig))


def _make_log_dir(path: str) -> None:
    """Creates the log directory, or raises LaunchError saying why it cannot be one."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".tfdist-write-test-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path.
        reason = getattr(err, "strerror", None) or str(err)
        raise invalid(LaunchError, "--log-dir", path, "a directory tfdist-launch can create and write",
                      f"It cannot be used: {reason}. Pick another path.") from None


class _Task:
    """The supervisor's record of one task across its attempts."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Optional[str]) -> None:
        self.name, self.argv = name, tuple(argv)
        self.proc: Optional[TaskProcess] = None
        self.restarts = 0
        self.ended_at: Optional[float] = None  # when the current attempt exited (monotonic), set by its waiter
        self.waiter: Optional[threading.Thread] = None
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self.log: Optional[IO[str]] = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def poll(self) -> Optional[int]:
        return self.proc.poll() if self.proc is not None else None

    def watch_exit(self) -> None:
        """Stamps the exit of the current attempt as it happens (a daemon thread that lives as long as it)."""
        proc, self.ended_at = self.proc, None

        def _stamp() -> None:
            if proc is not None and proc.wait(None) is not None and self.proc is proc:
                self.ended_at = time.monotonic()

        self.waiter = threading.Thread(target=_stamp, name=f"tfdist-exit-{self.name}", daemon=True)
        self.waiter.start()

    def exit_time(self) -> float:
        """When the current attempt (which has exited) ended; failures are handled in this order."""
        if self.waiter is not None:
            self.waiter.join(1.0)  # the process is gone: its waiter stamps at once
        return self.ended_at if self.ended_at is not None else time.monotonic()


class _Supervisor(ElasticSupervision):
    """The rules every engine shares: start order, fail-fast, restart groups, fault injection, stopping."""

    def __init__(self, config: LaunchConfig, engine: Engine, spec: ClusterSpec, sink: Optional[LineSink],
                 status: StatusSink, base_env: Mapping[str, str]) -> None:
        self.config, self.engine, self.spec, self.status = config, engine, spec, status
        self.full_spec = spec  # every task's address; self.spec is the current generation's cluster
        self.base_env = dict(base_env)
        self.restarts_used = 0
        self.stop_signal: Optional[int] = None
        # TensorFlow's INFO records and start-up noise stay in the log files, out of the console: every task
        # (servers, the user's command, the data service) imports TF. TF_CPP_MIN_LOG_LEVEL=0 shows them.
        tf_info = _tf_logs.wants_tf_info({**base_env, **config.env})
        self._console = sink if tf_info else _tf_logs.quiet_sink(sink)
        self._events = config.kills + config.loses + config.returns
        self._line_kills = [event for event in self._events if event.after is not None]
        self._on_event = {KillAt: self._kill, LoseAt: self._lose, ReturnAt: self._return}
        self.membership = elastic.Membership(generation=0, workers=tuple(
            name for name in config.task_names() if name.startswith("worker:")))
        self.away: list[str] = []       # lost workers
        self.available: list[str] = []  # returned workers waiting for the next epoch boundary
        self.elastic_dir = tempfile.mkdtemp(prefix="tfdist-elastic-") if config.min_workers is not None else None
        self._boundaries_seen: set[str] = set()
        self.unstartable: dict[str, str] = {}
        self._fired: queue.SimpleQueue[tuple[KillAt, str]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        if config.log_dir:
            _make_log_dir(config.log_dir)

        def _log_path(name: str) -> Optional[str]:
            return os.path.join(config.log_dir, name.replace(":", "-") + ".log") if config.log_dir else None

        self.tasks = {name: _Task(name, config.command if config.runs_command(name) else environment.server_argv(),
                                  _log_path(name)) for name in config.task_names()}
        self.finished: dict[str, int] = {}
        self.data_service: Optional[_Task] = None
        if config.data_service_workers:
            address = engine.reserve_address()
            self.base_env["TFDIST_DATA_SERVICE"] = f"grpc://{address}"
            argv = (sys.executable, "-m", "tfdist.launch.tasks.data_service", "--workers", str(config.data_service_workers),
                    "--port", address.rsplit(":", 1)[1])
            self.data_service = _Task(DATA_SERVICE_TASK, argv, _log_path("data-service"))

    def _on_line(self, task: str, line: str) -> None:
        """Every output line of every task: kept, logged, checked against progress triggers, passed on."""
        record = self.data_service if task == DATA_SERVICE_TASK else self.tasks[task]
        assert record is not None
        record.lines.append(line)
        if record.log is not None:
            record.log.write(line + "\n")
            record.log.flush()
        if self._line_kills:
            with self._lock:
                for kill in [k for k in self._line_kills if k.matches(task, line)]:
                    self._line_kills.remove(kill)
                    self._fired.put((kill, task))
        if self._console is not None:
            try:
                self._console(task, line)
            except Exception:  # noqa: BLE001 - a broken sink (closed terminal) must not stall the task's pipe.
                _log.exception("The output callback failed; task output is no longer passed on.")
                self._console = None

    def _launch(self, record: _Task, env: Mapping[str, str]) -> None:
        if record.log is not None:
            record.log.write(f"--- tfdist-launch: {record.name} start #{record.restarts}\n")
        record.proc = self.engine.start(record.name, record.argv, env, self._on_line)
        record.watch_exit()
        self.finished.pop(record.name, None)

    def _start(self, task: str) -> None:
        record = self.tasks[task]
        tf_task = self.membership.tf_task(task) if self.config.mode == "collective" else task
        env = environment.child_env(self.base_env, self.config, self.spec, tf_task, record.restarts)
        env[environment.TASK_VAR] = task  # the launcher's stable name; TF_CONFIG holds this generation's index
        env.update(elastic.membership_variables(self.membership, self.full_spec))
        if self.elastic_dir is not None:
            env[_boundaries.ELASTIC_DIR_VAR] = self.elastic_dir
        try:
            self._launch(record, env)
        except LaunchFailure as err:
            if not self._elastic_worker(task):
                raise
            self._start_failed(record, str(err))  # a loss of that worker, not the end of the run
            return
        role = "command" if self.config.runs_command(task) else "TF server"
        task_type, index = split_task_name(tf_task)
        self.status(f"{task} started ({role}, pid {record.proc.pid if record.proc else None}, "
                    f"{self.spec.jobs[task_type][index]})")

    def _in_group(self, task: str) -> bool:
        """Whether ``task`` trains in the current generation (workers that are away or waiting to join do not)."""
        task_type = split_task_name(task)[0]
        return task_type != "evaluator" and (task_type != "worker" or task in self.membership.workers)

    def _restart_group(self, task: str) -> list[str]:
        task_type = split_task_name(task)[0]
        if task_type == "evaluator":
            return [task]
        if self.config.mode == "parameter_server" and task_type == "worker":
            return [task]  # The coordinator reschedules its closures.
        # A lost ps loses variables; collectives cannot continue with a new peer: restart the training group.
        return [t for t in self.tasks if self._in_group(t)]

    def _restart(self, task: str, code: int) -> None:
        self.restarts_used += 1
        group = self._restart_group(task)
        delay = min(2.0 ** (self.restarts_used - 1), 10.0)
        self.status(f"{task} exited with {code}; restart {self.restarts_used}/{self.config.max_restarts} "
                    f"of {', '.join(group)} in {delay:.0f}s")
        self.stop([self.tasks[name] for name in group])
        time.sleep(delay)
        for name in sorted(group, key=lambda n: self.config.runs_command(n)):  # servers first
            self.tasks[name].restarts += 1
            self._start(name)

    def _inject_faults(self, pending: list[KillAt], elapsed: float) -> Optional[tuple[int, str, Optional[str]]]:
        """Fires due fault injections (--kill, --lose, --return); an outcome when the run must end."""
        fired = []
        while pending and elapsed >= (pending[0].seconds or 0.0):
            event = pending.pop(0)
            fired.append((event, f"at {elapsed:.1f}s"))
        while not self._fired.empty():
            event, source = self._fired.get()
            fired.append((event, f"after {source} printed /{event.after}/ ({elapsed:.1f}s)"))
        for event, when in fired:
            outcome = self._on_event[type(event)](event.task, when)
            if outcome is not None:
                return outcome
        return None

    def _kill(self, task: str, when: str) -> None:
        self.status(f"fault injection: SIGKILL {task} {when}")
        self._signal(task, signal.SIGKILL)

    def _signal(self, task: str, sig: int) -> None:
        proc = self.tasks[task].proc
        if proc is not None:
            proc.signal(sig)

    def run(self, deadline: Optional[float], t0: float) -> tuple[int, str, Optional[str]]:
        pending = sorted((k for k in self._events if k.seconds is not None), key=lambda k: k.seconds or 0.0)
        if self.data_service is not None:
            self._launch(self.data_service, dict(self.base_env))
            self.status(f"tf.data service started ({self.base_env['TFDIST_DATA_SERVICE']}, "
                        f"{self.config.data_service_workers} worker(s))")
        for task in sorted(self.tasks, key=lambda n: self.config.runs_command(n)):
            self._start(task)
        cmd_tasks = [t for t in self.tasks if self.config.runs_command(t)]
        while True:
            if self.stop_signal is not None:
                return 128 + self.stop_signal, "interrupted", None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.status(f"timeout after {self.config.timeout:g}s; stopping every task")
                return _TIMEOUT_CODE, "timeout", None
            outcome = self._inject_faults(pending, now - t0)
            if outcome is not None:
                return outcome
            self._check_boundaries()
            self._check_returns()
            # In exit order, not task order: when a collective member crashes, its peers fail of the collective
            # error just after it, and one pass may see them all; the first to fail is the one restarted or lost.
            exited = [(task, record, code) for task, record in self.tasks.items()
                      if (code := record.poll()) is not None and task not in self.finished and task not in self.away]
            if any(code != 0 and self.engine.deciding(task) for task, _, code in exited):
                time.sleep(0.05)  # the engine cannot tell yet whether a node left: keep the exit order, decide later
                continue
            for task, record, code in sorted(exited, key=lambda item: item[1].exit_time()):
                self.finished[task] = code
                runs_cmd = self.config.runs_command(task)
                if code == 0 and runs_cmd:
                    self.status(f"{task} finished")
                    continue
                # A task whose place is gone (its Ray node left) cannot restart there: no restart is spent on it.
                unstartable = self.unstartable.pop(task, None)
                node_left = code != 0 and unstartable is None and self.engine.lost(task)
                gone = node_left or unstartable is not None
                if code != 0 and self.restarts_used < self.config.max_restarts and not gone:
                    self._restart(task, code)
                    break
                if code != 0 and self._elastic_worker(task):
                    also = [w for w in self.membership.workers if w != task and self.engine.lost(w)] if node_left else []
                    why = (f"(it could not start: {unstartable})" if unstartable is not None else
                           "(its node left the cluster)" if node_left else f"(exit code {code}, restarts used up)")
                    outcome = self._lose(task, why, also)
                    if outcome is not None:
                        return outcome
                    break
                if code != 0 and (runs_cmd or task.startswith("ps")):
                    self.status(f"{task} failed with exit code {code}" + ("; its node left the cluster" if node_left else ""))
                    return code, "failed", task
                self.status(f"{task} (TF server) exited with {code}; the coordinator works on without it")
            if all(self.finished.get(t) == 0 for t in cmd_tasks if t not in self.away and t not in self.available):
                return 0, "ok", None
            time.sleep(0.05)

    def stop(self, records: Sequence[_Task], grace: Optional[float] = None) -> None:
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
        self.stop(list(self.tasks.values())[::-1] + ([self.data_service] if self.data_service else []))
        for record in list(self.tasks.values()) + ([self.data_service] if self.data_service else []):
            if record.log is not None:
                record.log.close()
        if self.elastic_dir is not None:
            shutil.rmtree(self.elastic_dir, ignore_errors=True)


class _StopSignals:
    """While active (main thread only): SIGINT, SIGTERM, SIGHUP and SIGQUIT ask the run to stop."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.listeners: list[Callable[[int], None]] = []
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.signum = signum
        for listener in self.listeners:
            listener(signum)

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_config(config: LaunchConfig, *, on_line: Optional[LineSink] = None,
               on_status: Optional[StatusSink] = None, base_env: Optional[Mapping[str, str]] = None,
               engine: Optional[Engine] = None) -> LaunchResult:
    """Runs ``config`` to the end; nothing is left running when it returns.

    SIGINT, SIGTERM, SIGHUP and SIGQUIT (when called from the main thread)
    stop every task (SIGTERM, then SIGKILL after ``config.grace_seconds``) and
    end the run with code 128 + the signal number.

    Args:
      config: What to run.
      on_line: Called with (task, line) for every output line, live, except TensorFlow's INFO records and
        start-up noise (``tfdist/launch/output.py``; ``TF_CPP_MIN_LOG_LEVEL=0`` passes them too). The
        result and the ``log_dir`` files keep every line.
      on_status: Called with one-line status messages; default logs them.
      base_env: Environment each child starts from; default ``os.environ``.
      engine: Where the tasks run; default a :class:`~tfdist.launch.engines.base.LocalEngine`.
    """
    config.check_command()
    if config.log_dir:
        _make_log_dir(config.log_dir)  # Before anything is printed or started.
    status = on_status or (lambda message: _log.info("%s", message))
    base_env = dict(os.environ if base_env is None else base_env)
    if config.isolate_network and engine is not None and not isinstance(engine, LocalEngine):
        raise invalid(LaunchError, "isolate_network", True, f"the local engine (not {type(engine).__name__})",
                      "A private network namespace exists on this machine only; drop --isolate-network.")
    with _StopSignals() as signals:
        if config.isolate_network:
            return _netns.run_isolated(config, on_line=on_line, on_status=status, base_env=base_env,
                                       stop=signals)
        engine = engine or LocalEngine()
        try:
            return _supervise(config, engine, on_line, status, base_env, signals)
        finally:
            engine.close()


def _supervise(config: LaunchConfig, engine: Engine, on_line: Optional[LineSink], status: StatusSink,
               base_env: Mapping[str, str], signals: _StopSignals) -> LaunchResult:
    spec = engine.place(config)
    status(EXPOSURE_WARNING)
    supervisor = _Supervisor(config, engine, spec, on_line, status, base_env)
    signals.listeners.append(lambda signum: setattr(supervisor, "stop_signal", signum))
    if signals.signum is not None:
        supervisor.stop_signal = signals.signum
    t0 = time.monotonic()
    deadline = t0 + config.timeout if config.timeout else None
    try:
        code, reason, failed = supervisor.run(deadline, t0)
    finally:
        supervisor.stop_all()
    tasks = tuple(TaskResult(task=name, exit_code=record.poll(), restarts=record.restarts,
                             runs_command=config.runs_command(name), output="\n".join(record.lines),
                             pid=record.proc.pid if record.proc else None)
                  for name, record in supervisor.tasks.items())
    result = LaunchResult(exit_code=code, reason=reason, failed_task=failed, tasks=tasks, cluster=spec)
    status(result.summary().splitlines()[0] + f" in {time.monotonic() - t0:.1f}s")
    return result


def run(command: Sequence[str], *, workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False,
        on_line: Optional[LineSink] = None, on_status: Optional[StatusSink] = None,
        base_env: Optional[Mapping[str, str]] = None, engine: Union[str, Engine, None] = None,
        **options: Any) -> LaunchResult:
    """Runs ``command`` on a cluster; see :class:`LaunchConfig` for ``options``.

    ``engine`` is where the tasks run: an :class:`~tfdist.launch.engines.base.Engine`, a registered name
    ('local', 'ray'), or None for the local engine.

    Returns:
      A :class:`LaunchResult` with every task's exit code, restarts and output.

    Raises:
      LaunchError: The configuration is invalid; nothing was started.
      LaunchFailure: The cluster could not be started here (no free ports, no network namespace).
    """
    check_keywords(LaunchError, "options", options, _OPTION_NAMES - {"command", "workers", "ps", "chief", "evaluator"},
                   "See tfdist.launch.LaunchConfig for the options.")
    config = LaunchConfig(command=command, workers=workers, ps=ps, chief=chief, evaluator=evaluator, **options)
    if not (engine is None or isinstance(engine, (str, Engine))):
        raise invalid(LaunchError, "engine", engine, "None, an engine name such as 'local' or 'ray', or an Engine")
    chosen = engine_for(engine) if isinstance(engine, str) else engine
    return run_config(config, on_line=on_line, on_status=on_status, base_env=base_env, engine=chosen)
