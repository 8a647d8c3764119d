"""Callbacks that know the cluster: backups, checkpoints, TensorBoard on the chief, throughput.

In a training script run on every task (not run here: it needs a model and a cluster)::

    callbacks = cluster_callbacks(backup_dir="gs://b/backup", checkpoint_dir="gs://b/ckpt",
                                  tensorboard_dir="gs://b/tb", global_batch_size=256)
    model.fit(dataset, epochs=10, callbacks=callbacks)
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
import time
from typing import Any

from tfdist._compat import (
    attach_preemption_handler,
    backup_base,
    callback_base,
    fixed_keras3_model,
    guard_initial_counters,
    resuming_backup,
    saving_before_preemption,
    tf_keras_models_only,
    tf_keras_module,
    training_state,
)
from tfdist.cluster.spec import ClusterLike, ClusterSpec, resolve_cluster
from tfdist.keras.resume import ResumeInput
from tfdist.runtime import exit_codes

__all__ = ["PreemptionSafeBackup", "ThroughputLogger", "cluster_callbacks"]

_log = logging.getLogger("tfdist.keras")
_CHECKPOINT_PATTERN = "ckpt-{epoch}"  # What SidecarEvaluator(max_evaluations=epochs) expects.
# What cluster_callbacks' tf-keras callbacks say a Keras 3 model should use instead (their refusal's last sentence).
_KERAS3_INSTEAD = (
    "With a Keras 3 model, pass Keras 3's own keras.callbacks.BackupAndRestore, ModelCheckpoint and TensorBoard "
    "(under a strategy of tfdist.build_strategy they write from the chief only) and "
    "tfdist.keras.PreemptionSafeBackup(backup_dir, save_freq=..., data=pipeline), instead of cluster_callbacks."
)


def _task_name(spec: ClusterSpec | None) -> str:
    return spec.task.name if spec is not None and spec.task is not None else "local"


class ThroughputLogger(callback_base()):  # type: ignore[misc]
    """Logs examples/s and step time each epoch; with ``report_dir``, names straggling workers.

    Every worker writes ``throughput-<task>-epoch<N>.json`` into ``report_dir``
    (shared storage); the chief waits (up to 10 s) for every training worker's
    report, then logs workers whose mean step time is above
    ``straggler_factor`` x the median. The first ``warmup_steps`` steps
    of each epoch (tracing, pipeline fill) are not timed. Under
    ParameterServerStrategy (no batch hooks allowed) whole epochs are timed.

    Args:
      global_batch_size: Examples per step over all replicas.
      report_dir: Shared directory for per-worker reports; None: local only.
      straggler_factor: How much slower than the median counts as straggling.
      warmup_steps: Steps skipped at the start of each epoch.
      cluster: This task's cluster (a spec or TF_CONFIG); default ``TF_CONFIG`` from the environment.
    """

    def __init__(
        self,
        global_batch_size: int,
        *,
        report_dir: str | None = None,
        straggler_factor: float = 1.25,
        warmup_steps: int = 2,
        cluster: ClusterLike = None,
    ) -> None:
        super().__init__()
        self.global_batch_size = global_batch_size
        self.report_dir = report_dir
        self.straggler_factor = straggler_factor
        self.warmup_steps = warmup_steps
        self.history: list[dict[str, Any]] = []
        self.stragglers: list[list[str]] = []
        self._spec = resolve_cluster(cluster)
        self._task = _task_name(self._spec)
        self._steps: list[float] = []
        self._step_start = 0.0
        self._seen = 0

    def _is_parameter_server(self) -> bool:
        import tensorflow as tf

        model = getattr(self, "model", None)
        return model is not None and isinstance(model.distribute_strategy, tf.distribute.ParameterServerStrategy)

    def wants_train_batch_hooks(self) -> bool:
        # tf-keras forbids batch hooks under ParameterServerStrategy: time whole epochs there.
        return not self._is_parameter_server()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._steps, self._seen = [], 0
        self._epoch_start = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._seen += 1
        if self._seen > self.warmup_steps:
            self._steps.append(time.perf_counter() - self._step_start)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._is_parameter_server() and self.params.get("steps"):
            self._steps = [(time.perf_counter() - self._epoch_start) / self.params["steps"]]
        if not self._steps:
            return
        step = statistics.mean(self._steps)
        record = {
            "task": self._task,
            "epoch": epoch,
            "steps_timed": len(self._steps),
            "step_s": step,
            "examples_per_s": self.global_batch_size / step,
        }
        self.history.append(record)
        _log.info(
            "Epoch %d on %s: %.0f examples/s, %.1f ms/step.", epoch, self._task, record["examples_per_s"], step * 1e3
        )
        if self.report_dir is None:
            return
        import tensorflow as tf

        tf.io.gfile.makedirs(self.report_dir)
        name = f"throughput-{self._task.replace(':', '-')}-epoch{epoch}.json"
        with tf.io.gfile.GFile(os.path.join(self.report_dir, name), "w") as f:
            json.dump(record, f)
        if self._spec is None or self._spec.is_chief:
            self._name_stragglers(epoch)

    def _name_stragglers(self, epoch: int, wait_seconds: float = 10.0) -> None:
        import tensorflow as tf

        expected = self._spec.num_workers if self._spec is not None else 1
        pattern = os.path.join(self.report_dir, f"throughput-*-epoch{epoch}.json")  # type: ignore[arg-type]
        deadline = time.monotonic() + wait_seconds
        while len(tf.io.gfile.glob(pattern)) < expected and time.monotonic() < deadline:
            time.sleep(0.05)  # The other workers write theirs at the same epoch end.
        reports = []
        for path in tf.io.gfile.glob(pattern):
            with tf.io.gfile.GFile(path) as f:
                reports.append(json.load(f))
        if len(reports) < 2:
            return
        median = statistics.median(r["step_s"] for r in reports)
        slow = sorted(r["task"] for r in reports if r["step_s"] > self.straggler_factor * median)
        self.stragglers.append(slow)
        if slow:
            _log.warning(
                "Epoch %d stragglers (step time > %.2fx the median %.1f ms): %s.",
                epoch,
                self.straggler_factor,
                median * 1e3,
                ", ".join(slow),
            )


def exit_preempted() -> None:
    """Ends a worker after its preemption save with ``exit_codes.PREEMPTED`` (retryable)."""
    sys.exit(exit_codes.PREEMPTED)


class PreemptionSafeBackup(backup_base()):  # type: ignore[misc]
    """``BackupAndRestore(save_before_preemption=True)`` that works off Google Cloud too.

    tf-keras (2.17 to 2.21) enables saving on SIGTERM only when it detects GCP
    (``support_on_demand_checkpoint_callback``); elsewhere the flag is silently
    ignored and a preempted job loses everything since the last backup. This
    callback attaches TensorFlow's own ``PreemptionCheckpointHandler`` (which
    handles SIGTERM on any platform) to the backup tf-keras already manages,
    under multi-worker MirroredStrategy: on SIGTERM all workers agree on a step,
    save the backup there and exit with ``exit_codes.PREEMPTED`` (200, which
    schedulers retry; TensorFlow's own default, 42, the training operator
    would not); the rerun resumes from it.
    Relies on tf-keras internals, reached through ``tfdist._compat``.

    With ``data`` (a :class:`~tfdist.data.TFRecordPipeline`), the input
    position is part of the backup: after a restore the pipeline resumes at
    the next record of the same order (:class:`~tfdist.keras.resume.ResumeInput`).

    Given a Keras 3 model (keras 3.10 and later), it does the same with Keras 3's own backup files
    (``tfdist._compat.keras3_resume``): each backup records the step ``fit`` goes on at, the interrupted
    epoch starts there (Keras 3 alone restores the epoch only), the chief writes, every worker restores the
    chief's backup, and SIGTERM saves every worker at one step and exits with 200. Without ``data`` a Keras 3
    fit restarts the interrupted epoch from its first step, with the input.

    Args:
      backup_dir: Where the backup lives (shared storage).
      save_freq: Regular backups as in ``BackupAndRestore`` ('epoch', a number
        of batches, or False for preemption saves only).
      data: The pipeline ``fit`` reads, to resume it exactly; None: the
        input restarts at the start of the interrupted epoch.
    """

    def __init__(self, backup_dir: str, *, save_freq: Any = "epoch", data: Any = None) -> None:
        super().__init__(backup_dir, save_freq=save_freq, save_before_preemption=True)
        self._resume = ResumeInput(data, backup_dir=backup_dir) if data is not None else None
        self._keras3: Any = None  # With a Keras 3 model: the Keras 3 backup every hook goes to.
        self._keras3_save_freq = save_freq

    def set_model(self, model: Any) -> None:
        if not fixed_keras3_model(model):
            self._keras3 = None
            super().set_model(model)  # A tf-keras model, or the refusal that names the fix.
            return
        if self._keras3 is not None and self._keras3.model is model:
            return  # Set again for the same fit (Keras 3 does for a CallbackList it is handed): keep its state.
        self.model = model
        self._keras3 = resuming_backup(
            model,
            self.backup_dir,
            save_freq=self._keras3_save_freq,
            on_restore=self._resume_keras3 if self._resume is not None else None,
            exit_fn=exit_preempted,
        )

    def _resume_keras3(self, epoch: int, step: int, steps_per_epoch: int | None) -> bool:
        """Puts the input where a Keras 3 fit goes on after the restore; whether it can."""
        assert self._resume is not None  # Only passed as on_restore with data.
        if not self._resume.checked_order():
            return False
        self._resume.pipeline.seek(epoch=epoch, step=step, steps_per_epoch=steps_per_epoch)
        return True

    def set_params(self, params: Any) -> None:
        super().set_params(params)
        if self._keras3 is not None:
            self._keras3.set_params(params)

    def _hook(self, name: str) -> Any:
        """The Keras 3 backup's hook ``name`` with a Keras 3 model, else tf-keras' ``BackupAndRestore``'s."""
        return getattr(self._keras3, name) if self._keras3 is not None else getattr(super(), name)

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._hook("on_epoch_begin")(epoch, logs)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._keras3 is None:
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._hook("on_train_batch_end")(batch, logs)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._hook("on_epoch_end")(epoch, logs)

    def on_train_end(self, logs: Any = None) -> None:
        self._hook("on_train_end")(logs)

    def on_train_begin(self, logs: Any = None) -> None:
        if self._keras3 is not None:
            self._keras3.on_train_begin(logs)  # Restores; the input is put in place as the first epoch begins.
            return
        super().on_train_begin(logs)
        self._wire_preemption()
        guard_initial_counters(self.model, None)  # A finite dataset of unknown length resumes, not crashes.
        if self._resume is not None:
            self._resume.set_model(self.model)
            self._resume.set_params(self.params)
            self._resume.on_train_begin(logs)  # Links when fit loads the counters this backup restored.

    def _wire_preemption(self) -> None:
        import tensorflow as tf

        state = training_state(self)
        strategy = self.model.distribute_strategy
        resolver = getattr(strategy, "cluster_resolver", None)
        multi_worker = (
            isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and resolver is not None
            and bool(resolver.cluster_spec().as_dict())
        )
        if saving_before_preemption(state) or not multi_worker:
            return
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver,
            state.write_checkpoint_manager,
            termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=exit_preempted),
        )
        attach_preemption_handler(state, self.model, handler)
        _log.info(
            "Saving before preemption is on: SIGTERM makes every worker save the backup and exit (code %d).",
            exit_codes.PREEMPTED,
        )


