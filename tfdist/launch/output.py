"""What a task's output looks like on the console: its lines split, TensorFlow's chatter left out, progress bars
collapsed, each line whole with its task's prefix.

**Lines.** :func:`read_lines` (every engine's reader of a task's output) splits the bytes at ``\\n`` and
``\\r\\n`` and also at a lone ``\\r``. A segment a lone ``\\r`` ends is a *progress update*: the program went
back to the start of the line to draw over it (Keras' ``verbose=1`` bar, tqdm). It keeps its ``\\r``
(:func:`is_progress`), so each update is a line of its own: the log files and ``LaunchResult`` keep every
update, and the console (:func:`console_sink`) shows the line that ends a bar and at most one update every
:data:`PROGRESS_SECONDS` per task. A line is always written whole with its prefix, so two tasks' text never
shares a console line.

**Noise.** TensorFlow's start-up chatter in a task's output is recognised so the console can leave it out.

Every process that imports TensorFlow prints lines that say nothing to a user
of a CPU cluster: INFO records, and a few start-up warnings and errors that
TensorFlow prints on every machine without the optional GPU libraries. On
TF 2.17 the C++ runtime logs through two systems. Lines of the TSL logger
(``2026-01-01 10:00:00.000000: I file.cc:12] ...``) obey ``TF_CPP_MIN_LOG_LEVEL``,
which the launcher sets to 1. Lines of the absl logger (``I0000 00:00:... file.cc:12] ...``)
do not: no variable reaches that logger in a Python process. It is the one
that prints ``Started server with target`` in every task and, for every ps and
worker task a coordinator connects to, ``SessionOptions:`` followed by the
task's whole ConfigProto (about 20 lines). TF 2.18+ logs everything through absl.

:class:`NoiseFilter` drops:

- INFO records of TensorFlow's C++ code (a ``.cc``/``.h`` source in the
  header; absl-py lines of the user's own Python code name a ``.py`` file and
  pass), and the ConfigProto a ``SessionOptions:`` record dumps (:data:`_PROTO_DUMPS`): only lines
  of that text proto (``}``, ``field {``, ``field: value`` with a number, quoted string, bool or enum
  value, indented to their depth, top-level fields named as ConfigProto's) up to the blank line that
  ends it; any other line (a user's ``loss: 0.25``, an exception's last line) ends the dump and passes;
- absl's ``before absl::InitializeLog()`` preamble;
- the known harmless messages of :data:`_KNOWN_NOISE`, whatever their level:
  the cuDNN/cuFFT/cuBLAS "Unable to register ... factory" errors (a TF 2.17
  bug, tensorflow#62075), TF-TRT's "Could not find TensorRT", the oneDNN
  notice, cpu_feature_guard's "rebuild TensorFlow" note (two lines), "Could
  not find cuda drivers", the ``cuInit`` failure that follows it on a
  machine with no CUDA driver, the "Input of GeneratorDatasetOp::Dataset will
  not be optimized" warning of every MultiWorkerMirroredStrategy ``fit`` (TF's
  own per-device input iterators are generator datasets), and the "Failed to
  clear function handle cache: UNIMPLEMENTED" error every parameter-server
  worker logs when the coordinator releases its datasets at the end of ``fit``.

Every other warning and error (TensorFlow's, Python's, tracebacks) and every
line of tfdist and of the user's program passes. The log files under
``--log-dir`` keep everything; ``TF_CPP_MIN_LOG_LEVEL=0`` turns the filter off.

Example:
    >>> keep = NoiseFilter()
    >>> lines = ["2026-11-30 05:08:29.793613: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:485] "
    ...          "Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has "
    ...          "already been registered",
    ...          "I0000 00:00:1796003962.858 15022 eager_service_impl.cc:356] SessionOptions: device_count {",
    ...          '  key: "CPU"', "}", "allow_soft_placement: true", "",
    ...          "INFO tfdist.launch.server: TensorFlow server ps:0 up",
    ...          "W0000 00:00:1796003963.001 15022 op_kernel.cc:1840] OP_REQUIRES failed: NOT_FOUND: /no/such"]
    >>> [line for line in lines if keep(line)]
    ['INFO tfdist.launch.server: TensorFlow server ps:0 up', 'W0000 00:00:1796003963.001 15022 op_kernel.cc:1840] OP_REQUIRES failed: NOT_FOUND: /no/such']
"""

