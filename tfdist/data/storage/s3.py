"""``s3://`` through boto3, for TensorFlow versions where tensorflow-io cannot load (2.18+) or is absent.

TensorFlow reads only files its own file systems know. Where ``s3`` is not
registered, tfdist lists objects with boto3 and *stages* each worker's shards
into a bounded local cache (parallel ranged downloads of one object, several
objects at once, ahead of the reader), and ``tf.data.TFRecordDataset`` reads
the local copies: the same tf.data pipeline, the same framing checks.
Writes go to a local file that is uploaded (multipart) when it is closed.

Configuration, the same variables as tensorflow-io so one environment serves both:

- endpoint: ``AWS_ENDPOINT_URL`` (boto3's), else ``S3_ENDPOINT`` (tensorflow-io's;
  ``host:port`` gets ``https://`` unless ``S3_USE_HTTPS=0``); ``S3_VERIFY_SSL=0``
  turns certificate checks off;
- credentials and region: boto3's usual chain (``AWS_ACCESS_KEY_ID``,
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, profiles, roles);
- cache: ``TFDIST_S3_CACHE_DIR`` (default: a private temporary directory
  removed at exit) and ``TFDIST_S3_CACHE_MB`` (default 4096; the least recently
  staged files beyond it are deleted; open readers keep their copy).

Example:
    >>> from tfdist.data.storage.s3 import split_url, glob_regex
    >>> split_url("s3://bucket/train/part-00000")
    ('bucket', 'train/part-00000')
    >>> bool(glob_regex("train/part-*").match("train/part-1")), bool(glob_regex("train/*").match("train/a/b"))
    (True, False)
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import re
import shutil
import tempfile
import threading
import weakref
from typing import Any

from tfdist.errors import DataError, StorageError, invalid
from tfdist.runtime.versions import install_hint

_log = logging.getLogger("tfdist.data")
_CHUNK = 8 << 20


def split_url(url: str) -> tuple[str, str]:
    """('bucket', 'key') of ``s3://bucket/key``."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise invalid(DataError, "path", url, "an s3://bucket/key URL")
    bucket, _, key = url[5:].partition("/")
    return bucket, key


