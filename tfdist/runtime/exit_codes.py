"""tfdist's exit codes, chosen for schedulers that decide on them.

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
Cannot execute           126  no         ``slurm_task``/``jobset_task``, as a shell would
Command not found        127  no         ``slurm_task``/``jobset_task``, as a shell would
Killed (SIGKILL, OOM)    137  yes        the kernel / kubelet (128 + 9)
Terminated (SIGTERM)     143  yes        the kubelet on eviction (128 + 15)
Preempted, backup saved  200  yes        ``PreemptionSafeBackup`` after its SIGTERM save
Lost a peer              201  yes        ``exit_cleanly`` on TensorFlow's Unavailable/Aborted/DeadlineExceeded
======================  ====  =========  ==========================================

Example:
    >>> from tfdist.runtime import exit_codes
    >>> exit_codes.is_retryable(exit_codes.LOST_PEER), exit_codes.is_retryable(exit_codes.BAD_CONFIG)
    (True, False)
"""

from __future__ import annotations

__all__ = ["OK", "FAILED", "BAD_CONFIG", "CANNOT_EXECUTE", "NOT_FOUND", "PREEMPTED", "LOST_PEER", "is_retryable",
           "PEER_LOST_ERRORS"]

OK = 0
FAILED = 1
BAD_CONFIG = 2
CANNOT_EXECUTE = 126
NOT_FOUND = 127
PREEMPTED = 200
LOST_PEER = 201
# TensorFlow errors that mean another task of the cluster went away (names of tf.errors classes).
PEER_LOST_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError")


def is_retryable(code: int) -> bool:
    """True when a rerun may succeed: the training operator's rule for ``restartPolicy: ExitCode`` (>= 128)."""
    return code >= 128
