"""``s3://`` through boto3 for input pipelines that run inside a TF server: PS workers, tf.data service workers.

ParameterServerStrategy traces a dataset function once on the coordinator and
runs the graph on each worker's TF server; the tf.data service runs it on its
workers. There a ``tf.py_function`` cannot run, and TensorFlow opens only files
of its registered file systems. Every such server tfdist starts
(``python -m tfdist.launch.tasks.server`` or :func:`tfdist.launch.run_server` on a
worker task, ``tfdist data-service``, :class:`~tfdist.data.LocalDataService`) runs a :class:`StagingAgent` thread,
and the two sides talk through files in one directory per host, the *stage
root* (``TFDIST_S3_STAGE_DIR``, default ``$TMPDIR/tfdist-s3-stage-UID``):

- the graph (:class:`StagedReads`) names each object's copy
  ``objects/DIGEST.staged``, DIGEST a hash of its URL, size and ETag as the
  coordinator listed (and verified) them;
- ahead of the reader, in reading order, it writes ``want/DIGEST`` (URL, size,
  ETag): the agent downloads the object (boto3, parallel ranged parts, several
  objects at once), checks it is still the listed version (before and after), renames it into
  place; a failure becomes ``objects/DIGEST.staged.error``;
- right before opening a copy, the graph polls for it with TF ops
  (``tf.io.matching_files`` between sleeps of tf.data's ``SleepDataset``),
  asking again while it is missing, and fails with the agent's error or after
  ``TFDIST_S3_STAGE_TIMEOUT`` seconds (default 600) with one naming the fix.

Copies are shared by the servers of one host (same bytes, same name). Each
agent keeps the directory under ``TFDIST_S3_CACHE_MB`` (default 4096) by
deleting the least recently requested copies, never the last ones (over
budget, with a warning, instead): a reader keeps a copy it has opened, and one
deleted before it was opened is requested again.

Example:
    >>> from tfdist.data.storage.staging import staged_name
    >>> staged_name("s3://bucket/part-0", 10, '"etag"') == staged_name("s3://bucket/part-0", 10, '"etag"')
    True
    >>> staged_name("s3://bucket/part-0", 10, '"etag"') == staged_name("s3://bucket/part-0", 11, '"etag"')
    False
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from tfdist.data.storage._stage_files import claim as _claim
from tfdist.data.storage._stage_files import sweep as _sweep
from tfdist.data.storage._stage_files import unlink as _unlink
from tfdist.data.storage._stage_files import write_error as _write_error
from tfdist.errors import DataError, StorageError, invalid, require_int

_log = logging.getLogger("tfdist.data")
_STAGE_DIR_ENV = "TFDIST_S3_STAGE_DIR"
_STAGE_TIMEOUT_ENV = "TFDIST_S3_STAGE_TIMEOUT"
SUFFIX = ".staged"
_POLL_S = 0.05  # Reader's poll interval, and the agent's scan interval.
_ERROR_TTL_S = 10.0  # An error file lives this long (readers poll far more often); a later request retries.
_FETCHES = 4  # Objects one agent downloads at once (each in parallel ranged parts).
_STALE_WANT_S = 3600.0  # A request this old (readers renew theirs while they wait) was left by a reader gone.
_CACHE_MB_ENV = "TFDIST_S3_CACHE_MB"
_KEEP_RECENT = 32  # Eviction spares the copies requested last (readers' files ahead, one about to be opened) ...
_KEEP_RECENT_S = 60.0  # ... and those requested this recently: over budget (with a warning) rather than deleted.


def stage_root(env: Mapping[str, str] | None = None) -> str:
    """The host's stage directory: ``TFDIST_S3_STAGE_DIR``, else ``$TMPDIR/tfdist-s3-stage-UID``."""
    env = os.environ if env is None else env
    return env.get(_STAGE_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"tfdist-s3-stage-{os.getuid()}")


def staged_name(url: str, size: int, etag: str) -> str:
    """The digest naming one version of an object in the stage root."""
    return hashlib.sha256(f"{url}\n{size}\n{etag}".encode()).hexdigest()[:32]


def _timeout(env: Mapping[str, str] | None = None) -> float:
    raw = (os.environ if env is None else env).get(_STAGE_TIMEOUT_ENV, "600")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < 7 * 86400:
        raise invalid(DataError, _STAGE_TIMEOUT_ENV, raw, "seconds in (0, 604800)", "Unset it for 600 s.")
    return seconds


