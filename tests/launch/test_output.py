"""What the console filter of tfdist-launch and `tfdist quiet` drops and keeps, on lines TF really printed; how
a task's output bytes become lines (progress bars included) and console lines.

The lines below were copied from TF 2.17.1 and 2.21.0 processes on a CPU-only machine (issue #11); the
multi-process tests in test_multiworker.py check the same filter on live tasks.
"""

from __future__ import annotations

import os
import pathlib
import pty
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tfdist.launch.engines._host import TaskHost
from tfdist.launch.engines._process import LocalProcess
from tfdist.launch.output import (
    NoiseFilter,
    OutputSplitter,
    console_sink,
    console_task,
    is_progress,
    quiet_sink,
    read_lines,
    wants_tf_info,
)

TF217_STARTUP = [
    "2026-11-30 05:19:19.659386: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. You may see "
    "slightly different numerical results due to floating-point round-off errors from different computation "
    "orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "2026-11-30 05:19:19.660085: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers "
    "on your machine, GPU will not be used.",
    "2026-11-30 05:19:19.690385: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:485] Unable to register "
    "cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered",
    "2026-11-30 05:19:19.716340: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:8454] Unable to register "
    "cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered",
    "2026-11-30 05:19:19.720347: E external/local_xla/xla/stream_executor/cuda/cuda_blas.cc:1452] Unable to "
    "register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered",
    "2026-11-30 05:19:19.759855: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "2026-11-30 05:19:20.815056: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] TF-TRT Warning: Could not "
    "find TensorRT",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796015311.882301    2464 grpc_server_lib.cc:464] Started server with target: grpc://127.0.0.1:23457",
    "I0000 00:00:1796016095.016565   25075 coordination_service_agent.cc:310] Coordination agent has successfully "
    "connected.",
    "I0000 00:00:1796016068.032805   24234 eager_service_impl.cc:356] SessionOptions: device_count {",
    '  key: "CPU"',
    "  value: 1",
    "}",
    "inter_op_parallelism_threads: 4",
    "gpu_options {",
    "  experimental {",
    "  }",
    "}",
    "allow_soft_placement: true",
    "",
    "2026-11-30 05:21:36.121856: W tensorflow/core/framework/dataset.cc:993] Input of GeneratorDatasetOp::Dataset "
    "will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply "
    "optimizations.",
    "2026-11-30 05:21:00.931176: E tensorflow/core/framework/function_handle_cache.cc:31] Failed to clear function "
    "handle cache: UNIMPLEMENTED: Releasing a multi-device component handle on a remote device is not yet "
    "implemented.",
]
TF221_STARTUP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796015954.478827   18924 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.",
    "I0000 00:00:1796015954.479114   18924 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will "
    "not be used.",
    "E0000 00:00:1796015956.302364   18924 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed "
    "call to cuInit: UNKNOWN ERROR (303)",
]
# What must pass: tfdist's lines, the user's (also absl-py INFO and 'key: value' prints), TF's real problems.
REAL = [
    "INFO tfdist.launch.server: TensorFlow server ps:0 up at grpc://127.0.0.1:55535",
    "Epoch 1/3",
    "125/125 - 5s - loss: 0.8192 - accuracy: 0.7485 - 5s/epoch - 39ms/step",
    "I1130 05:08:29.793613 140234 train.py:10] step 100",
    "loss: 0.5",
    "2026-11-30 05:24:28.764747: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed at "
    "whole_file_read_ops.cc:116 : NOT_FOUND: /no/such/file; No such file or directory",
    "E0000 00:00:1796016000.000000   25075 collective_ops.cc:92] Collective ops is aborted by: DEADLINE_EXCEEDED",
    "Traceback (most recent call last):",
    "tensorflow.python.framework.errors_impl.NotFoundError: /no/such/file; No such file or directory [Op:ReadFile]",
    "WARNING:tensorflow:Your input ran out of data; interrupting training.",
    "loss: 0.25",  # A user's print shaped like a proto field (but not a ConfigProto field).
    "ValueError: bad thing",
    "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed",
    "",
]
# The SessionOptions record of TF217_STARTUP and its ConfigProto dump, without the blank line that ends it.
SESSION_DUMP = TF217_STARTUP[11:-3]