def cluster_callbacks(
    *,
    backup_dir: str | None = None,
    checkpoint_dir: str | None = None,
    tensorboard_dir: str | None = None,
    global_batch_size: int | None = None,
    save_before_preemption: bool = False,
    report_dir: str | None = None,
    data: Any = None,
    cluster: ClusterLike = None,
) -> list[Any]:
    """The callbacks a cluster job wants, each on the tasks that should run it.

    - ``BackupAndRestore(backup_dir)`` on every task: tf-keras writes the chief's
      backup there and the other workers' to temporary directories it deletes,
      and restores from it after a restart. ``save_before_preemption`` also
      saves on SIGTERM (MultiWorkerMirroredStrategy; TF's
      PreemptionCheckpointHandler).
    - ``ModelCheckpoint(checkpoint_dir/ckpt-{epoch}, save_weights_only=True)`` on
      every task (saving is collective under MWMS; non-chief copies go to
      temporary directories that are removed): what the evaluator side-car reads.
    - ``TensorBoard(tensorboard_dir)`` on the chief only.
    - :class:`ThroughputLogger` when ``global_batch_size`` is given.
    - With ``data`` (the pipeline fit reads) and a ``backup_dir``, the input
      position is part of the backup (:class:`~tfdist.keras.resume.ResumeInput`).

    ``cluster`` is this task's cluster (a spec or TF_CONFIG); by default ``TF_CONFIG`` from the environment.
    The callbacks are tf-keras': given a Keras 3 model, ``fit`` raises a StrategyError that names what to use.
    """
    tf_keras = tf_keras_module("cluster_callbacks")
    spec = resolve_cluster(cluster)
    is_chief = spec is None or spec.is_chief

    def tf_keras_only(name: str) -> Any:
        base = getattr(tf_keras.callbacks, name)
        return tf_keras_models_only(base, f"{name} of cluster_callbacks(...)", _KERAS3_INSTEAD)

    callbacks: list[Any] = []
    if backup_dir:
        if save_before_preemption:
            callbacks.append(PreemptionSafeBackup(backup_dir, data=data))
        else:
            callbacks.append(tf_keras_only("BackupAndRestore")(backup_dir))
            if data is not None:
                callbacks.append(ResumeInput(data, backup_dir=backup_dir, cluster=spec))
    if checkpoint_dir:
        checkpoint = tf_keras_only("ModelCheckpoint")
        callbacks.append(checkpoint(os.path.join(checkpoint_dir, _CHECKPOINT_PATTERN), save_weights_only=True))
    if tensorboard_dir and is_chief:
        callbacks.append(tf_keras_only("TensorBoard")(tensorboard_dir, update_freq="epoch"))
    if global_batch_size:
        callbacks.append(ThroughputLogger(global_batch_size, report_dir=report_dir, cluster=spec))
    return callbacks
