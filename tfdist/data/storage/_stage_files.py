"""The stage root's file protocol shared by staging agents: pid locks, partial files, error files.

Every name here works on one path and is safe when several agents of one host (one per TF server) race on
it: a lock is a file created exclusively that holds its owner's pid, and a lock, partial download or error
draft whose process is gone is taken over or swept.

Example:
    >>> import os, tempfile
    >>> lock = os.path.join(tempfile.mkdtemp(), ".lock-x")
    >>> claim(lock), claim(lock)  # ours now; a second claim of a live owner's lock fails
    (True, False)
    >>> unlink(lock); claim(lock)
    True
"""

from __future__ import annotations

import logging
import os
import threading
import time

_log = logging.getLogger("tfdist.data")
_CLAIMING_S = 5.0  # An empty lock this young is being claimed (created, its pid not written yet): not dead.


def sweep(objects: str) -> None:
    """Deletes partial downloads, error drafts and locks of processes gone (a server killed mid-download)."""
    for entry in os.scandir(objects):
        if entry.name.startswith(".lock-"):
            try:
                with open(entry.path) as f:
                    pid = int(f.read() or "0")
            except (OSError, ValueError):
                continue  # Being written: its owner is alive.
        elif entry.name.startswith(".part-error-"):
            pid = int(entry.name.split("-")[2]) if entry.name.split("-")[2].isdigit() else 0
        elif entry.name.startswith(".part-"):
            pid = int(entry.name.rsplit("-", 1)[1]) if entry.name.rsplit("-", 1)[1].isdigit() else 0
        else:
            continue
        if pid and not alive(pid):
            unlink(entry.path)
            _log.info("Removed %s, left by process %d (gone).", entry.path, pid)


def claim(lock: str) -> bool:
    """Takes ``lock`` (a file holding our pid); a lock whose process is gone is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            try:
                with open(lock) as f:
                    text = f.read()
                if not text and time.time() - os.stat(lock).st_mtime < _CLAIMING_S:
                    return False  # Created a moment ago, its pid not written yet: another agent is claiming it.
                owner = int(text or "0")
            except FileNotFoundError:
                continue  # Released between our two looks: try again.
            except ValueError:
                owner = 0
            if owner and alive(owner):
                return False
            unlink(lock)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_error(path: str, message: str) -> None:
    partial = os.path.join(os.path.dirname(path), f".part-error-{os.getpid()}-{threading.get_ident()}")
    with open(partial, "w") as f:
        f.write(message)
    os.replace(partial, path)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
