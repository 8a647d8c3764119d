"""The Spark engine's wire without Spark: the driver's desk, the task side's calls, the options."""

from __future__ import annotations

import sys
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from typing import Any

import pytest

from tfdist.errors import LaunchError
from tfdist.launch.engines._host import TaskHost
from tfdist.launch.engines.spark._link import Desk, SparkTaskProcess
from tfdist.launch.engines.spark._task import _accept, _Calls
from tfdist.launch.engines.spark.engine import SparkOptions
from tfdist.launch.output import LineSink

pytestmark = pytest.mark.timeout(60)


def _phone(desk: Desk, index: int, addresses: list[str]) -> tuple[Any, list[Any]]:
    """A barrier task's side of the hello: reports each of ``addresses`` until one is taken; the replies."""
    link = Client(desk.address, authkey=desk.authkey)
    link.send(("hello", index, "127.0.0.1", sys.executable, 1))
    replies = [link.recv()]
    for address in addresses:
        link.send(("ready", index, address, f"127.0.0.1:{9000 + index}"))
        replies.append(link.recv())
        if replies[-1] == "ok":
            break
    return link, replies


def test_the_desk_gives_every_task_its_own_address_and_offers_it_again_on_a_relaunch() -> None:
    desk = Desk("127.0.0.1")
    failed = threading.Event()
    try:
        first, replies = _phone(desk, 0, ["127.0.0.1:5000"])
        assert replies == [None, "ok"]
        second, replies = _phone(desk, 1, ["127.0.0.1:5000", "127.0.0.1:5001"])  # drew task 0's port first
        assert replies == [None, "again", "ok"]
        assert desk.wait(2, 5, failed)
        assert [desk.current(i).address for i in (0, 1)] == ["127.0.0.1:5000", "127.0.0.1:5001"]
        # A caller without the run's key is turned away, and the desk goes on answering.
        with pytest.raises(AuthenticationError):
            Client(desk.address, authkey=b"wrong")
        # Spark relaunched the stage: task 0 phones again and is offered its old address; the old lifeline closes.
        again, replies = _phone(desk, 0, ["127.0.0.1:5000"])
        assert replies == ["127.0.0.1:5000", "ok"]
        assert desk.current(0).lifeline is not first
        desk.quit(2.0)
        assert again.recv() == ("quit", 2.0) and second.recv() == ("quit", 2.0)
    finally:
        desk.quit(0.0)


def test_a_task_program_started_through_the_wire_streams_and_exits() -> None:
    from multiprocessing.connection import Listener

    authkey = b"k" * 32
    listener = Listener(("127.0.0.1", 0), authkey=authkey)
    host = TaskHost("worker:0")
    threading.Thread(target=_accept, args=(listener, _Calls(host)), daemon=True).start()
    control = f"127.0.0.1:{listener.address[1]}"
    lines: list[tuple[str, str]] = []
    sink: LineSink = lambda task, line: lines.append((task, line))  # noqa: E731
    from tfdist.launch.engines.spark._link import Channel

    code = "import sys; print('hello'); sys.exit(3)"
    pid = Channel(control, authkey).call("start", [sys.executable, "-c", code], {"PATH": ""}, "/nonexistent")
    proc = SparkTaskProcess("worker:0", control, authkey, sink, pid, local=True)
    assert proc.wait(30) == 3 and proc.pid == pid
    proc.release(10)
    assert ("worker:0", "hello") in lines
    with pytest.raises(Exception, match="unknown call"):
        Channel(control, authkey).call("format_disk")
    listener.close()


def test_options_are_checked() -> None:
    assert SparkOptions().master is None
    for bad in ({"master": ""}, {"conf": {"task.cpus": "2"}}, {"conf": {"spark.task.cpus": 2}}, {"ready_timeout": 0}):
        with pytest.raises(LaunchError):
            SparkOptions(**bad)
