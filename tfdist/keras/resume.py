"""Resume a tfdist input pipeline where a restored backup left off: the input position is part of the backup.

tf-keras' ``BackupAndRestore`` saves the model with its epoch and batch counters, and a restart resumes
the counters but starts a new iterator: the records trained before the failure are read again and the
end of the epoch is never reached. :class:`ResumeInput` turns the restored counters into a
:class:`~tfdist.data.order.DataPosition` and starts the pipeline there (``order='resumable'``), so every
record is trained once per epoch across crashes, preemptions and world-size changes.

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
from tfdist.data.order.position import DataPosition
from tfdist.errors import DataError, invalid

__all__ = ["ResumeInput", "input_position"]

_log = logging.getLogger("tfdist.keras")
ORDER_FILE = "tfdist-input-order.json"


def input_position(
    epoch: int, step: int, *, epochs_per_iteration: int | None, steps_per_epoch: int | None
) -> DataPosition:
    """The data position of Keras epoch ``epoch``, step ``step`` (where fit goes on after a restore).

    A finite dataset of ``E`` epochs is iterated once per Keras epoch, so Keras epoch ``k`` is data epoch
    ``k * E``; an endless one is one iteration, counted in steps since the start.

    Example:
        >>> input_position(2, 5, epochs_per_iteration=1, steps_per_epoch=None)
        DataPosition(epoch=2, step=5)
        >>> input_position(2, 5, epochs_per_iteration=None, steps_per_epoch=20)
        DataPosition(epoch=0, step=45)
    """
    if epochs_per_iteration is not None:
        return DataPosition(epoch=epoch * epochs_per_iteration, step=step)
    if steps_per_epoch is None:
        raise invalid(
            DataError,
            "steps_per_epoch",
            None,
            "a number of steps per epoch with endless input (num_epochs=None)",
            "Pass steps_per_epoch=... to fit().",
        )
    return DataPosition(epoch=0, step=epoch * steps_per_epoch + step)


class ResumeInput(_compat.callback_base()):  # type: ignore[misc]
    """Starts ``pipeline`` where the backup restored by a ``BackupAndRestore`` left off.

    Anywhere in ``callbacks`` beside a ``BackupAndRestore``: it reads the restored counters when ``fit``
    loads them, after every callback started (``PreemptionSafeBackup(..., data=pipeline)`` and
    ``cluster_callbacks(..., data=pipeline)`` add it themselves). With ``backup_dir`` the chief also
    records the order's parameters there (files, counts, streams, seed), and a resume whose order
    differs stops with a DataError instead of silently training other records.

    Args:
      pipeline: The :class:`~tfdist.data.TFRecordPipeline` whose dataset ``fit`` reads.
      backup_dir: The backup callback's directory (for the order record); None: no record.
      cluster: This task's cluster (a spec or TF_CONFIG); default ``TF_CONFIG`` from the environment.
    """

    def __init__(self, pipeline: Any, *, backup_dir: str | None = None, cluster: ClusterLike = None) -> None:
        super().__init__()
        if not hasattr(pipeline, "start_at") or not hasattr(pipeline, "cursor"):
            raise invalid(
                DataError,
                "pipeline",
                type(pipeline).__name__,
                "a tfdist.data.TFRecordPipeline",
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
        cursor = self.pipeline.cursor
        counters = _compat.restored_counters(self.model)
        if counters is None:
            _log.warning("ResumeInput found no BackupAndRestore in fit's callbacks: there is no backup to resume.")
            return
        if cursor.order is None:
            _log.warning(
                "The input cannot resume where the backup left off: the pipeline does not read in the "
                "resumable order (order='buffer', or an option that keeps it out; the pipeline's log says "
                "which). After a restore the records of the interrupted epoch are read again from its start."
            )
            return
        self._check_order(cursor.order.fingerprint())
        steps = steps_per_epoch or cursor.steps_per_epoch(drop_remainder=self.pipeline.drop_remainder)
        _compat.guard_initial_counters(self.model, steps)
        epoch, step = _compat.resume_counters(self.model, steps)
        if cursor.claims is not None:  # Parameter servers: the next global step to claim.
            claimed = epoch * (self.params.get("steps") or steps) + step
            cursor.claims.assign(claimed)
            if claimed:
                _log.info("Input resumes at epoch %d, step %d (claimed steps from %d).", epoch, step, claimed)
            return
        position = input_position(
            epoch,
            step,
            epochs_per_iteration=cursor.epochs_per_iteration,
            steps_per_epoch=self.params.get("steps") or steps_per_epoch,
        )
        self.pipeline.start_at(position)
        if (epoch, step) != (0, 0):
            _log.info("Input resumes at epoch %d, step %d (%s).", epoch, step, position)

    def _check_order(self, fingerprint: dict[str, Any]) -> None:
        if not self.backup_dir:
            return
        import tensorflow as tf

        path = os.path.join(self.backup_dir, ORDER_FILE)
        if tf.io.gfile.exists(path):
            with tf.io.gfile.GFile(path) as f:
                saved = json.load(f)
            changed = sorted(k for k in set(saved) | set(fingerprint) if saved.get(k) != fingerprint.get(k))
            if changed == ["pipelines"]:  # Stratified draws on another world size: they go on, and say so.
                _log.warning(
                    "The backup in %s was made by %s input pipelines drawing by class_weights, and %s draw now. "
                    "Each pipeline draws its own sequence, so the draws go on from the same step in the "
                    "sequences of %s pipelines: the class mix holds, but within each class's current pass "
                    "some records may be drawn again and others not (docs/data.md, 'Resuming stratified draws').",
                    self.backup_dir,
                    saved.get("pipelines"),
                    fingerprint.get("pipelines"),
                    fingerprint.get("pipelines"),
                )
                self._record(path, fingerprint)  # The next resume on this world size is exact again.
            elif changed:
                name = {
                    "streams": "order_streams",
                    "block": "order_block",
                    "window": "shuffle_buffer",
                    "mix": "class_weights",
                    "counts": "files",
                    "stratified": "label_key",
                    "pipelines": "cluster",  # Stratified draws: each input pipeline (worker) draws its own.
                }
                raise DataError(
                    f"The backup in {self.backup_dir} was made reading another input order: "
                    + ", ".join(f"{name.get(k, k)} {saved.get(k)!r} then, {fingerprint.get(k)!r} now" for k in changed)
                    + ". Resuming would train other records than the ones left. Use the same files and options "
                    "(an elastic job names order_streams), or start a new backup directory.",
                    field=name.get(changed[0], changed[0]),
                    value=fingerprint.get(changed[0]),
                )
        else:
            self._record(path, fingerprint)

    def _record(self, path: str, fingerprint: dict[str, Any]) -> None:
        """The chief records the order's parameters beside the backup (atomically: a rename)."""
        import tensorflow as tf

        if self._spec is None or self._spec.is_chief:
            tf.io.gfile.makedirs(os.path.dirname(path))
            with tf.io.gfile.GFile(path + ".tmp", "w") as f:
                json.dump(fingerprint, f)
            tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