from __future__ import annotations

import codecs
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO

LineSink = Callable[[str, str], None]  # (task, line) -> None: where the engines send each line of output


PROGRESS_SECONDS = 10.0  # The console shows at most one progress update per task this often.
_CHUNK = 65536
_MAX_LINE = 1 << 20  # Characters: a longer run without a line break is passed on in pieces of this size.
_BREAKS = re.compile(r"\r\n|\n|\r")

_CPP_SOURCE = r"[\w./-]+\.(?:cc|h|cpp)"
_HEADER = re.compile(  # absl (any TF) or TSL (TF <= 2.17) header of a C++ log record; group 1 is the level.
    rf"^(?:([IWEF])\d{{4}} \d\d:\d\d:\d+\.\d+ +\d+ |\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: ([IWEF]) ){_CPP_SOURCE}:\d+\] "
)
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# Text-format proto lines as protobuf's DebugString writes them (two spaces per level of nesting).
_PROTO_OPEN = re.compile(r"^( *)([a-z_][a-z0-9_]*) \{$")
_PROTO_FIELD = re.compile(
    r'^( *)([a-z_][a-z0-9_]*): (?:-?\d+(?:\.\d+)?(?:e[+-]?\d+)?|-?inf|nan|"(?:[^"\\]|\\.)*"|'
    r"true|false|[A-Z][A-Z0-9_]*)$"
)
_PROTO_CLOSE = re.compile(r"^( *)\}$")
# The INFO records followed by a text-proto dump: the record's text before the proto -> the top-level field names
# of the dumped message (eager_service_impl.cc logs a remote task's whole ConfigProto as "SessionOptions: ...").
_CONFIG_PROTO_FIELDS = frozenset(
    (
        "device_count",
        "intra_op_parallelism_threads",
        "inter_op_parallelism_threads",
        "use_per_session_threads",
        "session_inter_op_thread_pool",
        "placement_period",
        "device_filters",
        "gpu_options",
        "pluggable_device_options",
        "allow_soft_placement",
        "log_device_placement",
        "graph_options",
        "operation_timeout_in_ms",
        "rpc_options",
        "cluster_def",
        "isolate_session_state",
        "share_cluster_devices_in_session",
        "experimental",
    )
)
_PROTO_DUMPS: dict[str, frozenset[str]] = {"SessionOptions: ": _CONFIG_PROTO_FIELDS}
_NO_CUDA_DRIVER = "Could not find cuda drivers on your machine, GPU will not be used."
# Messages TensorFlow prints in every run on a CPU machine (the text after the record's header). Matched whatever
# the level: a harmless 'E' here is still noise. Anything not listed passes.
_KNOWN_NOISE = re.compile(
    "|".join(
        (
            r"Unable to register cu(?:DNN|FFT|BLAS) factory: Attempting to register factory for plugin cu\w+ when one "
            r"has already been registered",
            r"TF-TRT Warning: Could not find TensorRT$",
            r"oneDNN custom operations are on\.",
            r"This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations\.$",
            re.escape(_NO_CUDA_DRIVER),
            r"Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the "
            r"AsGraphDefInternal\(\) method needed to apply optimizations\.$",
            r"Failed to clear function handle cache: UNIMPLEMENTED: Releasing a multi-device component handle on a "
            r"remote device is not yet implemented\.$",
        )
    )
)
# cpu_feature_guard's second line has no header of its own.
_CPU_GUARD_TAIL = re.compile(
    r"^To enable the following instructions: .*rebuild TensorFlow with the appropriate "
    r"compiler flags\.$"
)
_CUINIT = re.compile(r"failed call to cuInit: ")


