"""Resume a tfdist input pipeline where a restored backup left off: the input position is part of the backup.

tf-keras' ``BackupAndRestore`` saves the model with its epoch and batch counters, and a restart resumes
the counters but starts a new iterator: the records trained before the failure are read again and the
end of the epoch is never reached. :class:`ResumeInput` tells the pipeline the restored counters, and the
pipeline goes on there (``order='resumable'``), so every record is trained once per epoch across crashes,
preemptions and world-size changes. It asks and tells only through
:class:`~tfdist.data.pipeline.state.ResumableInput`, the same under every strategy.

In a training script (not run here: it needs a cluster)::

    pipeline = TFRecordPipeline(files=..., batch_size=24, shuffle_buffer=64, seed=3)
    backup = keras.PreemptionSafeBackup(backup_dir, save_freq=4, data=pipeline)  # or:
    callbacks = [keras.callbacks.BackupAndRestore(backup_dir, save_freq=4), keras.ResumeInput(pipeline)]
    model.fit(pipeline.dataset(), epochs=3, callbacks=callbacks)
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tfdist import _compat
from tfdist.cluster.spec import ClusterLike, resolve_cluster
from tfdist.data.order.position import input_position
from tfdist.data.pipeline.state import ResumableInput
from tfdist.errors import DataError, invalid

__all__ = ["ResumeInput", "input_position"]

_log = logging.getLogger("tfdist.keras")
ORDER_FILE = "tfdist-input-order.json"


class ResumeInput(_compat.callback_base()):  # type: ignore[misc]
    """Starts ``pipeline`` where the backup restored by a ``BackupAndRestore`` left off.

    Anywhere in ``callbacks`` beside a ``BackupAndRestore``: it reads the restored counters when ``fit``
    loads them, after every callback started (``PreemptionSafeBackup(..., data=pipeline)`` and
    ``cluster_callbacks(..., data=pipeline)`` add it themselves). With ``backup_dir`` the chief also
    records the order's fingerprint there (files, counts, streams, seed), and a resume whose order
    differs stops with the pipeline's DataError instead of silently training other records.

    Args:
      pipeline: The :class:`~tfdist.data.TFRecordPipeline` whose dataset ``fit`` reads (any
        :class:`~tfdist.data.pipeline.state.ResumableInput`).
      backup_dir: The backup callback's directory (for the order record); None: no record.
      cluster: This task's cluster (a spec or TF_CONFIG); default ``TF_CONFIG`` from the environment.
    """

    keras3_hint = (
        "With a Keras 3 model use tfdist.keras.PreemptionSafeBackup(backup_dir, save_freq=..., data=pipeline), "
        "whose backups carry the input position."
    )

    def __init__(self, pipeline: ResumableInput, *, backup_dir: str | None = None, cluster: ClusterLike = None) -> None:
        super().__init__()
        if not isinstance(pipeline, ResumableInput):
            raise invalid(
                DataError,
                "pipeline",
                type(pipeline).__name__,
                "a tfdist.data.TFRecordPipeline (a ResumableInput)",
                "Pass the pipeline whose dataset() fit reads.",
            )
        self.pipeline = pipeline
        self.backup_dir = backup_dir
        self._spec = resolve_cluster(cluster)

    def on_train_begin(self, logs: Any = None) -> None:
        # Linked when fit loads its counters: after every callback's on_train_begin (the backup restored,
        # wherever it sits in the list), before the first batch is read.
        _compat.before_initial_counters(self.model, self._link)

    def _link(self, steps_per_epoch: int | None) -> None:
        counters = _compat.restored_counters(self.model)
        if counters is None:
            _log.warning("ResumeInput found no BackupAndRestore in fit's callbacks: there is no backup to resume.")
            return
        if not self.checked_order():
            return
        self._save_claims()
        steps = steps_per_epoch or self.pipeline.steps_per_epoch()
        _compat.guard_initial_counters(self.model, steps)
        epoch, step = _compat.resume_counters(self.model, steps)
        self.pipeline.seek(epoch=epoch, step=step, steps_per_epoch=self.params.get("steps") or steps_per_epoch)

    def checked_order(self) -> bool:
        """Whether the pipeline can go on where a backup left off: it reads in the resumable order, the same as
        the one recorded beside the backup (a change raises the pipeline's DataError); logs why not."""
        fingerprint = self.pipeline.fingerprint()
        if fingerprint is None:
            _log.warning(
                "The input cannot resume where the backup left off: the pipeline does not read in the "
                "resumable order (order='buffer', or an option that keeps it out; the pipeline's log says "
                "which). After a restore the records of the interrupted epoch are read again from its start."
            )
            return False
        self._check_order(fingerprint)
        return True

    def _save_claims(self) -> None:
        """Under parameter servers: the ledger of claimed steps is saved with the backup, and restored from it
        (the steps a failed run gave back and nobody claimed again yet, and the next fresh step)."""
        ledger = getattr(self.pipeline, "claims_ledger", lambda: None)()
        backup = _compat.backup_checkpoint(self.model)
        if ledger is not None and backup is not None:
            ledger.restore(*backup)

    def _check_order(self, fingerprint: dict[str, Any]) -> None:
        """Records ``fingerprint`` beside the backup, or has the pipeline check the one recorded there."""
        if not self.backup_dir:
            return
        import tensorflow as tf

        path = os.path.join(self.backup_dir, ORDER_FILE)
        if not tf.io.gfile.exists(path):
            self._record(path, fingerprint)
            return
        with tf.io.gfile.GFile(path) as f:
            saved = json.load(f)
        if self.pipeline.check_fingerprint(saved, backup=self.backup_dir):
            self._record(path, fingerprint)  # A change that resumes all the same: the next resume checks this one.

    def _record(self, path: str, fingerprint: dict[str, Any]) -> None:
        """The chief records the order's fingerprint beside the backup (atomically: a rename)."""
        import tensorflow as tf

        if self._spec is None or self._spec.is_chief:
            tf.io.gfile.makedirs(os.path.dirname(path))
            with tf.io.gfile.GFile(path + ".tmp", "w") as f:
                json.dump(fingerprint, f)
            tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
