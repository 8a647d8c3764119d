"""The Spark engine: every task runs in one task of a Spark barrier stage, its program a subprocess there.

Spark's barrier mode gang-schedules the stage (all tasks start together, or none); each task picks its TF
port on its executor's host and phones the driver, which keeps the ports distinct and builds the cluster
from the reported addresses (see :mod:`tfdist.launch.engines.spark._task` for why not ``allGather``). The supervisor in
:mod:`tfdist.launch.supervisor.runner` keeps every rule (restarts, fail-fast, fault injection, timeouts,
environment), as with the other engines: a restarted program starts again in its barrier task, at the same
address. If Spark relaunches the whole stage (an executor was lost), the new tasks phone again and keep
their addresses where their host is the same.

Without ``master`` the run uses the process's active SparkSession (a notebook's), else starts a local one
(``local[N]``); with ``'spark://host:port'``, ``'yarn'`` or ``'local[N]'`` it starts a session on that
master and stops it afterwards. See docs/spark.md.

Example:
    >>> options = SparkOptions(master="spark://127.0.0.1:7077", conf={"spark.task.cpus": "2"})
    >>> options.master, dict(options.conf)
    ('spark://127.0.0.1:7077', {'spark.task.cpus': '2'})
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist._names import describe_choices
from tfdist._options import option
from tfdist.cluster.address import is_loopback
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import EngineError, LaunchError, LaunchFailure, invalid, require_number
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines.base import (
    Engine,
    LineSink,
    TaskProcess,
    cluster_of,
    placed_service,
    refuse_network_isolation,
)
from tfdist.launch.engines.spark import _boot, _session
from tfdist.launch.engines.spark._link import Channel, Desk, Phoned, SparkTaskProcess

__all__ = ["SparkEngine", "SparkOptions"]

_log = logging.getLogger("tfdist.launch.spark")
DATA_SERVICE_TASK = "data-service:0"
_MAX_READY_TIMEOUT = 86400.0
_STAGE_END = 30.0  # seconds for the barrier stage to end after the tasks were told to quit


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparkOptions:
    """Where and how a run uses Spark.

    Args:
      master: None: the active SparkSession of this process, else a local one
        (``local[N]``, N = the number of tasks). A master URL
        ('spark://host:port', 'yarn', 'local[4]'): a session on it, started
        for the run and stopped afterwards.
      conf: Spark settings for a session tfdist starts, e.g.
        ``{"spark.task.cpus": "2"}`` (each TF task then holds 2 cores).
      python: The Python the executors run, for a session tfdist starts.
        Default: PYSPARK_PYTHON, else this interpreter. It must have tfdist.
      ready_timeout: Seconds to wait for free task slots and for every task
        to report its address.
    """

    master: str | None = option(
        None,
        help="start a Spark session on this master (spark://host:port, yarn, local[N]) and stop it afterwards; "
        "default: a local[N] session",
        metavar="URL",
    )
    conf: Mapping[str, str] = option(
        default_factory=lambda: types.MappingProxyType({}),
        help="a Spark setting of that session, e.g. spark.executor.memory=8g",
        metavar="KEY=VALUE",
    )
    python: str | None = option(
        None,
        help="the Python the Spark executors run (it must have tfdist); default $PYSPARK_PYTHON, else this one",
        metavar="PATH",
    )
    ready_timeout: float = option(
        120.0, help="seconds to wait for free Spark task slots and for every task's address", metavar="SECONDS"
    )

    def __post_init__(self) -> None:
        if self.master is not None and (not isinstance(self.master, str) or not self.master.strip()):
            raise invalid(LaunchError, "master", self.master, "a Spark master URL such as 'spark://host:7077'")
        if not isinstance(self.conf, Mapping) or not all(
            isinstance(k, str) and k.startswith("spark.") and isinstance(v, str) for k, v in self.conf.items()
        ):
            raise invalid(
                LaunchError, "conf", self.conf, "a mapping of Spark settings to strings, e.g. {'spark.task.cpus': '2'}"
            )
        object.__setattr__(self, "conf", types.MappingProxyType(dict(self.conf)))
        if self.python is not None and (not isinstance(self.python, str) or not self.python.strip()):
            raise invalid(LaunchError, "python", self.python, "the path of the executors' Python interpreter")
        require_number(LaunchError, "ready_timeout", self.ready_timeout, above=0, maximum=_MAX_READY_TIMEOUT)


class SparkEngine(Engine):
    """Runs every task as a subprocess of one task of a Spark barrier stage.

    Args:
      spark: A SparkSession to run on (a notebook's); default: see ``master``.
      **options: The fields of :class:`SparkOptions`.
    """

    name = "spark"

    def __init__(self, spark: Any = None, **options: Any) -> None:
        self.options = SparkOptions(**options)
        if spark is not None and self.options.master is not None:
            raise invalid(LaunchError, "master", self.options.master, "None when `spark` is given")
        _session.import_pyspark()  # Raises EngineError with the install command, before anything starts.
        self._spark, self._owns_session = spark, False
        self._desk: Desk | None = None
        self._stage: threading.Thread | None = None
        self._stage_error: list[BaseException] = []
        self._stage_failed = threading.Event()
        self._group = ""
        self._index: dict[str, int] = {}
        self._addresses: dict[str, str] = {}
        self._spare_address: str | None = None
        self._grace = 5.0

    # -- placing -------------------------------------------------------------------------------------------

    def place(self, config: LaunchConfig) -> ClusterSpec:
        refuse_network_isolation(config, "Spark")
        if config.min_workers is not None:
            raise invalid(
                LaunchError,
                "min_workers",
                config.min_workers,
                "None with the Spark engine",
                "A Spark barrier stage has a fixed number of tasks: run elastic jobs on the local or Ray engine, "
                "or on Slurm with requeue.",
            )
        self._grace = config.grace_seconds
        tasks = config.task_names() + ([DATA_SERVICE_TASK] if config.data_service_workers else [])
        try:
            addresses = self._launch(tasks)
        except BaseException:
            self.close()
            raise
        self._spare_address = addresses.pop(DATA_SERVICE_TASK, None)
        _log.info("Spark placed %d tasks: %s", len(tasks), ", ".join(f"{t}@{a}" for t, a in addresses.items()))
        return cluster_of(config, addresses)

    def _launch(self, tasks: list[str]) -> dict[str, str]:
        options = self.options
        if self._spark is None:
            self._spark, self._owns_session = _session.session(options.master, options.conf, options.python, len(tasks))
        spark = self._spark
        _session.check_dynamic_allocation(spark)
        _session.wait_for_slots(spark, len(tasks), options.ready_timeout)
        host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
        desk = self._desk = Desk(host)
        self._index = {task: index for index, task in enumerate(tasks)}
        self._group = f"tfdist-{os.getpid()}-{id(self)}"
        self._stage = threading.Thread(target=self._run_stage, args=(tasks,), name="tfdist-spark-stage", daemon=True)
        self._stage.start()
        if not desk.wait(len(tasks), options.ready_timeout, self._stage_failed):
            raise EngineError(
                f"The Spark barrier stage's {len(tasks)} tasks did not all report within {options.ready_timeout:g}s "
                f"({len(desk.tasks)} did; {_stage_state(spark)}). Is the cluster busy? Raise `ready_timeout` or "
                "free task slots.",
                field="ready_timeout",
                value=options.ready_timeout,
            )
        if desk.missing:
            self._refuse_missing(desk.missing[0])
        if self._stage_failed.is_set() and len(desk.tasks) < len(tasks):
            raise EngineError(f"The Spark barrier stage failed before every task reported: {self._stage_reason()}")
        found = {task: desk.current(index).address for task, index in self._index.items()}
        self._addresses = dict(found)
        return found

    def _refuse_missing(self, phoned: Phoned) -> None:
        raise EngineError(
            f"tfdist is not importable by the Python the Spark executors run ({phoned.python} on "
            f"{phoned.host}: {phoned.missing}). Install tfdist into that Python, or start the session with one "
            "that has it: set `python`, or PYSPARK_PYTHON in the driver's environment before the session starts.",
            field="python",
            value=phoned.python,
        )

    def _run_stage(self, tasks: list[str]) -> None:
        desk = self._desk
        assert desk is not None and self._spark is not None
        context = self._spark.sparkContext
        try:
            from pyspark import cloudpickle

            # By value: an executor without tfdist can then still say so (see _boot).
            cloudpickle.register_pickle_by_value(_boot)
            context.setJobGroup(self._group, f"tfdist: {len(tasks)} TF tasks", interruptOnCancel=True)
            boot = functools.partial(_boot.boot, driver=desk.address, authkey=desk.authkey, tasks=tasks)
            stage = context.parallelize(range(len(tasks)), len(tasks)).barrier().mapPartitionsWithIndex(boot)
            # The shuffle makes the barrier stage a shuffle-map stage: Spark relaunches such a stage whole when a
            # task of it fails (an executor lost), while a failed barrier *result* stage aborts the job.
            stage.repartition(1).collect()
        except BaseException as err:
            self._stage_error.append(err)
        finally:
            self._stage_failed.set()

    def _stage_reason(self) -> str:
        if not self._stage_error:
            return "it ended"
        lines = [line.strip() for line in str(self._stage_error[0]).splitlines() if line.strip()]
        useful = [line for line in lines if "Error" in line or "Exception" in line] or lines or ["?"]
        return useful[0][:500]

    def reserve_address(self) -> str:
        return placed_service(self._spare_address, "SparkEngine")

    # -- running -------------------------------------------------------------------------------------------

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        if task not in self._index or self._desk is None:
            raise invalid(LaunchError, "task", task, describe_choices(task, self._index))
        phoned = self._phoned(task)
        if phoned.address != self._addresses[task]:
            raise LaunchFailure(
                f"{task} cannot start again: Spark relaunched its barrier task on {phoned.address}, and the "
                f"cluster names {self._addresses[task]}. Run the job again (the backup resumes it)."
            )
        control = phoned.control
        try:
            pid = Channel(control, self._desk.authkey).call("start", list(argv), dict(env), os.getcwd())
        except (OSError, EOFError, TimeoutError) as err:
            raise LaunchFailure(f"Could not start {task} in its Spark task ({control}): {err!r}") from None
        # A local pid is good for reports and leak checks only when the task runs on this machine.
        return SparkTaskProcess(task, control, self._desk.authkey, on_line, pid, is_loopback(phoned.host))

    def _phoned(self, task: str) -> Phoned:
        """The task's barrier task now; after a relaunched stage, waits for the new one to report."""
        desk, index = self._desk, self._index[task]
        assert desk is not None
        deadline = time.monotonic() + self.options.ready_timeout
        while True:
            phoned = desk.current(index)
            if not phoned.lifeline.closed and not _gone(phoned):
                return phoned
            if time.monotonic() > deadline or (self._stage_failed.is_set() and not self._stage.is_alive()):  # type: ignore[union-attr]
                raise LaunchFailure(
                    f"{task} cannot start: its Spark barrier task is gone"
                    + (f" (the stage failed: {self._stage_reason()})" if self._stage_failed.is_set() else "")
                    + ". Spark relaunches a barrier stage only up to spark.stage.maxConsecutiveAttempts times."
                )
            time.sleep(0.2)

    def close(self) -> None:
        desk, self._desk = self._desk, None
        if desk is not None:
            desk.quit(self._grace)
        stage, self._stage = self._stage, None
        spark = self._spark
        if stage is not None and spark is not None:
            stage.join(_STAGE_END + self._grace)
            if stage.is_alive():
                _log.info("The Spark barrier stage did not end; cancelling its job group %s.", self._group)
                try:
                    spark.sparkContext.cancelJobGroup(self._group)
                except Exception as err:
                    _log.debug("cancelJobGroup: %s", err)
                stage.join(_STAGE_END)
        if self._owns_session and spark is not None:
            self._owns_session = False
            self._spark = None
            spark.stop()


def _gone(phoned: Phoned) -> bool:
    """Whether a task's lifeline broke (the task never writes to it after reporting, so readable = closed)."""
    try:
        return bool(phoned.lifeline.poll(0))
    except (OSError, EOFError):
        return True


def _stage_state(spark: Any) -> str:
    """What Spark says of its active stages (for a stage that does not start): ids and running tasks."""
    try:
        tracker = spark.sparkContext.statusTracker()
        stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
        described = [f"stage {s.stageId}: {s.numActiveTasks} of {s.numTasks} tasks running" for s in stages if s]
        return "Spark's active stages: " + ("; ".join(described) or "none")
    except Exception as err:  # only a diagnostic
        return f"Spark's stages unknown ({err})"
