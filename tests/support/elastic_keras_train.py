"""An elastic MultiWorkerMirroredStrategy fit for tests: the global batch kept, records counted per epoch.

Usage: _elastic_keras_train.py WORKDIR EPOCHS. Every completed epoch, the leader prints
``EPOCH e world W seen C id_sum S id_sq Q kernel K`` (C, S, Q summed over every replica by Keras's metrics,
from the records the real input pipeline delivered), then ``FINAL k1 k2 ...`` at the end; ``BEGIN e generation
G`` as each epoch begins. Its callback runs after ElasticEpochs, so the launcher's restart at a boundary comes
only after its EPOCH line, as it must for every callback of the epoch. Without TF_CONFIG
it trains in one process: the uninterrupted reference.
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from tfdist import keras
from tfdist.keras.elastic import ElasticEpochs, per_replica_batch, world_size
from tfdist.keras.inputs import enable_determinism

RECORDS, GLOBAL_BATCH, FEATURES = 48, 12, 4
workdir, epochs = sys.argv[1], int(sys.argv[2])
enable_determinism(7)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
replicas = strategy.num_replicas_in_sync
assert replicas == world_size() or "TF_CONFIG" not in os.environ, (replicas, world_size())
per_replica_batch(GLOBAL_BATCH, replicas)  # the global batch must split evenly

rng = np.random.default_rng(0)
x = rng.normal(size=(RECORDS, FEATURES)).astype("float32")
y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32") + 0.25).reshape(-1, 1)
ids = np.arange(RECORDS, dtype="float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y, ids)).batch(GLOBAL_BATCH, drop_remainder=True)
dataset = dataset.with_options(options)


class Counted(keras.Model):
    """A linear model whose train step also counts the records it trained on (ids, their sum and squares)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Zeros())
        self.counters = [keras.metrics.Sum(name) for name in ("seen", "id_sum", "id_sq")]

    def call(self, inputs):
        return self.dense(inputs)

    @property
    def metrics(self):
        return list(self.counters)

    def train_step(self, data):
        features, labels, record_ids = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(labels, self(features, training=True))
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        for counter, value in zip(self.counters, (tf.ones_like(record_ids), record_ids, record_ids * record_ids)):
            counter.update_state(value)
        return {counter.name: counter.result() for counter in self.counters}


class Report(keras.callbacks.Callback):
    def __init__(self, leader: bool) -> None:
        super().__init__()
        self.leader, self.stepped = leader, False

    def on_train_batch_end(self, batch, logs=None):
        if self.leader and not self.stepped:  # wall-clock time of this group's first step, for the benchmark
            self.stepped = True
            print(f"FIRST_STEP generation {os.environ.get('TFDIST_MEMBERSHIP', '0')} at {time.time():.3f}", flush=True)

    def on_epoch_begin(self, epoch, logs=None):
        if self.leader:  # after ElasticEpochs recorded the previous epoch's boundary (it runs first)
            print(f"BEGIN {epoch} generation {os.environ.get('TFDIST_MEMBERSHIP', '0')}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if self.leader:
            kernel = " ".join(f"{v:.7g}" for v in self.model.dense.kernel.numpy().ravel())
            print(
                f"EPOCH {epoch} world {logs['world_size']:g} seen {logs['seen']:g} id_sum {logs['id_sum']:g} "
                f"id_sq {logs['id_sq']:g} kernel {kernel}",
                flush=True,
            )


with strategy.scope():
    model = Counted()
    model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse")
leader = strategy.cluster_resolver.task_id == 0 if "TF_CONFIG" in os.environ else True
backup = keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup"))
model.fit(dataset, epochs=epochs, verbose=0, callbacks=[backup, ElasticEpochs(), Report(leader)])
if leader:
    weights = np.concatenate([w.numpy().ravel() for w in model.dense.weights])
    print("FINAL " + " ".join(f"{v:.9g}" for v in weights), flush=True)
