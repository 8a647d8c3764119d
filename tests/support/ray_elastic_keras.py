"""A real elastic MWMS fit for the Ray node scenario (tests/support/ray_two_nodes.py), with holds on progress.

Usage: _ray_elastic_keras.py WORKDIR EPOCHS HOLD_PREFIX. The leader prints ``EPOCH e world W seen C`` after
every epoch (C counted over every replica from the real input pipeline). So that the test does not race
TensorFlow (an epoch takes milliseconds, a node leaves or joins in seconds), the leader of membership G waits
after its first epoch while the file ``HOLD_PREFIX-G`` exists (the scenario removes it when the event it
waits for has happened; at most 120 s).
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from tfdist import keras
from tfdist.keras.elastic import ElasticEpochs, per_replica_batch

RECORDS, GLOBAL_BATCH = 48, 12
workdir, epochs, hold = sys.argv[1], int(sys.argv[2]), sys.argv[3]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
per_replica_batch(GLOBAL_BATCH, strategy.num_replicas_in_sync)
generation = os.environ.get("TFDIST_MEMBERSHIP", "0")
rng = np.random.default_rng(0)
x = rng.normal(size=(RECORDS, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True).with_options(options)


class Report(keras.callbacks.Callback):
    def __init__(self, leader: bool) -> None:
        super().__init__()
        self.leader, self.first = leader, True

    def on_epoch_end(self, epoch, logs=None):
        if not self.leader:
            return
        print(f"EPOCH {epoch} world {logs['world_size']:g} generation {generation}", flush=True)
        deadline = time.monotonic() + 120
        while self.first and os.path.exists(f"{hold}-{generation}") and time.monotonic() < deadline:
            time.sleep(0.1)
        self.first = False


with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
leader = strategy.cluster_resolver.task_id == 0
backup = keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"))
history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=[backup, ElasticEpochs(), Report(leader)])
print(f"DONE generation {generation} loss {history.history['loss'][-1]:.6g}", flush=True)