@pytest.mark.parametrize("startup", [TF217_STARTUP, TF221_STARTUP], ids=["tf2.17", "tf2.21"])
def test_start_up_noise_is_dropped_and_everything_real_passes(startup: list[str]) -> None:
    keep = NoiseFilter()
    assert [line for line in startup if keep(line)] == []
    assert [line for line in REAL if keep(line)] == REAL


@pytest.mark.parametrize("real", [line for line in REAL if line], ids=range(len(REAL) - 1))
def test_a_real_line_inside_a_sessionoptions_dump_ends_it_and_passes(real: str) -> None:
    """The local engine merges stdout and stderr: a print or an exception may land inside TF's proto dump."""
    assert SESSION_DUMP[0].endswith("SessionOptions: device_count {")
    assert SESSION_DUMP[-1] == "allow_soft_placement: true"
    for cut in (1, 3, len(SESSION_DUMP)):  # Inside a nested message, after it, after the last field.
        keep = NoiseFilter()
        assert [line for line in SESSION_DUMP[:cut] if keep(line)] == []
        assert keep(real)
        assert keep("  value: 1")  # The dump ended: the rest is not taken for its body.


def test_only_the_sessionoptions_record_starts_a_dump() -> None:
    keep = NoiseFilter()
    lines = ["I0000 00:00:1796016068.032805   24234 some_other.cc:12] Something {", '  key: "CPU"', "}"]
    assert [line for line in lines if keep(line)] == lines[1:]


def test_a_users_line_right_after_an_info_record_is_not_taken_for_its_body() -> None:
    keep = NoiseFilter()
    lines = [
        "I0000 00:00:1796015311.882301    2464 grpc_server_lib.cc:464] Started server with target: grpc://x:1",
        "epochs: 3",
        "To enable the following instructions: is only dropped after cpu_feature_guard",
    ]
    assert [line for line in lines if keep(line)] == lines[1:]


def test_cuinit_failure_passes_unless_the_task_said_it_has_no_cuda_driver() -> None:
    failure = TF221_STARTUP[-1]
    assert NoiseFilter()(failure)  # A GPU machine whose driver fails: a real error.
    keep = NoiseFilter()
    assert not keep(TF221_STARTUP[2]) and not keep(failure)


def test_quiet_sink_filters_per_task_and_tf_info_turns_it_off() -> None:
    shown: list[tuple[str, str]] = []
    sink = quiet_sink(lambda task, line: shown.append((task, line)))
    assert sink is not None
    sink("worker:0", "I0000 00:00:1796016068.032805   24234 eager_service_impl.cc:356] SessionOptions: device_count {")
    sink("worker:1", "  value: 1")  # Another task's line is not worker:0's proto body.
    sink("worker:0", "  value: 1")
    assert shown == [("worker:1", "  value: 1")]
    assert quiet_sink(None) is None
    assert wants_tf_info({"TF_CPP_MIN_LOG_LEVEL": "0"}) and not wants_tf_info({"TF_CPP_MIN_LOG_LEVEL": "1"})
    assert not wants_tf_info({})