def _cache_bytes(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(_CACHE_MB_ENV, "4096")
    try:
        value: Any = int(raw)
    except ValueError:
        value = raw
    return (
        require_int(
            DataError,
            _CACHE_MB_ENV,
            value,
            minimum=1,
            fix="Set a whole number of MiB (e.g. 4096 for 4 GiB), or unset it for 4096.",
        )
        << 20
    )


# ------------------------------------------------------------------------------------------------ graph side
class StagedReads:
    """The graph side for one dataset: request copies ahead of the reader, wait for each before opening it.

    Build it inside the dataset function (its lookup tables belong to that graph).

    Args:
      versions: URL -> (size, ETag) as listed: the copy must be this version.
      root: The stage root as the servers see it (default :func:`stage_root`).
      timeout: Seconds to wait for one copy (default ``TFDIST_S3_STAGE_TIMEOUT``, 600).
    """

    def __init__(
        self, versions: Mapping[str, tuple[int, str]], *, root: str | None = None, timeout: float | None = None
    ) -> None:
        import tensorflow as tf

        self.root = root or stage_root()
        self.timeout = timeout if timeout is not None else _timeout()
        # Written by the first wait of this dataset that times out: the other files in flight stop waiting too.
        self._gave_up = os.path.join(self.root, "gaveup", uuid.uuid4().hex)
        urls = sorted(versions)
        names = [staged_name(url, *versions[url]) for url in urls]
        self._names = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(urls or [""]), tf.constant(names or [""])), ""
        )
        self._requests = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(urls or [""]),
                tf.constant([f"{u}\n{versions[u][0]}\n{versions[u][1]}\n" for u in urls] or [""]),
            ),
            "",
        )

    def _paths(self, url: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        name = self._names.lookup(url)
        return (tf.strings.join([self.root, "/objects/", name, SUFFIX]), tf.strings.join([self.root, "/want/", name]))

    def request(self, files: Any, *, ahead: int) -> Any:
        """(URL, staged path) pairs of a dataset of URLs; each is requested ``ahead`` files before it is read."""
        import tensorflow as tf

        def one(url: Any) -> Any:
            local, want = self._paths(url)
            with tf.control_dependencies([tf.io.write_file(want, self._requests.lookup(url))]):
                return url, tf.identity(local)

        return files.map(one).prefetch(max(1, ahead))  # Sequential: in order, no `deterministic` warning.

    def wait(self, url: Any, local: Any) -> Any:
        """``local`` once the copy exists: a TF op that blocks, polling between sleeps (graph-safe).

        When the op runs, it raises ``tf.errors.InvalidArgumentError`` with the
        agent's error, or after ``timeout`` seconds with one naming the fix. The
        first file of this dataset to time out ends the other files' waits at
        their next poll (the dataset fails anyway): a reader with no agent fails
        after one timeout, not one per file in flight, and its iterator's
        teardown never waits out the rest.
        """
        import tensorflow as tf

        _, want = self._paths(url)
        polls = max(1, int(self.timeout / _POLL_S))
        copy_or_error = tf.strings.join([local, "*"])

        def exists(pattern: Any) -> Any:
            return tf.size(tf.io.matching_files(pattern)) > 0

        def waiting(_: Any) -> Any:
            found = exists(copy_or_error)
            # Asked again while missing: the first request may have been served and its copy evicted since.
            again = tf.cond(found, tf.no_op, lambda: tf.io.write_file(want, self._requests.lookup(url)))
            with tf.control_dependencies([again]):
                return tf.logical_not(tf.logical_or(found, exists(self._gave_up)))

        attempts = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).concatenate(
            _sleep(tf.data.Dataset.range(1, polls + 1), _POLL_S)
        )
        waited = attempts.map(waiting).take_while(lambda w: w).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
        error = tf.strings.join([local, ".error"])
        with tf.control_dependencies([waited]):  # Looked at after the wait, not in parallel with it.
            ready = exists(copy_or_error)
            failed = exists(error)
        why = tf.cond(failed, lambda: tf.io.read_file(error), lambda: tf.constant(""))
        give_up = tf.cond(ready, tf.no_op, lambda: tf.io.write_file(self._gave_up, url))
        with tf.control_dependencies([give_up]):
            checks = [
                tf.debugging.Assert(tf.logical_not(failed), ["Staging", url, "failed:", why], summarize=1),
                tf.debugging.Assert(
                    ready,
                    [
                        url,
                        f"was not staged within {self.timeout:g}s into",
                        local,
                        "Is a tfdist staging agent "
                        "running on this TF server (workers started by tfdist-launch, the tfdist.launch.tasks.server "
                        "program or tfdist.launch.run_server, `tfdist data-service` or LocalDataService), with "
                        f"{_STAGE_DIR_ENV} the same as on the coordinator ({self.root})? Raise {_STAGE_TIMEOUT_ENV} "
                        "for very large objects.",
                    ],
                    summarize=1,
                ),
            ]
        with tf.control_dependencies(checks):
            return tf.identity(local)


