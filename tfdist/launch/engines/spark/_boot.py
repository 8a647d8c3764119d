"""The first code a Spark barrier task runs: it needs nothing but the standard library.

:class:`~tfdist.launch.engines.spark.engine.SparkEngine` ships :func:`boot` to the executors by value (pyspark's
cloudpickle), so that an executor whose Python lacks tfdist can still say so: it phones the driver with the
interpreter it runs and the import error, instead of failing the stage with a pickling traceback that Spark
retries. With tfdist importable it hands over to :func:`tfdist.launch.engines.spark._task.serve`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def boot(index: int, rows: Iterable[Any], driver: tuple[str, int], authkey: bytes, tasks: list[str]) -> Iterator[int]:
    """Runs task ``tasks[index]`` of a tfdist job until the driver says quit; yields the exit code once."""
    import socket
    import sys
    from multiprocessing.connection import Client

    del rows
    try:
        from tfdist.launch.engines.spark._task import serve
    except ImportError as err:
        with Client(driver, authkey=authkey) as link:
            link.send(("missing", index, socket.gethostname(), sys.executable, f"{type(err).__name__}: {err}"))
        yield 0
        return
    yield serve(index, driver, authkey, tasks)