def glob_regex(pattern: str) -> re.Pattern[str]:
    """TF's glob on object keys: ``*`` and ``?`` stay within one ``/`` level, ``[...]`` as usual."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and "]" in pattern[i + 1 :]:
            end = pattern.index("]", i + 1)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def endpoint_from_env(env: dict[str, str] | None = None) -> tuple[str | None, bool]:
    """(endpoint URL or None, verify TLS) from AWS_ENDPOINT_URL / S3_ENDPOINT, S3_USE_HTTPS, S3_VERIFY_SSL."""
    env = dict(os.environ) if env is None else env
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or env.get("S3_ENDPOINT") or None
    if endpoint and "://" not in endpoint:
        endpoint = ("http://" if env.get("S3_USE_HTTPS", "1") == "0" else "https://") + endpoint
    return endpoint, env.get("S3_VERIFY_SSL", "1") != "0"


class _Upload:
    """A local file that becomes an S3 object on ``close()``."""

    def __init__(self, owner: S3Store, url: str, text: bool) -> None:
        self._owner, self._url = owner, url
        fd, self.name = tempfile.mkstemp(prefix="upload-", dir=owner.cache_dir)
        self._file: Any = os.fdopen(fd, "w" if text else "wb")

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def close(self) -> None:
        if self._file.closed:
            return
        self._file.close()
        try:
            self._owner.upload(self.name, self._url)
        finally:
            os.unlink(self.name)

    def __enter__(self) -> _Upload:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class S3Store:
    """Lists, stages, opens and writes ``s3://`` objects through boto3, with a bounded local cache.

    Thread-safe; one per process (:func:`store`). A staged copy is used only
    while the object's size and ETag, as last listed or stat'ed, are those it
    was downloaded with: a rewritten object is fetched again.
    """

    def __init__(
        self, *, cache_dir: str | None = None, cache_bytes: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        env = dict(os.environ) if env is None else env
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
            from botocore.config import Config
        except ImportError as err:
            raise StorageError(
                f"Reading s3:// without tensorflow-io needs boto3: {install_hint('s3')}.",
                field="s3 reader",
                value="boto3 missing",
                fix=install_hint("s3"),
            ) from err
        endpoint, verify = endpoint_from_env(env)
        self.endpoint = endpoint
        session = boto3.session.Session(  # None falls back to boto3's chain (profiles, roles, ...).
            aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
            aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
            aws_session_token=env.get("AWS_SESSION_TOKEN"),
            region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        )
        self._client = session.client(
            "s3",
            endpoint_url=endpoint,
            verify=verify,
            config=Config(max_pool_connections=64, retries={"max_attempts": 8, "mode": "adaptive"}),
        )
        self._transfer = TransferConfig(multipart_threshold=_CHUNK, multipart_chunksize=_CHUNK, max_concurrency=8)
        self._own_dir = cache_dir is None and not env.get("TFDIST_S3_CACHE_DIR")
        self.cache_dir = cache_dir or env.get("TFDIST_S3_CACHE_DIR") or tempfile.mkdtemp(prefix="tfdist-s3-")
        os.makedirs(self.cache_dir, exist_ok=True)
        self.cache_bytes = cache_bytes if cache_bytes is not None else int(env.get("TFDIST_S3_CACHE_MB", "4096")) << 20
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}
        self._etags: dict[str, str] = {}
        self._staged: collections.OrderedDict[str, tuple[str, int, str]] = collections.OrderedDict()
        self._pending: dict[str, threading.Event] = {}
        if self._own_dir:
            weakref.finalize(self, shutil.rmtree, self.cache_dir, True)

    # ---- listing
    def glob(self, pattern: str) -> list[str]:
        """The ``s3://`` URLs whose keys match ``pattern`` (TF glob rules), sorted; sizes are remembered."""
        bucket, key_pattern = split_url(pattern)
        prefix = re.split(r"[*?\[]", key_pattern, maxsplit=1)[0]
        regex = glob_regex(key_pattern)
        found = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    if regex.match(item["Key"]):
                        url = f"s3://{bucket}/{item['Key']}"
                        self._sizes[url] = int(item["Size"])
                        self._etags[url] = str(item.get("ETag", ""))
                        found.append(url)
        except Exception as err:
            raise self._error("list", pattern, err) from err
        return sorted(found)

    def size(self, url: str) -> int:
        """The object's size in bytes."""
        if url not in self._sizes:
            bucket, key = split_url(url)
            try:
                head = self._client.head_object(Bucket=bucket, Key=key)
                self._sizes[url], self._etags[url] = int(head["ContentLength"]), str(head.get("ETag", ""))
            except Exception as err:
                raise self._error("stat", url, err) from err
        return self._sizes[url]

    def version(self, url: str, *, fresh: bool = False) -> tuple[int, str]:
        """(size, ETag) of the object as last listed or stat'ed; ``fresh`` stats it again now."""
        if fresh:
            self._sizes.pop(url, None)
        return self.size(url), self._etags.get(url, "")

    def fetch(self, url: str, local: str, *, expect: tuple[int, str] | None = None) -> int:
        """Downloads the object into ``local`` (parallel ranged parts), outside the cache; returns its size.

        Args:
          url: The ``s3://`` object.
          local: The file to write (replaced).
          expect: (size, ETag) the caller listed: a different object now raises
            instead of handing over other bytes than those listed and verified.

        Raises:
          StorageError: The object cannot be read, or is no longer ``expect``.
        """
        if expect is not None and self.version(url, fresh=True) != tuple(expect):
            found = self.version(url)
            raise StorageError(
                f"{url} changed since it was listed: size and ETag {found}, listed {tuple(expect)}. "
                "Build the dataset again to read the new version.",
                field="path",
                value=url,
                expected=f"size and ETag {tuple(expect)}",
                fix="Build the dataset again.",
            )
        bucket, key = split_url(url)
        try:
            self._client.download_file(bucket, key, local, Config=self._transfer)
        except Exception as err:
            raise self._error("read", url, err) from err
        size = os.path.getsize(local)
        # Checked again after the download: a rewrite while it ran (parts of two versions) is refused too.
        if expect is not None and (size != expect[0] or self.version(url, fresh=True) != tuple(expect)):
            raise StorageError(
                f"{url} changed while it was read: {size} bytes, listed size and ETag {tuple(expect)}.",
                field="path",
                value=url,
                fix="Build the dataset again.",
            )
        return size

    def exists(self, url: str) -> bool:
        """Whether the object exists."""
        try:
            self.size(url)
        except StorageError:
            return False
        return True

    # ---- reading
    def stage(self, url: str) -> str:
        """A local path holding the object's bytes: from the cache, or downloaded now (parallel ranges)."""
        while True:
            with self._lock:
                hit = self._staged.get(url)
                if (
                    hit is not None
                    and os.path.exists(hit[0])
                    and hit[1:] == (self._sizes.get(url, hit[1]), self._etags.get(url, hit[2]))
                ):
                    self._staged.move_to_end(url)
                    return hit[0]
                if hit is not None:  # Rewritten since it was staged (or its copy is gone): fetch it again.
                    self._staged.pop(url)
                    if os.path.exists(hit[0]):
                        os.unlink(hit[0])
                waiter = self._pending.get(url)
                if waiter is None:
                    self._pending[url] = threading.Event()
                    break
            waiter.wait()
        try:
            local = self._download(url)
        finally:
            with self._lock:
                self._pending.pop(url).set()
        return local

    def _download(self, url: str) -> str:
        _, key = split_url(url)
        etag = self._etags.get(url, "")  # The version listed: a later listing that differs fetches again.
        fd, local = tempfile.mkstemp(prefix="obj-", suffix="-" + os.path.basename(key), dir=self.cache_dir)
        os.close(fd)
        try:
            size = self.fetch(url, local)
        except StorageError:
            os.unlink(local)
            raise
        self._sizes[url] = size
        with self._lock:
            self._staged[url] = (local, size, etag)
            self._evict()
        return local

    def _evict(self) -> None:
        """Deletes the least recently staged copies beyond the budget (always keeps the newest one)."""
        total = sum(size for _, size, _ in self._staged.values())
        while total > self.cache_bytes and len(self._staged) > 1:
            _, (path, size, _) = self._staged.popitem(last=False)
            total -= size
            try:
                os.unlink(path)  # A reader that opened it keeps reading: POSIX unlink semantics.
            except FileNotFoundError:
                pass

    def open(self, url: str, mode: str = "rb") -> Any:
        """A file object: a staged local copy for reading, an upload-on-close file for writing."""
        if mode in ("r", "rb"):
            return open(self.stage(url), mode)
        if mode in ("w", "wb"):
            return _Upload(self, url, text=mode == "w")
        raise invalid(DataError, "mode", mode, "'r', 'rb', 'w' or 'wb'")

    # ---- writing
    def upload(self, local: str, url: str) -> None:
        """Uploads a local file as the object ``url`` (multipart for large files)."""
        bucket, key = split_url(url)
        try:
            self._client.upload_file(local, bucket, key, Config=self._transfer)
        except Exception as err:
            raise self._error("write", url, err) from err
        self._sizes[url] = os.path.getsize(local)
        self._etags.pop(url, None)
        self._forget(url)

    def remove(self, url: str) -> None:
        """Deletes the object ``url``."""
        bucket, key = split_url(url)
        try:
            self._client.delete_object(Bucket=bucket, Key=key)
        except Exception as err:
            raise self._error("remove", url, err) from err
        self._sizes.pop(url, None)
        self._etags.pop(url, None)
        self._forget(url)

    def _forget(self, url: str) -> None:
        """Drops the staged copy of ``url`` (the object changed), file included."""
        with self._lock:
            old = self._staged.pop(url, None)
        if old is not None and os.path.exists(old[0]):
            os.unlink(old[0])

    def _error(self, action: str, url: str, err: Exception) -> StorageError:
        return StorageError(
            f"Cannot {action} {url} through boto3 (endpoint {self.endpoint or 'AWS default'}): {err}. "
            "Check the bucket, AWS_ENDPOINT_URL or S3_ENDPOINT, and the AWS credential variables.",
            field="path",
            value=url,
            fix="Check the bucket, endpoint and credentials.",
        )


@functools.cache
def store() -> S3Store:
    """The process's S3 store (configured from the environment when first used)."""
    return S3Store()
