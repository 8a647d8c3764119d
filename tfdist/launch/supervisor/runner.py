"""Runs a whole cluster on an engine and supervises it to the end, the same way for every engine.

The supervisor keeps its whole state in one :class:`~tfdist.launch.supervisor._group.Group` and changes it
in one place; it asks two collaborators, which answer with values: the elastic rules
(:mod:`tfdist.launch.supervisor._elastic`) and the fault injections (:mod:`tfdist.launch.supervisor._faults`).
A run ends with an :class:`~tfdist.launch.results.Outcome` in its :class:`~tfdist.launch.results.LaunchResult`.

Example:
    >>> import sys
    >>> from tfdist import launch
    >>> result = launch.run([sys.executable, "-c", "import sys; sys.stdout.write('ok')"], workers=2, timeout=60)
    >>> result.exit_code, result.task("worker:1").output.strip()
    (0, 'ok')
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

from tfdist.errors import LaunchError, check_keywords, invalid
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import Engine, LineSink
from tfdist.launch.engines.local import LocalEngine
from tfdist.launch.engines.registry import engine_for
from tfdist.launch.network import describe_hosts
from tfdist.launch.results import LaunchResult, TaskResult
from tfdist.launch.supervisor._supervisor import StatusSink, Supervisor

__all__ = ["run", "run_config"]

_log = logging.getLogger("tfdist.launch")
EXPOSURE_WARNING = (
    "TensorFlow's gRPC servers listen on every interface (*:PORT) whatever host the cluster "
    "names, without authentication (tensorflow#11689); use --isolate-network to keep a local "
    "cluster unreachable from outside."
)
ISOLATED = "network namespace: private, loopback only; task ports are unreachable from outside"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_OPTION_NAMES = frozenset(LaunchConfig.option_names())


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
        raise invalid(
            LaunchError,
            "log_dir",
            path,
            "a directory tfdist-launch can create and write",
            f"It cannot be used: {reason}. Pick another path.",
        ) from None


class _StopSignals:
    """While active (main thread only): SIGINT, SIGTERM, SIGHUP and SIGQUIT ask the run to stop."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.listeners: list[Callable[[int], None]] = []
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        for listener in self.listeners:
            listener(signum)

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_config(
    config: LaunchConfig,
    *,
    on_line: LineSink | None = None,
    on_status: StatusSink | None = None,
    base_env: Mapping[str, str] | None = None,
    engine: Engine | None = None,
) -> LaunchResult:
    """Runs ``config`` to the end; nothing is left running when it returns.

    SIGINT, SIGTERM, SIGHUP and SIGQUIT (when called from the main thread)
    stop every task (SIGTERM, then SIGKILL after ``config.grace_seconds``) and
    end the run with code 128 + the signal number (``Outcome.INTERRUPTED``).

    With ``config.isolate_network`` the engine (the local one) runs every task in a private network
    namespace that has only loopback; this supervisor stays in the host's network, where no task port can
    be reached (:mod:`tfdist.launch.engines._netns`). With ``config.simulate_hosts`` it runs them on
    simulated hosts, private as well (:mod:`tfdist.launch.engines._hosts`).

    Args:
      config: What to run.
      on_line: Called with (task, line) for every output line, live, except TensorFlow's INFO records and
        start-up noise (``tfdist/launch/output.py``; ``TF_CPP_MIN_LOG_LEVEL=0`` passes them too). The
        result and the ``log_dir`` files keep every line.
      on_status: Called with one-line status messages; default logs them.
      base_env: Environment each child starts from; default ``os.environ``.
      engine: Where the tasks run; default a :class:`~tfdist.launch.engines.local.LocalEngine`.
    """
    config.check_command()
    if config.log_dir:
        _make_log_dir(config.log_dir)  # Before anything is printed or started.
    status = on_status or (lambda message: _log.info("%s", message))
    base_env = dict(os.environ if base_env is None else base_env)
    engine = engine or LocalEngine()
    if not engine.isolates_network:
        config.network.refuse_namespaces(
            f"the local engine (not {type(engine).__name__})",
            "A private network namespace exists on this machine only; leave `{option}` off.",
        )
    if config.stall_seconds is not None and not isinstance(engine, LocalEngine):
        raise invalid(
            LaunchError,
            "stall_seconds",
            config.stall_seconds,
            f"None on the {engine.name} engine (the stall inspector reads its tasks' reports from local files)",
            "Drop `stall_seconds`, or run on the local engine.",
        )
    with _StopSignals() as signals:
        try:
            return _supervise(config, engine, on_line, status, base_env, signals)
        finally:
            engine.close()


def _supervise(
    config: LaunchConfig,
    engine: Engine,
    on_line: LineSink | None,
    status: StatusSink,
    base_env: Mapping[str, str],
    signals: _StopSignals,
) -> LaunchResult:
    spec = engine.place(config)  # with isolate_network, the local engine makes the private namespace here
    if config.simulate_hosts:
        status(describe_hosts(config.network, config.task_names()))
    else:
        status(ISOLATED if config.isolate_network else EXPOSURE_WARNING)
    supervisor = Supervisor(config, engine, spec, on_line, status, base_env)
    signals.listeners.append(supervisor.request_stop)
    if signals.signum is not None:
        supervisor.request_stop(signals.signum)
    t0 = time.monotonic()
    deadline = t0 + config.timeout if config.timeout else None
    try:
        ending = supervisor.run(deadline, t0)
    finally:
        supervisor.stop_all()
    tasks = tuple(
        TaskResult(
            task=name,
            exit_code=record.poll(),
            restarts=record.restarts,
            runs_command=config.runs_command(name),
            output="\n".join(record.lines),
            pid=record.proc.pid if record.proc else None,
            lost=name in supervisor.group.away,
        )
        for name, record in supervisor.group.tasks.items()
    )
    result = LaunchResult(
        exit_code=ending.exit_code, reason=ending.outcome, failed_task=ending.failed_task, tasks=tasks, cluster=spec
    )
    status(result.summary().splitlines()[0] + f" in {time.monotonic() - t0:.1f}s")
    return result


def run(
    command: Sequence[str],
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    on_line: LineSink | None = None,
    on_status: StatusSink | None = None,
    base_env: Mapping[str, str] | None = None,
    engine: str | Engine | None = None,
    **options: Any,
) -> LaunchResult:
    """Runs ``command`` on a cluster; see :class:`LaunchConfig` for ``options``.

    ``engine`` is where the tasks run: an :class:`~tfdist.launch.engines.base.Engine`, a registered name
    ('local', 'ray', 'spark': the active SparkSession), or None for the local engine.

    Returns:
      A :class:`LaunchResult` with every task's exit code, restarts and output.

    Raises:
      LaunchError: The configuration is invalid; nothing was started.
      LaunchFailure: The cluster could not be started here (no free ports, no network namespace).
    """
    check_keywords(
        LaunchError,
        "options",
        options,
        _OPTION_NAMES - {"command", "workers", "ps", "chief", "evaluator"},
        "See tfdist.launch.LaunchConfig for the options.",
    )
    config = LaunchConfig(command=command, workers=workers, ps=ps, chief=chief, evaluator=evaluator, **options)
    if not (engine is None or isinstance(engine, (str, Engine))):
        raise invalid(LaunchError, "engine", engine, "None, an engine name such as 'local' or 'ray', or an Engine")
    chosen = engine_for(engine) if isinstance(engine, str) else engine
    return run_config(config, on_line=on_line, on_status=on_status, base_env=base_env, engine=chosen)