@pytest.mark.multiprocess
def test_tfdist_quiet_keeps_a_real_tensorflow_error_and_stdout(tmp_path: pathlib.Path) -> None:
    """One real TF process under `tfdist quiet`: no start-up noise on stderr, the real error and stdout intact."""
    missing = str(tmp_path / "no-such-file")
    code = f"import tensorflow as tf\nprint('on stdout')\ntf.io.read_file({missing!r})\n"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # TF then logs INFO too.
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.main", "quiet", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == "on stdout\n"
    assert re.search(rf"op_kernel\.cc:\d+\] OP_REQUIRES failed .*NOT_FOUND: {re.escape(missing)}", done.stderr, re.M), (
        done.stderr
    )
    assert "tensorflow.python.framework.errors_impl.NotFoundError: " in done.stderr
    keep = NoiseFilter()
    assert all(keep(line) for line in done.stderr.splitlines()), done.stderr
    for noise in ("Unable to register cu", "TF-TRT", "oneDNN", "cuda drivers", "rebuild TensorFlow", "InitializeLog"):
        assert noise not in done.stderr
    # The same command without the filter shows what it left out (TF_CPP_MIN_LOG_LEVEL=0 turns it off).
    loud = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.main", "quiet", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    # Which start-up lines TF prints depends on the CPU (oneDNN's line is absent on some): any dropped line will do.
    dropped = [line for line in loud.stderr.splitlines() if not NoiseFilter()(line)]
    assert loud.returncode == 1 and dropped, loud.stderr


def test_tfdist_quiet_keeps_progress_updates_as_updates() -> None:
    """Split like a task's output (OutputSplitter): a bar's updates pass with their \\r, noise between them goes."""
    script = f"printf 'Epoch 1\\n1/3 [=>]\\b\\b\\r2/3 [==>]\\r\\n{TF217_STARTUP[8]}\\n3/3 [===]\\rdone' >&2"
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.main", "quiet", "--", "sh", "-c", script], capture_output=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, b"Epoch 1\n1/3 [=>]\r2/3 [==>]\n3/3 [===]\rdone\n"), done


def test_tfdist_quiet_passes_stdout_and_the_exit_status_and_forwards_sigterm_and_sigint(tmp_path: pathlib.Path) -> None:
    preamble = TF217_STARTUP[8]
    script = f"echo out; echo '{preamble}' >&2; echo 'a real problem' >&2; exit 7"
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.cli.main", "quiet", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "a real problem\n")
    # SIGTERM / SIGINT to `tfdist quiet` (a scheduler, `timeout`, `kill -INT`) reach the command; its status
    # comes back. A new session: no controlling terminal that could have sent the SIGINT to the command too.
    for sig, status in ((signal.SIGTERM, 5), (signal.SIGINT, 6)):
        marker = tmp_path / f"started-{sig.name}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfdist.cli.main",
                "quiet",
                "--",
                "sh",
                "-c",
                f"trap 'exit 5' TERM; trap 'exit 6' INT; touch {marker}; while :; do sleep 0.1; done",
            ],
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert marker.exists(), proc.poll()
            proc.send_signal(sig)
            assert proc.wait(30) == status, sig.name
        finally:
            try:  # The whole session: the command too, if `tfdist quiet` failed to end it.
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)


def test_tfdist_quiet_does_not_repeat_a_ctrl_c_the_terminal_already_sent(tmp_path: pathlib.Path) -> None:
    """Ctrl-C typed at a real terminal (a pty) reaches the command once, not once more through `tfdist quiet`."""
    ready, count = tmp_path / "ready", tmp_path / "count"
    child = (
        f"import pathlib, signal, time\nn = []\nsignal.signal(signal.SIGINT, lambda s, f: n.append(s))\n"
        f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(2)\n"
        f"pathlib.Path({str(count)!r}).write_text(str(len(n)))\n"
    )
    pid, terminal = pty.fork()  # A new session whose controlling terminal is the pty.
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-m", "tfdist.cli.main", "quiet", "--", sys.executable, "-c", child])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        os.write(terminal, b"\x03")  # The terminal sends SIGINT to its foreground group: quiet and the command.
        deadline = time.monotonic() + 30
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            if select.select([terminal], [], [], 0.1)[0]:
                try:
                    os.read(terminal, 4096)  # Keep the pty drained.
                except OSError:  # The pty closed: quiet has ended.
                    time.sleep(0.05)
        assert count.read_text() == "1"
    finally:
        os.close(terminal)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


# ---- lines: splitting at '\n' and '\r', collapsing progress updates --------------------------------------------