class NoiseFilter:
    """A per-task line filter: ``keep(line)`` is False for TensorFlow's INFO records and start-up noise."""

    def __init__(self) -> None:
        self._proto: frozenset[str] | None = None  # inside a dump: the dumped message's top-level fields
        self._depth = 0  # nesting depth inside the dump
        self._tail: re.Pattern[str] | None = None  # the header-less line a record may continue with
        self._no_driver = False  # this task said it has no CUDA driver: cuInit's failure is then expected

    def __call__(self, line: str) -> bool:
        tail, self._tail = self._tail, None
        if tail is not None and tail.match(line):
            return False
        if self._proto is not None:
            if self._in_dump(line):
                return False
            self._proto = None  # Not the proto's: the dump ended (or another line interleaved); the line passes.
        header = _HEADER.match(line)
        if header is None:
            return line != _ABSL_PREAMBLE
        text = line[header.end() :]
        if _NO_CUDA_DRIVER in text:
            self._no_driver = True
        if (header.group(1) or header.group(2)) == "I":
            self._start_dump(text)
            self._tail = _CPU_GUARD_TAIL
            return False
        if _KNOWN_NOISE.search(text):
            self._tail = _CPU_GUARD_TAIL
            return False
        return not (self._no_driver and _CUINIT.match(text))

    def _start_dump(self, text: str) -> None:
        for prefix, fields in _PROTO_DUMPS.items():
            if text.startswith(prefix):
                first = text[len(prefix) :].rstrip()
                self._proto, self._depth = fields, 0
                if first and not self._in_dump(first):  # e.g. "SessionOptions: device_count {"
                    self._proto = None
                return

    def _in_dump(self, line: str) -> bool:
        """True (and the depth updated) when ``line`` is the next line of the dump; a blank line ends it."""
        assert self._proto is not None
        if line == "":
            self._proto = None
            return True
        for pattern, step in ((_PROTO_OPEN, 1), (_PROTO_FIELD, 0), (_PROTO_CLOSE, -1)):
            match = pattern.match(line)
            if match is None:
                continue
            depth = self._depth - 1 if step < 0 else self._depth
            if len(match.group(1)) != 2 * depth or depth < 0:
                return False
            if step >= 0 and depth == 0 and match.group(2) not in self._proto:
                return False
            self._depth += step
            return True
        return False


def wants_tf_info(env: Mapping[str, str]) -> bool:
    """True when the user asked for TensorFlow's INFO logs (``TF_CPP_MIN_LOG_LEVEL=0``)."""
    return env.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


def quiet_sink(sink: LineSink | None) -> LineSink | None:
    """``sink`` without TensorFlow's noise (one :class:`NoiseFilter` per task); None stays None."""
    if sink is None:
        return None
    filters: dict[str, NoiseFilter] = {}

    def _sink(task: str, line: str) -> None:
        if filters.setdefault(task, NoiseFilter())(line):
            sink(task, line)

    return _sink


def is_progress(line: str) -> bool:
    """True for a progress update: a segment of a task's output that a lone ``\\r`` ended (it keeps the ``\\r``)."""
    return line.endswith("\r")


