"""Runs a whole cluster as local processes and supervises it to the end.

Example:
    >>> import sys
    >>> from tfdist import launch
    >>> result = launch.run([sys.executable, "-c", "import sys; sys.stdout.write('ok')"], workers=2, timeout=60)
    >>> result.exit_code, result.task("worker:1").output.strip()
    (0, 'ok')
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, Optional

from tfdist import _address
from tfdist.cluster import ClusterSpec
from tfdist.errors import LaunchError, LaunchFailure, check_keywords, invalid
from tfdist.launch import _netns, _tf_logs, environment
from tfdist.launch._process import Child, LineSink
from tfdist.launch.config import KillAt, LaunchConfig
from tfdist.launch.results import LaunchResult, TaskResult

__all__ = ["run", "run_config", "EXPOSURE_WARNING"]

_log = logging.getLogger("tfdist.launch")
StatusSink = Callable[[str], None]
DATA_SERVICE_TASK = "data-service:0"
EXPOSURE_WARNING = ("TensorFlow's gRPC servers listen on every interface (*:PORT) whatever host the cluster "
                    "names, without authentication (tensorflow#11689); use --isolate-network to keep a local "
                    "cluster unreachable from outside.")
_TIMEOUT_CODE = 124
_OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(LaunchConfig))


def _pick_cluster(config: LaunchConfig) -> ClusterSpec:
    """A local cluster whose ports are all free on every interface right now."""
    for _ in range(10):
        spec = ClusterSpec.local(workers=config.workers, ps=config.ps, chief=config.chief,
                                 evaluator=config.evaluator, host=config.host)
        taken = [t.address for t in spec.tasks() if not _address.port_is_free(*_address.split_address(t.address))]
        if not taken:
            return spec
        _log.info("Ports %s were taken before start; picking again.", taken)
    raise LaunchFailure("Could not find free ports for the cluster after 10 tries; is the machine out of ports?")


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


class _Supervisor:
    def __init__(self, config: LaunchConfig, spec: ClusterSpec, sink: Optional[LineSink],
                 status: StatusSink, base_env: Mapping[str, str]) -> None:
        self.config, self.spec, self.status = config, spec, status
        self.base_env = base_env
        self.restarts_used = 0
        self.stop_signal: Optional[int] = None
        self.children: dict[str, Child] = {}
        self._user_sink = sink
        self._line_kills = [kill for kill in config.kills if kill.after is not None]
        self._fired: "queue.SimpleQueue[tuple[KillAt, str]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        sink = self._on_line
        if config.log_dir:
            _make_log_dir(config.log_dir)
        # TF servers are tfdist's own tasks: their INFO chatter stays in the log files, out of the console.
        server_sink = sink if _tf_logs.wants_tf_info(base_env) else _tf_logs.quiet_sink(sink)
        for task in config.task_names():
            runs_command = config.runs_command(task)
            argv = config.command if runs_command else environment.server_argv()
            log_path = os.path.join(config.log_dir, task.replace(":", "-") + ".log") if config.log_dir else None
            self.children[task] = Child(task, argv, env=None, sink=sink if runs_command else server_sink,
                                        log_path=log_path)
        self.finished: dict[str, int] = {}
        self.data_service: Optional[Child] = None
        if config.data_service_workers:
            port = _address.free_ports(1, config.host)[0]
            self.base_env = dict(base_env, TFDIST_DATA_SERVICE=f"grpc://{config.host}:{port}")
            argv = (sys.executable, "-m", "tfdist.cli.data_service", "--workers", str(config.data_service_workers),
                    "--port", str(port))
            log_path = os.path.join(config.log_dir, "data-service.log") if config.log_dir else None
            self.data_service = Child(DATA_SERVICE_TASK, argv, env=dict(self.base_env), sink=sink, log_path=log_path)

    def _on_line(self, task: str, line: str) -> None:
        """Every output line of every task: fires progress triggers, then goes to the caller's sink."""
        if self._line_kills:
            with self._lock:
                for kill in [k for k in self._line_kills if k.matches(task, line)]:
                    self._line_kills.remove(kill)
                    self._fired.put((kill, task))
        if self._user_sink is not None:
            self._user_sink(task, line)

    def _start(self, task: str) -> None:
        child = self.children[task]
        child.start(environment.child_env(self.base_env, self.config, self.spec, task, child.restarts))
        role = "command" if self.config.runs_command(task) else "TF server"
        self.status(f"{task} started ({role}, pid {child.pid}, {self.spec.jobs[task.split(':')[0]][int(task.split(':')[1])]})")
        self.finished.pop(task, None)

    def _restart_group(self, task: str) -> list[str]:
        task_type = task.split(":")[0]
        if task_type == "evaluator":
            return [task]
        if self.config.mode == "parameter_server":
            if task_type == "worker":
                return [task]  # The coordinator reschedules its closures.
            return [t for t in self.children if not t.startswith("evaluator")]
        # Collectives cannot continue with a new peer: restart the whole training group.
        return [t for t in self.children if not t.startswith("evaluator")]

    def _restart(self, task: str, code: int) -> None:
        self.restarts_used += 1
        group = self._restart_group(task)
        delay = min(2.0 ** (self.restarts_used - 1), 10.0)
        self.status(f"{task} exited with {code}; restart {self.restarts_used}/{self.config.max_restarts} "
                    f"of {', '.join(group)} in {delay:.0f}s")
        for name in group:
            self.children[name].stop(self.config.grace_seconds)
        time.sleep(delay)
        for name in sorted(group, key=lambda n: self.config.runs_command(n)):  # servers first
            self.children[name].restarts += 1
            self._start(name)

    def run(self, deadline: Optional[float], t0: float) -> tuple[int, str, Optional[str]]:
        pending_kills = sorted((k for k in self.config.kills if k.seconds is not None), key=lambda k: k.seconds or 0)
        if self.data_service is not None:
            self.data_service.start()
            self.status(f"tf.data service started (pid {self.data_service.pid}, "
                        f"{self.base_env['TFDIST_DATA_SERVICE']}, {self.config.data_service_workers} worker(s))")
        for task in sorted(self.children, key=lambda n: self.config.runs_command(n)):
            self._start(task)
        while True:
            if self.stop_signal is not None:
                return 128 + self.stop_signal, "interrupted", None
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self.status(f"timeout after {self.config.timeout:g}s; stopping every task")
                return _TIMEOUT_CODE, "timeout", None
            while pending_kills and now - t0 >= pending_kills[0].seconds:
                kill = pending_kills.pop(0)
                self.status(f"fault injection: SIGKILL {kill.task} at {now - t0:.1f}s")
                self.children[kill.task].signal(signal.SIGKILL)
            while not self._fired.empty():
                kill, source = self._fired.get()
                self.status(f"fault injection: SIGKILL {kill.task} after {source} printed /{kill.after}/ "
                            f"({now - t0:.1f}s)")
                self.children[kill.task].signal(signal.SIGKILL)
            for task, child in self.children.items():
                code = child.poll()
                if code is None or task in self.finished:
                    continue
                child.wait(5)
                self.finished[task] = code
                runs_cmd = self.config.runs_command(task)
                if code == 0 and runs_cmd:
                    self.status(f"{task} finished")
                    continue
                if code != 0 and self.restarts_used < self.config.max_restarts:
                    self._restart(task, code)
                    break
                if code != 0 and (runs_cmd or task.startswith("ps")):
                    self.status(f"{task} failed with exit code {code}")
                    return code, "failed", task
                self.status(f"{task} (TF server) exited with {code}; the coordinator works on without it")
            cmd_tasks = [t for t in self.children if self.config.runs_command(t)]
            if all(self.finished.get(t) == 0 for t in cmd_tasks):
                return 0, "ok", None
            time.sleep(0.1)

    def stop_all(self) -> None:
        everyone = list(self.children.values()) + ([self.data_service] if self.data_service else [])
        for child in reversed(everyone):
            child.signal(signal.SIGTERM)
        for child in reversed(everyone):
            child.stop(self.config.grace_seconds)


