"""End a process with the right exit code when native code would abort at exit.

After any S3 access, tensorflow-io's file system aborts the process during
interpreter teardown ("pure virtual method called", exit 134; upstream
tensorflow/io#2039). A job scheduler then marks a successful training job as
failed. :func:`exit_cleanly` is the opt-in fix: it runs ``main``, works out
the exit code the way Python would, runs the ``atexit`` handlers, flushes
logging and the standard streams, then leaves with ``os._exit(code)`` before
native destructors can run.

It also makes the workers of a MultiWorkerMirroredStrategy cluster leave
together: TF's ring all-reduce pulls each chunk from its sender, so a worker
that exits right after its last collective can fail a slower peer still
pulling from it ("RecvBuf ... Socket closed", seen at the end of fit). A worker
whose ``main`` succeeded waits (up to 60 s) until every chief and worker task
got there too.

Example:
    >>> from tfdist.runtime import exit_code_of
    >>> exit_code_of(None), exit_code_of(3), exit_code_of("failed")  # The code Python gives sys.exit(value).
    (0, 3, 1)

At the end of a script (not run here: it ends the process)::

    if __name__ == "__main__":
        tfdist.exit_cleanly(main)
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from tfdist.runtime import exit_codes

__all__ = ["exit_cleanly", "exit_code_for_exception", "exit_code_of"]

_log = logging.getLogger("tfdist.runtime")
_LEAVE_TOGETHER_SECONDS = 60.0

# The rules live in tfdist.runtime.exit_codes; these are their names in tfdist.runtime since the first release.
exit_code_of = exit_codes.from_exit_value
exit_code_for_exception = exit_codes.from_exception


def _flush_everything() -> None:
    try:
        atexit._run_exitfuncs()  # What normal interpreter exit would run first.
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _collective_peer(tf_config: str | None) -> bool:
    """Whether ``tf_config`` (TF_CONFIG's text) makes this process one of several chief/worker tasks of a
    cluster without parameter servers: the tasks a MultiWorkerMirroredStrategy coordinates.

    Example:
        >>> _collective_peer('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}')
        True
        >>> _collective_peer('{"cluster": {"worker": ["a:1"], "ps": ["c:1"], "chief": ["d:1"]},'
        ...                  ' "task": {"type": "chief", "index": 0}}')
        False
        >>> _collective_peer(None), _collective_peer("not json"), _collective_peer('{"cluster": {"worker": ["a:1"]}}')
        (False, False, False)
    """
    try:
        config = json.loads(tf_config or "{}")
    except ValueError:
        return False
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict) or "ps" in cluster:
        return False
    sizes = [len(cluster.get(job) or ()) for job in ("chief", "worker")]
    return task.get("type") in ("chief", "worker") and sum(sizes) > 1


def _leave_together() -> None:
    """Waits for the other collective tasks before a successful exit (see the module docstring)."""
    if not _collective_peer(os.environ.get("TF_CONFIG")):
        return
    from tfdist import _compat

    why = _compat.wait_for_coordinated_peers("tfdist-exit", _LEAVE_TOGETHER_SECONDS)
    _log.debug("Leaving: %s.", "every collective peer is done" if why is None else f"not waiting for peers ({why})")


def exit_cleanly(main: Callable[..., Any], *args: Any, **kwargs: Any) -> NoReturn:
    """Runs ``main(*args, **kwargs)`` and ends the process without native teardown.

    The exit code is what the same script would have returned without the
    abort: ``main``'s integer result or ``sys.exit`` code, 1 for an uncaught
    exception (its traceback printed to stderr as Python would; 201 when
    TensorFlow lost a peer, 2 for a tfdist input error: see
    :func:`tfdist.runtime.exit_codes.from_exception`), 130 for Ctrl-C. On
    success, a MultiWorkerMirroredStrategy worker first waits for its peers.

    Args:
      main: The program's entry point.
      *args: Positional arguments for ``main``.
      **kwargs: Keyword arguments for ``main``.
    """
    try:
        code = exit_codes.from_exit_value(main(*args, **kwargs))
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            sys.stderr.write(f"{exc.code}\n")
        code = exit_codes.from_exit_value(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = exit_codes.from_signal(signal.SIGINT)
    except BaseException as exc:
        sys.excepthook(*sys.exc_info())
        code = exit_codes.from_exception(exc)
    try:
        if code == 0:
            _leave_together()
        _flush_everything()
    finally:
        os._exit(code)