class OutputSplitter:
    """Splits a task's output bytes into lines as they arrive: at ``\\n``, ``\\r\\n`` and a lone ``\\r``.

    A line ended by a lone ``\\r`` is a progress update and keeps its ``\\r``; other lines have no line break.
    The backspaces right before a break (Keras erases its bar with them before the ``\\r``) are dropped, and
    so is a progress update with nothing left in it. A ``\\r`` at the end of a chunk waits for the next one:
    it may be the first half of ``\\r\\n``. UTF-8 characters split between chunks are decoded whole.

    Example:
        >>> split = OutputSplitter()
        >>> split.feed(b"Epoch 1/2\\n\\r1/3 [=>..]\\x08\\x08\\r2/3 [==>.]"), split.feed(b"\\r3/3 [===]\\n")
        (['Epoch 1/2', '1/3 [=>..]\\r'], ['2/3 [==>.]\\r', '3/3 [===]'])
        >>> split.feed(b"half a line"), split.finish()
        ([], ['half a line'])
    """

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._pending = ""

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` completes, in order."""
        text = self._pending + self._decode(data)
        lines: list[str] = []
        start = 0
        for brk in _BREAKS.finditer(text):
            if brk.group() == "\r" and brk.end() == len(text):
                break  # Perhaps '\r\n' split between two reads: decided by the next byte.
            _append(lines, text[start : brk.start()], progress=brk.group() == "\r")
            start = brk.end()
        while len(text) - start > _MAX_LINE:
            _append(lines, text[start : start + _MAX_LINE], progress=False)
            start += _MAX_LINE
        self._pending = text[start:]
        return lines

    def finish(self) -> list[str]:
        """At the end of the output: the last line, if it had no line break."""
        text, self._pending = self._pending + self._decode(b"", True), ""
        lines: list[str] = []
        if text:
            progress = text.endswith("\r")
            _append(lines, text[:-1] if progress else text, progress=progress)
        return lines


def _append(lines: list[str], segment: str, *, progress: bool) -> None:
    segment = segment.rstrip("\b")
    if not progress:
        lines.append(segment)
    elif segment.strip():
        lines.append(segment + "\r")


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Every line of ``stream`` (:class:`OutputSplitter`'s), each as soon as it ends, until end of file."""
    read = getattr(stream, "read1", stream.read)  # read1: what the pipe holds, without waiting for more.
    splitter = OutputSplitter()
    while data := read(_CHUNK):
        yield from splitter.feed(data)
    yield from splitter.finish()


def pump_lines(streams: Sequence[IO[bytes] | None], emit: Callable[[str], None]) -> None:
    """Reads each of a program's ``streams`` line by line until all end; ``emit`` gets one line at a time.

    A task's stdout and stderr are separate pipes, so a line is never cut by the other stream's output:
    an unbuffered Python ``print`` writes its text and its newline in two calls, and a TensorFlow log line
    written by a C++ thread in between would otherwise land in the middle (``EPOCH_END 5W0000 ...``), where
    a ``--kill ...@after=^...$`` trigger no longer matches. The first stream is read in the calling thread,
    the others in threads of their own (a None, a stream not piped, is left out); it returns when every
    stream has ended (each is closed). Each stream's lines keep their order; lines of two streams come
    in the order they are read.

    Example:
        >>> import subprocess, sys
        >>> code = "import sys; sys.stdout.write('out' + chr(10)); sys.stderr.write('err' + chr(10))"
        >>> proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        >>> lines = []
        >>> pump_lines([proc.stdout, proc.stderr], lines.append); proc.wait(); sorted(lines)
        0
        ['err', 'out']
    """
    lock, piped = threading.Lock(), [s for s in streams if s is not None]

    def _read(stream: IO[bytes]) -> None:
        try:
            for line in read_lines(stream):
                with lock:
                    emit(line)
        finally:
            stream.close()

    others = [threading.Thread(target=_read, args=(s,), name="tfdist-output", daemon=True) for s in piped[1:]]
    for thread in others:
        thread.start()
    try:
        if piped:
            _read(piped[0])
    finally:
        for thread in others:
            thread.join()


def console_task(*, chief: bool) -> str:
    """The task ``--console chief`` shows: the chief when the cluster has one, else worker:0."""
    return "chief:0" if chief else "worker:0"


def console_sink(
    write: Callable[[str], None],
    *,
    tasks: Collection[str] | None = None,
    progress_seconds: float = PROGRESS_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> LineSink:
    """The sink tfdist-launch prints task output with: ``write`` gets ``"[task] line\\n"``, one call per line.

    Calls of ``write`` never overlap (the tasks' readers are threads). Of a task's progress updates
    (:func:`is_progress`), one is written when ``progress_seconds`` have passed since the last one written
    (the first at once), without its ``\\r``; the others are left out. Every other line is written.
    ``tasks``: only these tasks' lines (None: every task's).

    Example:
        >>> out = []
        >>> sink = console_sink(out.append, clock=iter([0.0, 1.0, 12.0]).__next__)
        >>> for line in ("Epoch 1/1", "1/3 [>..]\\r", "2/3 [=>.]\\r", "3/3 [==>]\\r", "3/3 [===] - loss: 0.5"):
        ...     sink("worker:0", line)
        >>> out
        ['[worker:0] Epoch 1/1\\n', '[worker:0] 1/3 [>..]\\n', '[worker:0] 3/3 [==>]\\n', '[worker:0] 3/3 [===] - loss: 0.5\\n']
    """
    lock = threading.Lock()
    shown: dict[str, float] = {}  # task -> when its last progress update was written

    def _sink(task: str, line: str) -> None:
        if tasks is not None and task not in tasks:
            return
        if is_progress(line):
            now = clock()
            if task in shown and now - shown[task] < progress_seconds:
                return
            shown[task] = now
            line = line[:-1]
        with lock:
            write(f"[{task}] {line}\n")

    return _sink