# What tf_keras' Progbar (verbose=1, dynamic display) writes for a 3-step epoch, then a warning, then a full line.
KERAS_EPOCH = (
    b"Epoch 1/1\n"
    b"\r1/3 [=========>....................] - ETA: 2s - loss: 38.4045"
    + b"\b" * 33
    + b"\r2/3 [===================>..........] - ETA: 1s - loss: 20.1000"
    + b"\b" * 33
    + b"\r3/3 [==============================] - 3s 1s/step - loss: 9.5000\n"
    + b"WARNING:tensorflow:a warning\n"
)


def _split(chunks: list[bytes]) -> list[str]:
    splitter = OutputSplitter()
    return [line for chunk in chunks for line in splitter.feed(chunk)] + splitter.finish()


def test_each_progress_update_is_a_line_of_its_own_wherever_the_reads_cut_the_bytes() -> None:
    expected = [
        "Epoch 1/1",
        "1/3 [=========>....................] - ETA: 2s - loss: 38.4045\r",
        "2/3 [===================>..........] - ETA: 1s - loss: 20.1000\r",
        "3/3 [==============================] - 3s 1s/step - loss: 9.5000",
        "WARNING:tensorflow:a warning",
    ]
    assert _split([KERAS_EPOCH]) == expected
    assert _split([KERAS_EPOCH[i : i + 1] for i in range(len(KERAS_EPOCH))]) == expected  # One byte per read.
    for cut in range(len(KERAS_EPOCH)):
        assert _split([KERAS_EPOCH[:cut], KERAS_EPOCH[cut:]]) == expected, cut


def test_crlf_partial_lines_and_utf8_split_between_reads() -> None:
    bar = "50%|█████     |".encode()
    assert _split([b"a\r", b"\nb\r\n"]) == ["a", "b"]  # '\r\n' split between reads is one line break.
    assert _split([b"\r" + bar[:5], bar[5:] + b"\r", b"done"]) == ["50%|█████     |\r", "done"]
    assert _split([b"no newline at the end"]) == ["no newline at the end"]
    assert _split([b"last update\r"]) == ["last update\r"]  # The output ended on a progress update.
    assert _split([b"\r\r   \r\b\b\r"]) == []  # Updates with nothing in them are no lines.
    assert _split([b"\n\n"]) == ["", ""]  # Empty lines stay.


def test_read_lines_yields_progress_updates_before_the_line_ends() -> None:
    """On a real pipe: each update arrives while the writer still waits to end the line."""
    read_end, write_end = os.pipe()
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(read_lines(os.fdopen(read_end, "rb"))))
    reader.start()
    try:
        for i in range(1, 4):
            os.write(write_end, f"\r{i}/3".encode())
            deadline = time.monotonic() + 10
            while len(seen) < i - 1 and time.monotonic() < deadline:  # The update before this one is out.
                time.sleep(0.01)
            assert seen == [f"{n}/3\r" for n in range(1, i)]
        os.write(write_end, b" - done\npartial")
    finally:
        os.close(write_end)
        reader.join(10)
    assert seen == ["1/3\r", "2/3\r", "3/3 - done", "partial"]


def test_the_console_shows_the_line_that_ends_a_bar_and_throttled_updates() -> None:
    now = [0.0]
    out: list[str] = []
    sink = console_sink(out.append, progress_seconds=10.0, clock=lambda: now[0])
    for step in range(1, 31):
        now[0] = step * 1.0
        sink("worker:0", f"{step}/30 [...]\r")
    sink("worker:0", "30/30 [===] - loss: 0.5")
    assert out == [f"[worker:0] {step}/30 [...]\n" for step in (1, 11, 21)] + ["[worker:0] 30/30 [===] - loss: 0.5\n"]
    assert not any(is_progress(text.rstrip("\n")) for text in out)


