"""TensorFlow's "Parameter server training with ParameterServerStrategy" tutorial (its Model.fit part), as
written there, on made-up data.

Plain TensorFlow: no tfdist import. tfdist-launch runs it on the chief (the coordinator); the workers and
parameter servers run tfdist's TF server, which the tutorial starts by hand with ``tf.distribute.Server``.
Prints ``RESULT {json}``.
"""

import json
import os
import sys

import tensorflow as tf

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=len(cluster_resolver.cluster_spec().as_dict().get("ps", []))
)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

global_batch_size = 64
x = tf.random.stateless_uniform((640, 10), seed=(1, 2))
y = tf.random.stateless_uniform((640, 1), seed=(3, 4))


def dataset_fn(input_context):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    return dataset.batch(batch_size).prefetch(2)


dc = tf.keras.utils.experimental.DatasetCreator(dataset_fn)

with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
    model.compile(tf.keras.optimizers.legacy.SGD(), loss="mse", steps_per_execution=5)

working_dir = os.environ.get("TUTORIAL_DIR", "/tmp/my_working_dir")
log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt")
backup_dir = os.path.join(working_dir, "backup")
callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=log_dir),
    tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]
history = model.fit(dc, epochs=5, steps_per_epoch=20, callbacks=callbacks, verbose=0)
result = {
    "ps": isinstance(strategy, tf.distribute.ParameterServerStrategy),
    "workers": len(cluster_resolver.cluster_spec().as_dict()["worker"]),
    "loss": [float(v) for v in history.history["loss"]],
    "task": json.loads(os.environ["TF_CONFIG"])["task"],
}
sys.stdout.write("RESULT " + json.dumps(result) + "\n")