def _sleep(dataset: Any, seconds: float) -> Any:
    """``dataset`` with a pause before each element (tf.data's SleepDataset, through public raw ops)."""
    import tensorflow as tf

    variant = tf.raw_ops.SleepDataset(
        input_dataset=tf.data.experimental.to_variant(dataset),
        sleep_microseconds=int(seconds * 1e6),
        output_types=[tf.int64],
        output_shapes=[[]],
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


# ------------------------------------------------------------------------------------------------ agent side
class StagingAgent:
    """Serves the stage root's requests with boto3 (a daemon thread plus a few download threads).

    Args:
      root: The stage root (default :func:`stage_root`).
      cache_bytes: Budget of staged copies (default ``TFDIST_S3_CACHE_MB``, 4096).
      store: Returns the :class:`~tfdist.data.storage.s3.S3Store` (default the process's,
        made on the first request, so servers without S3 never import boto3).
      keep_recent: Eviction never deletes this many most recently requested copies.
      keep_recent_s: Nor copies requested within this many seconds.
    """

    def __init__(
        self,
        *,
        root: str | None = None,
        cache_bytes: int | None = None,
        store: Callable[[], Any] | None = None,
        keep_recent: int = _KEEP_RECENT,
        keep_recent_s: float = _KEEP_RECENT_S,
    ) -> None:
        self.root = root or stage_root()
        self.cache_bytes = cache_bytes if cache_bytes is not None else _cache_bytes()
        self._store = store
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._announced = False  # Said once, at the first request: a server that never reads s3:// says nothing.
        # Daemon download threads: a process that is done never waits at exit for a download no one reads.
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._workers: list[threading.Thread] = []
        self._thread: threading.Thread | None = None
        self.staged = 0  # Objects this agent downloaded.
        self.keep_recent = keep_recent
        self.keep_recent_s = keep_recent_s
        self._over = False  # Over budget at the last eviction (warned once).

    def start(self) -> StagingAgent:
        """Starts serving; a stage root it cannot create is logged (readers then say no agent answered).

        Raises:
          StorageError: The stage root is another user's, or others may write
            in it (its default name in ``$TMPDIR`` is predictable).
        """
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            _check_private(self.root)
            for sub in ("want", "objects"):
                os.makedirs(os.path.join(self.root, sub), mode=0o700, exist_ok=True)
            _sweep(os.path.join(self.root, "objects"))
        except OSError as err:
            _log.warning(
                "Staging agent not started: cannot create %s (%s). Set %s to a writable directory, the "
                "same for every task.",
                self.root,
                err,
                _STAGE_DIR_ENV,
            )
            return self
        self._workers = [
            threading.Thread(target=self._fetch, name=f"tfdist-stage-{i}", daemon=True) for i in range(_FETCHES)
        ]
        for worker in self._workers:
            worker.start()
        self._thread = threading.Thread(target=self._serve, name="tfdist-staging-agent", daemon=True)
        self._thread.start()
        _log.debug("Staging agent watching %s for s3:// requests.", self.root)
        return self

    def stop(self) -> None:
        """Stops serving: queued requests are dropped, downloads under way finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        while True:
            try:
                name = self._queue.get_nowait()
            except queue.Empty:
                break
            if name is not None:
                with self._lock:
                    self._busy.discard(name)
        for _ in self._workers:
            self._queue.put(None)
        for worker in self._workers:
            worker.join()
        self._workers = []

    def _fetch(self) -> None:
        while (name := self._queue.get()) is not None:
            self._serve_one(name)

    def __enter__(self) -> StagingAgent:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _serve(self) -> None:
        wants = os.path.join(self.root, "want")
        scans = 0
        while not self._stop.wait(_POLL_S):
            scans += 1
            try:
                entries = sorted(os.scandir(wants), key=lambda e: e.stat().st_mtime_ns)
            except FileNotFoundError:  # Removed under us (a test's cleanup): make it again.
                os.makedirs(wants, exist_ok=True)
                continue
            except OSError as err:
                _log.warning("Staging agent cannot scan %s: %s", wants, err)
                continue
            now = time.time()
            for entry in entries:
                try:
                    if entry.stat().st_uid != os.getuid():  # Not this user's request: never served.
                        continue
                    if now - entry.stat().st_mtime > _STALE_WANT_S:  # Left by a reader long gone: no one waits.
                        _unlink(entry.path)
                        continue
                except FileNotFoundError:
                    continue
                with self._lock:
                    if entry.name in self._busy:
                        continue
                    self._busy.add(entry.name)
                self._queue.put(entry.name)
            if scans % 20 == 0:  # About once a second.
                self._expire_errors()

    def _serve_one(self, name: str) -> None:
        if not self._announced:
            self._announced = True
            _log.info("Staging agent serving s3:// requests in %s.", self.root)
        want = os.path.join(self.root, "want", name)
        try:
            with open(want) as f:
                lines = f.read().split("\n")
            if len(lines) < 4 or staged_name(lines[0], int(lines[1]), lines[2]) != name:
                return  # Being written, or not a request: the next scan sees it whole.
            self._stage(name, lines[0], (int(lines[1]), lines[2]))
            _unlink(want)
        except FileNotFoundError:
            pass  # Served by another agent of this host.
        except Exception:
            _log.exception("Staging agent failed on %s.", want)
        finally:
            with self._lock:
                self._busy.discard(name)

    def _stage(self, name: str, url: str, version: tuple[int, str]) -> None:
        objects = os.path.join(self.root, "objects")
        local = os.path.join(objects, name + SUFFIX)
        if os.path.exists(local):
            os.utime(local)  # Requested again: most recently used.
            return
        lock = os.path.join(objects, f".lock-{name}")
        if not _claim(lock):
            return  # Another agent of this host is fetching it.
        if os.path.exists(local):  # It finished between our look and our claim.
            _unlink(lock)
            return
        partial = os.path.join(objects, f".part-{name}-{os.getpid()}")
        try:
            start = time.monotonic()
            store = self._store() if self._store is not None else _default_store()
            size = store.fetch(url, partial, expect=version)
            os.replace(partial, local)
            _unlink(local + ".error")  # An earlier attempt's error must not fail a later wait.
            with self._lock:
                self.staged += 1
            _log.debug("Staged %s (%d bytes) in %.2fs.", url, size, time.monotonic() - start)
        except (StorageError, DataError, OSError) as err:
            _unlink(partial)
            _write_error(local + ".error", str(err))
            _log.warning("Staging %s failed: %s", url, err)
        finally:
            _unlink(lock)
        self._evict()

    def _evict(self) -> None:
        """Deletes the least recently requested copies beyond the budget, never the most recent ones.

        A copy's mtime is its last request (staged, or requested again). The
        newest ``keep_recent`` and any requested in the last ``keep_recent_s``
        seconds may be read soon (requested ahead, or seen by a reader about to
        open it): the directory goes over budget instead, with a warning.
        Partial downloads count toward the total.
        """
        objects = os.path.join(self.root, "objects")
        copies, total = [], 0
        for entry in os.scandir(objects):
            if not (entry.name.endswith(SUFFIX) or entry.name.startswith(".part-")):
                continue
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            total += stat.st_size
            if entry.name.endswith(SUFFIX):
                copies.append((stat.st_mtime, stat.st_size, entry.path))
        copies.sort()
        recent = time.time() - self.keep_recent_s
        evictable = [c for c in copies[: max(0, len(copies) - self.keep_recent)] if c[0] < recent]
        for _, size, path in evictable:
            if total <= self.cache_bytes:
                break
            _unlink(path)  # A reader that opened it keeps reading it (POSIX unlink).
            total -= size
        if total > self.cache_bytes and not self._over:
            _log.warning(
                "Stage root %s holds %d MiB, over %s=%d: its copies were requested recently, so none is deleted yet.",
                objects,
                total >> 20,
                _CACHE_MB_ENV,
                self.cache_bytes >> 20,
            )
        self._over = total > self.cache_bytes

    def _expire_errors(self) -> None:
        objects = os.path.join(self.root, "objects")
        now = time.time()
        try:
            for entry in os.scandir(objects):
                if entry.name.endswith(".error") and now - entry.stat().st_mtime > _ERROR_TTL_S:
                    _unlink(entry.path)
        except FileNotFoundError:
            os.makedirs(objects, exist_ok=True)


def _check_private(root: str) -> None:
    """Refuses a stage root another user owns or may write in (they could plant or swap copies)."""
    info = os.stat(root)
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        fix = f"Remove it, or set {_STAGE_DIR_ENV} to a directory of yours (chmod 700), the same for every task."
        raise StorageError(
            f"Stage root {root} is owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}: another user "
            f"could plant or replace staged copies there. {fix}",
            field=_STAGE_DIR_ENV,
            value=root,
            expected=f"a directory owned by uid {os.getuid()}, not group/other writable",
            fix=fix,
        )


def _default_store() -> Any:
    from tfdist.data.storage import s3

    return s3.store()


_AGENT: StagingAgent | None = None
_AGENT_LOCK = threading.Lock()


def ensure_agent() -> StagingAgent:
    """This process's staging agent, started on first call (TF servers tfdist starts call it)."""
    global _AGENT
    with _AGENT_LOCK:
        if _AGENT is None:
            _AGENT = StagingAgent().start()
        return _AGENT
