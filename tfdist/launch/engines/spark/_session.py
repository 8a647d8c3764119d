"""The Spark session a run uses, and what Spark must offer before a barrier stage is submitted.

Barrier mode refuses dynamic allocation, and a barrier stage asking for more tasks than the cluster has slots
does not fail: Spark retries its slot check for minutes (``spark.scheduler.barrier.maxConcurrentTasksCheck.*``)
while the job hangs. tfdist checks both first and says what is needed.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from tfdist.errors import EngineError
from tfdist.runtime.versions import install_hint

_log = logging.getLogger("tfdist.launch.spark")
INSTALL_HINT = f"{install_hint('spark')}: pyspark 4 and a Java 17 or 21 on PATH or in JAVA_HOME"
# Set on a session tfdist starts: if a slot check still fails (slots lost after tfdist counted them), the stage
# fails after a few seconds instead of retrying for minutes.
OWN_CONF = {
    "spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures": "3",
    "spark.scheduler.barrier.maxConcurrentTasksCheck.interval": "2s",
    "spark.ui.showConsoleProgress": "false",  # its progress bar would cut into the tasks' prefixed lines
}
_SETTLE = 3.0  # seconds the slot count must stay the same (with an executor up) to count as final
_BUSY_WAIT = 15.0  # seconds to wait for slots busy with other tasks (a job ending) before failing


def import_pyspark() -> Any:
    """The ``pyspark.sql`` module, or EngineError saying how to install it."""
    try:
        import pyspark.sql
    except ImportError as err:
        raise EngineError(
            f"The Spark engine needs pyspark, which is not installed ({err}). Install it with: {INSTALL_HINT}",
            field="engine",
            value="spark",
            fix=f"Install it: {INSTALL_HINT}",
        ) from None
    return pyspark.sql


def _existing(sql: Any) -> Any:
    """The process's session: the active one of this thread, else the default one, else one around a SparkContext
    the process already has (None when there is no SparkContext).

    ``getActiveSession()`` alone is per thread: called from another thread than the one that made the session,
    it said None, and a session "started" then would have wrapped the running SparkContext and stopped it at
    the end.
    """
    try:
        return sql.SparkSession.active()
    except Exception:  # PySparkRuntimeError NO_ACTIVE_OR_DEFAULT_SESSION
        pass
    from pyspark import SparkContext

    if getattr(SparkContext, "_active_spark_context", None) is not None:  # a SparkContext without a session
        return sql.SparkSession.builder.getOrCreate()
    return None


def session(master: str | None, conf: Mapping[str, str], python: str | None, tasks: int) -> tuple[Any, bool]:
    """(the SparkSession, whether tfdist started it): the process's own without ``master``, else a new one.

    A new session's executors run ``python``, or PYSPARK_PYTHON, or this interpreter.
    """
    sql = import_pyspark()
    active = _existing(sql)
    if active is not None:
        running = active.sparkContext.master
        if master is not None and master != running:
            raise EngineError(
                f"A Spark session on {running!r} is already active in this process, and `master` asks for "
                f"{master!r}. Drop `master` to use the active session, or stop it first (spark.stop()).",
                field="master",
                value=master,
            )
        if python is not None and python != active.sparkContext.pythonExec:
            _log.warning(
                "The active Spark session's executors run %s; `python` (%s) applies only to a session tfdist starts.",
                active.sparkContext.pythonExec,
                python,
            )
        return active, False
    builder = sql.SparkSession.builder.master(master or f"local[{tasks}]").appName("tfdist")
    for key, value in {**OWN_CONF, **conf}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as err:  # py4j and the JVM's start-up raise many kinds
        raise EngineError(
            f"Could not start a Spark session on {master or 'local'!r}: {str(err).splitlines()[0]}. Check the "
            f"master URL, that Java 17 or 21 is installed, and the `conf` settings.",
            field="master",
            value=master,
        ) from None
    spark.sparkContext.pythonExec = python or os.environ.get("PYSPARK_PYTHON") or sys.executable
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


def check_dynamic_allocation(spark: Any) -> None:
    """EngineError when the session allocates executors dynamically, which barrier mode refuses."""
    conf = spark.sparkContext.getConf()
    enabled = conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true"
    if enabled and not spark.sparkContext.master.startswith("local"):
        raise EngineError(
            "The Spark session allocates executors dynamically (spark.dynamicAllocation.enabled=true), which "
            "Spark's barrier mode refuses. Start the session with spark.dynamicAllocation.enabled=false "
            "(on Databricks: a cluster with autoscaling off), or set it to false in `conf` for a session "
            "tfdist starts.",
            field="conf",
            value={"spark.dynamicAllocation.enabled": "true"},
        )


def slots(spark: Any) -> tuple[int, int]:
    """(task slots of the cluster's executors, slots busy with other jobs' tasks) right now."""
    jsc = spark.sparkContext._jsc.sc()  # Spark's own count for barrier stages (SparkContext.maxNumConcurrentTasks)
    total = int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    busy = sum(int(info.numRunningTasks()) for info in jsc.statusTracker().getExecutorInfos())
    return total, busy


def wait_for_slots(spark: Any, needed: int, timeout: float) -> None:
    """Waits until the executors offer ``needed`` free slots; EngineError, with the counts, when they cannot.

    Executors register some seconds after a session starts: when the application has too few slots, the wait
    ends once the count has not changed for a few seconds with an executor up, since more will not come.
    Slots busy with other tasks get up to 15 s to free (a job just ending; Spark's own counts lag a little).
    """
    start = time.monotonic()
    deadline = start + timeout
    last, since = (-1, -1), start
    while True:
        total, busy = slots(spark)
        if total - busy >= needed:
            return
        now = time.monotonic()
        if (total, busy) != last:
            last, since = (total, busy), now
        settled = total > 0 and now - since >= _SETTLE
        if now > deadline or (settled and (total < needed or now - start >= _BUSY_WAIT)):
            break
        time.sleep(0.2)
    task_cpus = spark.sparkContext.getConf().get("spark.task.cpus", "1")
    if total == 0:
        raise EngineError(
            f"No Spark executor joined this application within {timeout:g}s, and the barrier stage needs {needed} "
            "task slots. The cluster may have no free cores: on a standalone cluster an application takes every "
            "free core unless spark.cores.max limits it, so another application may hold them all. Free or add "
            "cores, or raise `ready_timeout`.",
            field="ready_timeout",
            value=timeout,
        )
    raise EngineError(
        f"The Spark barrier stage needs {needed} task slots at once, one per TF task; the application has {total} "
        f"(spark.task.cpus={task_cpus}), {total - busy} of them free ({busy} busy with other jobs). Add "
        "executors or cores, lower spark.task.cpus, or run fewer tasks.",
        field="workers",
        value=needed,
    )
