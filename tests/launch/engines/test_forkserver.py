"""The fork server: its protocol, a forked task as a local process, the engine's use of it and its fallback."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.processes import alive, assert_all_gone
from tfdist import testing
from tfdist.launch import LaunchConfig, LocalEngine
from tfdist.launch.engines import _forkserver
from tfdist.launch.engines._forkserver import ForkedProcess, ForkServer, ServerGone
from tfdist.launch.engines._process import LocalProcess
from tfdist.launch.tasks import forkserver as protocol
from tfdist.launch.tasks.programs import TaskProgram

TASKS = "tests.launch.engines._tasks_forkserver"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def server() -> Iterator[ForkServer]:
    """A fork server without TensorFlow (these tests are about the forking, not the import)."""
    forks = ForkServer(ENV, preload=False)
    yield forks
    forks.close()


class Task:
    """A forked run of ``python -m tests.launch.engines._tasks_forkserver ACTION``, its lines collected."""

    def __init__(self, server: ForkServer, *args: str, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        argv = [sys.executable, "-m", TASKS, *args]
        self.proc = ForkedProcess(
            "worker:0", server, argv, env=ENV if env is None else env, on_line=lambda t, line: self.lines.append(line)
        )

    def finish(self, timeout: float = 30) -> int | None:
        code = self.proc.wait(timeout)
        self.proc.release(5)
        return code

    def first_line(self) -> str:
        while not self.lines and self.proc.poll() is None:
            self.proc.wait(0.02)
        return self.lines[0]


def test_a_message_carries_its_file_descriptors() -> None:
    launcher, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read, write = os.pipe()
    protocol.send_message(launcher, {"argv": ["x"]}, [write])
    message, fds = protocol.receive_message(server, max_fds=2)
    os.write(fds[0], b"through the passed fd")
    assert message == {"argv": ["x"]}
    assert os.read(read, 100) == b"through the passed fd"
    for fd in (read, write, *fds):
        os.close(fd)
    launcher.close()
    assert protocol.receive_message(server) == (None, [])


def test_the_preload_goes_on_without_tf_keras(monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []

    def import_module(name: str) -> None:  # A stack without tf-keras (TensorFlow 2.22).
        imported.append(name)
        if name == "tf_keras":
            raise ModuleNotFoundError("No module named 'tf_keras'", name=name)

    monkeypatch.setattr(protocol.importlib, "import_module", import_module)
    protocol.preload({"TF_USE_LEGACY_KERAS": "1"})  # The launcher's setting: the server starts all the same.
    protocol.preload({"TF_USE_LEGACY_KERAS": "0"})
    assert imported == ["tensorflow", "tf_keras", "tensorflow"]


@pytest.mark.parametrize(
    ("args", "code", "last_line"),
    [
        (("exit", "0"), 0, None),
        (("exit", "3"), 3, None),
        (("message",), 1, "the task failed on purpose"),
        (("raise",), 1, "RuntimeError: boom on purpose"),
    ],
)
def test_exit_codes_are_the_interpreters(server: ForkServer, args: tuple[str, ...], code: int, last_line: str) -> None:
    task = Task(server, *args)
    assert task.finish() == code
    assert (task.lines[-1] if task.lines else None) == last_line


def test_a_sigkilled_task_exits_137(server: ForkServer) -> None:
    task = Task(server, "sleep")
    assert task.first_line() == "ready"
    assert task.proc.poll() is None and task.proc.wait(0.05) is None
    task.proc.signal(signal.SIGKILL)
    assert task.finish() == 137


def test_lines_of_both_streams_arrive(server: ForkServer) -> None:
    task = Task(server, "lines")
    assert task.finish() == 0
    assert sorted(task.lines) == ["to stderr", "to stdout"]


def test_env_cwd_argv_and_signals_are_a_new_interpreters(
    server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**ENV, "TF_CONFIG": '{"task": {"type": "worker", "index": 1}}', "ONLY_THIS_TASK": "yes"}
    env.pop("HOME", None)
    monkeypatch.chdir(tmp_path)
    task = Task(server, "show", "--flag", "value", env=env)
    assert task.finish() == 0
    seen = json.loads(task.lines[0])
    assert seen["env"] == env  # exactly the task's environment, nothing of the server's
    assert (seen["cwd"], seen["path0"]) == (str(tmp_path), str(tmp_path))
    assert seen["name"] == "__main__"
    assert seen["argv"][0].endswith("_tasks_forkserver.py") and seen["argv"][1:] == ["show", "--flag", "value"]
    assert seen["leader"] and seen["stdin"] == ""  # its own session and group; stdin is /dev/null
    signals = seen["signals"]
    assert (signals["SIGTERM"], signals["SIGCHLD"], signals["SIGHUP"]) == ("default", "default", "default")
    assert (signals["SIGPIPE"], signals["SIGINT"]) == ("ignored", "default_int_handler")  # as Python starts


def test_the_end_joins_threads_then_runs_atexit(server: ForkServer) -> None:
    task = Task(server, "late")
    assert task.finish() == 0
    assert task.lines == ["main returned", "thread ended", "atexit ran"]


def test_a_signal_reaches_the_tasks_whole_group(server: ForkServer) -> None:
    task = Task(server, "group")
    grandchild = int(task.first_line().split()[1])
    task.proc.signal(signal.SIGTERM)
    assert task.finish() == 128 + signal.SIGTERM
    assert_all_gone([grandchild])


def test_the_server_ends_at_the_launchers_eof_and_leaves_its_tasks(server: ForkServer) -> None:
    task = Task(server, "sleep")
    assert task.first_line() == "ready"
    server.close()
    assert server._proc.returncode == 0 and not server.alive
    assert alive(task.proc.pid) and task.proc.poll() is None  # The engine's reaper, not the server, ends it.
    with pytest.raises(ServerGone):
        Task(server, "exit", "0")
    task.proc.signal(signal.SIGKILL)
    assert task.finish() == 1  # Its adopter reaped it: the code is lost, and said so.
    assert task.lines[-1] == "tfdist: the fork server of worker:0 died before it; its exit code is lost."


def _function_argv(*args: str) -> list[str]:
    return TaskProgram.FUNCTION.argv("--module", TASKS, "main", json.dumps(args))


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEngine]:
    """A local engine with ``preload`` whose fork servers skip the import of TensorFlow."""
    monkeypatch.setattr(_forkserver, "ForkServer", functools.partial(ForkServer, preload=False))
    monkeypatch.setattr(_forkserver, "_shared", None)  # Its own servers, not the session's.
    local = LocalEngine()
    local.place(LaunchConfig(command=("python",), workers=1, preload=True))
    yield local
    local.close()


def _start(engine: LocalEngine, argv: list[str]) -> tuple[object, list[str]]:
    lines: list[str] = []
    proc = engine.start("worker:0", argv, ENV, lambda task, line: lines.append(line))
    assert proc.wait(30) == 0
    proc.release(5)
    return proc, lines


def test_the_engine_forks_only_tfdists_own_programs(engine: LocalEngine) -> None:
    forked, lines = _start(engine, _function_argv("lines"))
    assert isinstance(forked, ForkedProcess)
    assert sorted(lines) == [testing.RESULT_PREFIX + "null", "to stderr", "to stdout"]
    plain, _ = _start(engine, [sys.executable, "-m", TASKS, "lines"])  # a user's command
    assert isinstance(plain, LocalProcess)


def test_a_dead_server_is_reported_and_tasks_start_as_processes(
    engine: LocalEngine, caplog: pytest.LogCaptureFixture
) -> None:
    forked, _ = _start(engine, _function_argv("exit", "0"))
    assert isinstance(forked, ForkedProcess)
    (server,) = engine._forks._servers.values()  # type: ignore[union-attr]
    assert server is not None
    os.kill(server.pid, signal.SIGKILL)
    server._reader.join(10)
    assert next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING).startswith(
        f"The fork server (pid {server.pid}) died with exit code -9"
    )
    after, lines = _start(engine, _function_argv("lines"))
    assert isinstance(after, LocalProcess) and testing.RESULT_PREFIX + "null" in lines


def test_a_server_that_cannot_start_is_reported(
    engine: LocalEngine, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def _fail(env: object) -> ForkServer:
        raise ServerGone("could not start the fork server: no such file")

    monkeypatch.setattr(_forkserver, "ForkServer", _fail)
    proc, _ = _start(engine, _function_argv("exit", "0"))
    assert isinstance(proc, LocalProcess)
    assert "could not start the fork server: no such file; tasks start as new processes." in caplog.text


def test_runs_inside_sharing_fork_from_servers_kept_between_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_forkserver, "ForkServer", functools.partial(ForkServer, preload=False))
    monkeypatch.setattr(_forkserver, "_shared", None)
    monkeypatch.setattr(_forkserver, "MAX_SERVERS", 1)
    other = {**ENV, "TFDIST_TEST_OTHER": "1", "PYTEST_CURRENT_TEST": "another test"}  # The same server.
    with _forkserver.sharing() as servers:
        seen = []
        for env in (ENV, other, {**ENV, "LANG": "C.UTF-8-other"}):
            local = LocalEngine()
            local.place(LaunchConfig(command=("python",), workers=1, preload=True))
            try:
                proc = local.start("worker:0", _function_argv("exit", "0"), env, lambda task, line: None)
                assert isinstance(proc, ForkedProcess) and proc.wait(30) == 0
                proc.release(5)
            finally:
                local.close()  # The run ends; its server stays.
            (server,) = [s for s in servers._servers.values() if s is not None]
            assert server.alive
            seen.append(server)
    assert seen[0] is seen[1]  # A task's own variables and pytest's do not make another server.
    assert seen[2] is not seen[0] and not seen[0].alive  # Another environment: the idle server made room.
    assert not seen[2].alive  # All end with the block.


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_preloaded_mwms_fit_equals_the_plain_one() -> None:
    forked = testing.run_cluster(f"{TASKS}:mwms_fit_and_parent", workers=2, timeout=180, args=[64, 2])
    plain = testing.run_cluster(f"{TASKS}:mwms_fit_and_parent", workers=2, timeout=180, args=[64, 2], preload=False)
    assert forked.ok, forked.result.summary()
    assert plain.ok, plain.result.summary()
    for task in ("worker:0", "worker:1"):
        assert forked.values[task]["weights"] == plain.values[task]["weights"]
        assert forked.values[task]["parent"][1:3] == ["-m", TaskProgram.FORKSERVER.module]
        assert plain.values[task]["ppid"] == os.getpid()  # started by this launcher
    assert forked.values["worker:0"]["ppid"] == forked.values["worker:1"]["ppid"]
    assert forked.values["worker:0"]["draw"] != forked.values["worker:1"]["draw"]  # NumPy reseeded in each fork
