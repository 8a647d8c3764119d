"""One tfdist task inside a Spark barrier task: it picks the task's address and serves the driver's calls.

Each barrier task of the stage :class:`~tfdist.launch.engines.spark.engine.SparkEngine` submits runs :func:`serve`:

1. it connects to the driver (the *lifeline*) and says hello with its executor's host; the driver answers
   with the address the task had before, when Spark relaunched the stage on the same host;
2. it picks a free port on that host (or keeps the old one when it is free), opens a control listener and
   tells the driver both addresses; the driver, which sees every task's, answers "again" where two drew
   one port. (Through the driver, not ``BarrierTaskContext.allGather``: every allGather took a full second
   in Spark 4.3, and the driver builds the cluster anyway.)
3. the driver then starts, reads, signals and stops the task's program there through a
   :class:`~tfdist.launch.engines._host.TaskHost`;
4. when the driver says quit, or the lifeline breaks (the driver is gone), it stops the program and ends.

The wire is ``multiprocessing.connection`` with the run's random key: only the driver that submitted the
stage can call. The program is tied to the task's Python worker too (parent-death signal), so a task Spark
kills takes its program with it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tfdist.cluster.address import free_ports, join_address, port_is_free, split_address
from tfdist.launch.engines._host import TaskHost
from tfdist.launch.engines.spark._link import BACKLOG

_log = logging.getLogger("tfdist.launch.spark")
STOP_GRACE = 5.0  # seconds the program gets after SIGTERM when the driver quits or is gone
_PICKS = 5  # tries to draw a port no other task reported


def _pick(host: str, previous: str | None) -> str:
    if previous is not None and split_address(previous)[0] == host and port_is_free(*split_address(previous)):
        return previous
    return join_address(host, free_ports(1, host)[0])


class _Calls:
    """The driver's calls on this task's program: each accepted connection is served by its own thread."""

    def __init__(self, host: TaskHost) -> None:
        self.host = host

    def serve(self, link: Connection) -> None:
        with link:
            while True:
                try:
                    method, args = link.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", self._call(method, args))
                except Exception as err:  # Sent to the driver, which raises it as a LaunchFailure.
                    reply = ("error", f"{type(err).__name__}: {err}")
                try:
                    link.send(reply)
                except OSError:
                    return

    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        host = self.host
        if method == "start":
            argv, env, cwd = args
            return host.start(argv, env, cwd=cwd if cwd and os.path.isdir(cwd) else None)
        if method == "read":
            return host.read(*args)
        if method == "signal":
            return host.signal(*args)
        if method == "stop":
            return host.stop(*args)
        raise ValueError(f"unknown call {method!r}")


def _accept(listener: Listener, calls: _Calls) -> None:
    while True:
        try:
            link = listener.accept()
        except AuthenticationError:
            continue  # a caller without the run's key
        except (OSError, EOFError):
            return  # closed at the end
        threading.Thread(target=calls.serve, args=(link,), daemon=True).start()


def serve(index: int, driver: tuple[str, int], authkey: bytes, tasks: list[str]) -> int:
    """Runs the task ``tasks[index]`` of this barrier stage until the driver quits; returns the program's code."""
    from pyspark import BarrierTaskContext

    context = BarrierTaskContext.get()
    host = split_address(context.getTaskInfos()[context.partitionId()].address)[0]
    task = tasks[index]
    with Client(driver, authkey=authkey) as lifeline:
        lifeline.send(("hello", index, host, sys.executable, os.getpid()))
        address = _pick(host, lifeline.recv())
        taskhost = TaskHost(task)
        listener = Listener((host, 0), backlog=BACKLOG, authkey=authkey)
        threading.Thread(target=_accept, args=(listener, _Calls(taskhost)), daemon=True).start()
        for _ in range(_PICKS):  # The driver answers "again" when another task reported the same address.
            lifeline.send(("ready", index, address, join_address(*listener.address)))
            if lifeline.recv() == "ok":
                break
            address = _pick(host, None)
        else:
            raise RuntimeError(f"tfdist: Spark task {index} kept drawing ports other tasks hold on {host}")
        grace = STOP_GRACE
        try:
            message = lifeline.recv()
            if isinstance(message, tuple) and message[0] == "quit":
                grace = float(message[1])
        except (EOFError, OSError):
            _log.warning("tfdist: the driver of %s is gone; stopping its program", task)
        finally:
            listener.close()
            code = taskhost.stop(grace)
    return 0 if code is None else code
