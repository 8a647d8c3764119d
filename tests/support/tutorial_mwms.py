"""TensorFlow's "Multi-worker training with Keras" tutorial, as written there, on made-up MNIST-shaped data.

Plain TensorFlow: no tfdist import. Run by tfdist-launch (any engine), which sets TF_CONFIG and
TF_USE_LEGACY_KERAS=1 (``tf.keras`` is then tf-keras). Prints ``RESULT {json}`` with a hash of the weights.
"""

import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)  # The tutorial downloads MNIST; the same shapes, no network.
    x_train = rng.integers(0, 255, size=(1024, 28, 28)).astype(np.float32) / np.float32(255)
    y_train = (x_train.mean(axis=(1, 2)) > 0.5).astype(np.int64) + (x_train[:, 0, 0] > 0.5)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=1).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

tf.keras.utils.set_random_seed(1)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=10, verbose=0)
digest = hashlib.sha1(b"".join(w.tobytes() for w in multi_worker_model.get_weights())).hexdigest()
result = {
    "task": tf_config["task"],
    "replicas": strategy.num_replicas_in_sync,
    "loss": [float(v) for v in history.history["loss"]],
    "weights_sha1": digest,
}
sys.stdout.write("RESULT " + json.dumps(result) + "\n")
