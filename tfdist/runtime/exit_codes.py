"""tfdist's exit codes and every rule that turns an ending (a return value, an exception, a signal) into one.

Kubeflow's training operator with ``restartPolicy: ExitCode`` treats 1-127 as
permanent (the pod is not restarted) and 128-255 as retryable; the JobSet
manifests tfdist emits apply the same rule through a pod failure policy. So
what a rerun can fix exits with 128 or more, and what it cannot with less:

======================  ====  =========  ==========================================
What happened           Code  Retried?   Who exits with it
======================  ====  =========  ==========================================
Success                    0  -          every task
Program error              1  no         Python, for an uncaught exception
Bad configuration          2  no         tfdist CLIs; ``exit_cleanly`` on a tfdist input error
Timed out                124  no         ``tfdist-launch --timeout``, as ``timeout(1)`` does
Cannot execute           126  no         ``slurm_task``/``jobset_task``, as a shell would
Command not found        127  no         ``slurm_task``/``jobset_task``, as a shell would
Killed (SIGKILL, OOM)    137  yes        the kernel / kubelet (128 + 9)
Terminated (SIGTERM)     143  yes        the kubelet on eviction (128 + 15)
Preempted, backup saved  200  yes        ``PreemptionSafeBackup`` after its SIGTERM save
Lost a peer              201  yes        ``exit_cleanly`` on TensorFlow's Unavailable/Aborted/DeadlineExceeded
Too few workers          202  yes        ``tfdist-launch`` when losses leave fewer than ``--min-workers``
Stalled                  203  yes        ``tfdist-launch --stall-seconds`` when no task completed a step
======================  ====  =========  ==========================================

This module is the one place for these rules: :func:`from_exit_value` (what ``sys.exit(value)`` gives),
:func:`from_exception` (an uncaught exception or a CLI's tfdist error), :func:`from_signal` and
:func:`from_returncode` (a death by signal, shell style), :func:`is_retryable`.

The codes and :func:`is_retryable` are public in :mod:`tfdist.runtime`; the ``from_*`` rules are tfdist's
own (``tfdist.runtime.exit_code_of`` and ``exit_code_for_exception`` are the first and second).

Example:
    >>> from tfdist.runtime import BAD_CONFIG, LOST_PEER, is_retryable
    >>> is_retryable(LOST_PEER), is_retryable(BAD_CONFIG)
    (True, False)
    >>> from_returncode(-9), from_exit_value("failed"), from_signal(2)
    (137, 1, 130)
"""

from __future__ import annotations

from typing import Any

from tfdist._compat import is_tf_error
from tfdist.errors import Error

__all__ = [
    "BAD_CONFIG",
    "CANNOT_EXECUTE",
    "FAILED",
    "LOST_PEER",
    "NOT_FOUND",
    "OK",
    "PREEMPTED",
    "STALLED",
    "TIMEOUT",
    "TOO_FEW_WORKERS",
    "is_retryable",
]

OK = 0
FAILED = 1
BAD_CONFIG = 2
TIMEOUT = 124
CANNOT_EXECUTE = 126
NOT_FOUND = 127
PREEMPTED = 200
LOST_PEER = 201
TOO_FEW_WORKERS = 202  # An elastic run's losses left fewer workers than min_workers: a rerun with more may do.
# No training task completed a step for `stall_seconds`: mostly a peer lost in a way TensorFlow waits on forever
# (a cut link, a frozen process), which is what LOST_PEER says when TensorFlow notices; a rerun may do.
STALLED = 203
# TensorFlow errors that mean another task of the cluster went away (names of tf.errors classes).
PEER_LOST_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError")
_SIGNALLED = 128  # a death by signal N is 128 + N, as a shell reports it


def is_retryable(code: int) -> bool:
    """True when a rerun may succeed: the training operator's rule for ``restartPolicy: ExitCode`` (>= 128)."""
    return code >= _SIGNALLED


def from_signal(signum: int) -> int:
    """The code of a process ended by signal ``signum``, as a shell reports it (128 + N).

    Example:
        >>> import signal
        >>> from_signal(signal.SIGTERM), is_retryable(from_signal(signal.SIGTERM))
        (143, True)
    """
    return _SIGNALLED + signum


def from_returncode(returncode: int) -> int:
    """A :class:`subprocess.Popen` return code as a shell reports it: -N (killed by signal N) becomes 128 + N.

    Example:
        >>> from_returncode(0), from_returncode(3), from_returncode(-15)
        (0, 3, 143)
    """
    return from_signal(-returncode) if returncode < 0 else returncode


def from_exit_value(value: Any) -> int:
    """The exit code Python gives ``sys.exit(value)`` (None -> 0, int -> int modulo 256, other -> 1).

    Example:
        >>> from_exit_value(None), from_exit_value(3), from_exit_value(256 + 7), from_exit_value("failed")
        (0, 3, 7, 1)
    """
    if value is None:
        return OK
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value & 0xFF
    return FAILED


def from_exception(exc: BaseException) -> int:
    """The code a task or a CLI ends with for an uncaught ``exc``.

    TensorFlow's Unavailable/Aborted/DeadlineExceeded errors mean a peer went
    away: a rerun can fix that (LOST_PEER, retryable). A tfdist input error
    (``tfdist.Error`` that is a ``ValueError``) is BAD_CONFIG; anything else,
    a :class:`tfdist.errors.RuntimeFailure` included, FAILED. TensorFlow is
    not imported.

    Example:
        >>> from tfdist import EngineError, LaunchError
        >>> from_exception(LaunchError("bad")), from_exception(EngineError("no Ray")), from_exception(KeyError())
        (2, 1, 1)
    """
    if is_tf_error(exc, PEER_LOST_ERRORS):
        return LOST_PEER
    if isinstance(exc, Error) and isinstance(exc, ValueError):
        return BAD_CONFIG
    return FAILED
