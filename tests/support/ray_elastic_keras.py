"""A real elastic MWMS fit for the Ray node scenario (tests/support/ray_two_nodes.py), with holds on progress.

Usage: _ray_elastic_keras.py WORKDIR EPOCHS HOLD_PREFIX. The fit is exact_tasks.py's counted one: 480 records
in ``WORKDIR/data/part-*`` (the test writes them), global batch 24, a count per record in a weight the backup
restores with the model; each task prints ``DONE generation G loss L counts {count: records}`` at the end.
The leader prints ``EPOCH e world W generation G`` after every epoch. So that the test does not race
TensorFlow (an epoch takes milliseconds, a node leaves or joins in seconds), the leader of membership G waits
after its first epoch while the file ``HOLD_PREFIX-G`` exists (the scenario removes it when the event it
waits for has happened). The wait is bounded at 300 s, for a node that never joins; the leader then prints
``HOLD EXPIRED generation G`` and goes on, and the test fails on that line (a node that joins late under load
is not a failure: the scenario ends on the join or removal it waits for, never on the clock alone).
"""

import collections
import os
import sys
import time

import exact_tasks  # Beside this file (the script's directory is first on sys.path).
import tensorflow as tf

from tfdist import keras
from tfdist.keras.elastic import ElasticEpochs, per_replica_batch

workdir, epochs, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
per_replica_batch(exact_tasks.GLOBAL_BATCH, strategy.num_replicas_in_sync)
generation = os.environ.get("TFDIST_MEMBERSHIP", "0")
pipeline = exact_tasks.pipeline(os.path.join(workdir, "data", "part-*"))


class Report(keras.callbacks.Callback):
    def __init__(self, leader: bool) -> None:
        super().__init__()
        self.leader, self.first = leader, True

    def on_epoch_end(self, epoch, logs=None):
        if not self.leader:
            return
        print(f"EPOCH {epoch} world {logs['world_size']:g} generation {generation}", flush=True)
        deadline = time.monotonic() + 300
        while self.first and os.path.exists(f"{hold}-{generation}"):
            if time.monotonic() > deadline:
                print(f"HOLD EXPIRED generation {generation}", flush=True)
                break
            time.sleep(0.1)
        self.first = False


with strategy.scope():
    model = exact_tasks.counted_model()
leader = strategy.cluster_resolver.task_id == 0
backup_dir = os.path.join(workdir, "backup")
backup = [keras.callbacks.BackupAndRestore(backup_dir), keras.ResumeInput(pipeline, backup_dir=backup_dir)]
history = model.fit(pipeline.dataset(), epochs=epochs, verbose=0, callbacks=[*backup, ElasticEpochs(), Report(leader)])
counts = collections.Counter(int(c) for c in model.counts.numpy())
print(f"DONE generation {generation} loss {history.history['loss'][-1]:.6g} counts {dict(counts)}", flush=True)