def run_config(config: LaunchConfig, *, on_line: Optional[LineSink] = None,
               on_status: Optional[StatusSink] = None, base_env: Optional[Mapping[str, str]] = None) -> LaunchResult:
    """Runs ``config`` to the end; nothing is left running when it returns.

    Args:
      config: What to run.
      on_line: Called with (task, line) for every output line, live.
      on_status: Called with one-line status messages; default logs them.
      base_env: Environment each child starts from; default ``os.environ``.
    """
    config.check_command()
    status = on_status or (lambda message: _log.info("%s", message))
    base_env = dict(os.environ if base_env is None else base_env)
    if config.isolate_network:
        return _netns.run_isolated(config, on_line=on_line, on_status=status, base_env=base_env)
    spec = _pick_cluster(config)
    status(EXPOSURE_WARNING)
    supervisor = _Supervisor(config, spec, on_line, status, base_env)
    previous: dict[int, Any] = {}

    def _on_signal(signum: int, frame: Optional[FrameType]) -> None:
        supervisor.stop_signal = signum

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)
    t0 = time.monotonic()
    deadline = t0 + config.timeout if config.timeout else None
    try:
        code, reason, failed = supervisor.run(deadline, t0)
    finally:
        supervisor.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    tasks = tuple(TaskResult(task, child.poll(), child.restarts, config.runs_command(task), "\n".join(child.lines),
                             child.pid) for task, child in supervisor.children.items())
    result = LaunchResult(code, reason, failed, tasks, spec)
    status(result.summary().splitlines()[0] + f" in {time.monotonic() - t0:.1f}s")
    return result


def run(command: Sequence[str], *, workers: int, ps: int = 0, chief: bool = False, evaluator: bool = False,
        on_line: Optional[LineSink] = None, on_status: Optional[StatusSink] = None,
        base_env: Optional[Mapping[str, str]] = None, **options: Any) -> LaunchResult:
    """Runs ``command`` on a local cluster; see :class:`LaunchConfig` for ``options``.

    Returns:
      A :class:`LaunchResult` with every task's exit code, restarts and output.

    Raises:
      LaunchError: The configuration is invalid; nothing was started.
      LaunchFailure: The cluster could not be started here (no free ports, no network namespace).
    """
    check_keywords(LaunchError, "options", options, _OPTION_NAMES - {"command", "workers", "ps", "chief", "evaluator"},
                   "See tfdist.launch.LaunchConfig for the options.")
    config = LaunchConfig(command=command, workers=workers, ps=ps, chief=chief, evaluator=evaluator, **options)
    return run_config(config, on_line=on_line, on_status=on_status, base_env=base_env)