def test_two_tasks_interleaved_never_share_a_console_line() -> None:
    """Two tasks' output bytes, cut at random places and read by two threads: every write is one whole line."""
    streams = {
        task: KERAS_EPOCH.replace(b"warning", task.encode()) * 20 + b"tail of " + task.encode()
        for task in ("worker:0", "worker:1")
    }
    writes: list[str] = []
    sink = console_sink(writes.append, progress_seconds=0.0)

    def _pump(task: str) -> None:
        data, rng, splitter = streams[task], random.Random(task), OutputSplitter()
        at = 0
        while at < len(data):
            step = rng.randint(1, 40)
            for line in splitter.feed(data[at : at + step]):
                sink(task, line)
            at += step
        for line in splitter.finish():
            sink(task, line)

    threads = [threading.Thread(target=_pump, args=(task,)) for task in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(writes) == 2 * (20 * 5 + 1)
    for task in streams:
        mine = [text for text in writes if text.startswith(f"[{task}] ")]
        assert len(mine) == 20 * 5 + 1 and mine[-1] == f"[{task}] tail of {task}\n"
        epoch = _split([KERAS_EPOCH.replace(b"warning", task.encode())])
        assert mine[:5] == [f"[{task}] {line.rstrip(chr(13))}\n" for line in epoch]
    assert all(text.count("\n") == 1 and text.endswith("\n") and "\r" not in text for text in writes)


def test_console_chief_shows_one_task() -> None:
    out: list[str] = []
    sink = console_sink(out.append, tasks={console_task(chief=False)})
    for task in ("worker:0", "worker:1", "data-service:0"):
        sink(task, "hi")
    assert out == ["[worker:0] hi\n"] and console_task(chief=True) == "chief:0"


@pytest.mark.parametrize("engine", ["local", "ray actor"])
def test_both_engines_readers_split_a_real_progress_bar(engine: str) -> None:
    """The local engine's reader and the Ray actor's (without Ray) give the same lines."""
    code = "import sys, time\nfor i in (1, 2): sys.stdout.write(f'\\r{i}/2'); sys.stdout.flush(); time.sleep(0.05)\nprint(' ok')"
    lines = _engine_lines(engine, [sys.executable, "-c", code])
    assert lines == ["1/2\r", "2/2 ok"]


def _engine_lines(engine: str, argv: list[str]) -> list[str]:
    """Every line the local engine's reader or the Ray actor's (without Ray) gets from ``argv``."""
    if engine == "local":
        lines: list[str] = []
        proc = LocalProcess("worker:0", argv, env=None, on_line=lambda task, line: lines.append(line))
        assert proc.wait(30) == 0
        proc.release(10)
        return lines
    host, lines, finished = TaskHost("worker:0"), [], False
    host.start(argv, dict(os.environ))
    deadline = time.monotonic() + 30
    while not finished and time.monotonic() < deadline:
        batch, _code, finished = host.read(5.0)
        lines += batch
    assert finished
    return lines


@pytest.mark.parametrize("engine", ["local", "ray actor"])
def test_a_line_written_in_two_pieces_is_not_cut_by_a_log_line_on_stderr(engine: str) -> None:
    """An unbuffered print writes its text and its newline apart; a C++ log line on stderr may come between.

    With one pipe for both streams the task's line became ``EPOCH_END 5W0000 ...``, and a trigger
    ``^EPOCH_END 5$`` never fired (seen in CI under load). Each stream has its own pipe now.
    """
    code = (
        "import sys, time\n"
        "sys.stdout.write('EPOCH_END 5'); sys.stdout.flush()\n"
        "sys.stderr.write('W0000 a log line\\n'); sys.stderr.flush(); time.sleep(0.1)\n"
        "sys.stdout.write('\\n'); sys.stdout.write('after'); sys.stdout.flush()\n"
    )
    lines = _engine_lines(engine, [sys.executable, "-c", code])
    assert sorted(lines) == ["EPOCH_END 5", "W0000 a log line", "after"], lines
    assert lines.index("EPOCH_END 5") < lines.index("after"), lines  # Each stream keeps its own order.
