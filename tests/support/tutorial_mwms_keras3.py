"""TensorFlow's "Multi-worker training with Keras" tutorial written for Keras 3, on made-up MNIST-shaped data.

What differs from the tutorial's ``mnist_setup.py`` and ``main.py`` (tensorflow/docs,
site/en/tutorials/distribute/multi_worker_with_keras.ipynb), here in one file:

- for tfdist: ``import tfdist`` added, and the line ``strategy = tf.distribute.MultiWorkerMirroredStrategy()``
  replaced by ``strategy = tfdist.build_strategy("auto")``;
- for Keras 3: ``import keras`` added and ``keras.`` for ``tf.keras.`` (tfdist-launch sets TF_USE_LEGACY_KERAS=1
  where tf-keras is installed, and ``tf.keras`` is tf-keras there); ``keras.layers.InputLayer(input_shape=(28,
  28))`` is the tutorial's (Keras 3.15 still takes ``input_shape``, with a deprecation warning);
- for CI, as in tutorial_mwms.py (its tf-keras copy): made-up data of MNIST's shapes for the download (1024
  records, ``shuffle(1024, seed=1)`` for ``shuffle(60000)``), a smaller model and a shorter fit (``Conv2D(8)`` and
  ``Dense(32)`` for ``Conv2D(32)`` and ``Dense(128)``, learning rate 0.01 for 0.001, 32 records per worker for 64,
  ``epochs=2, steps_per_epoch=10, verbose=0`` for ``epochs=3, steps_per_epoch=70``),
  ``keras.utils.set_random_seed(1)`` before the model, and the ``RESULT {json}`` line printed at the end (the task,
  replicas, Keras version, losses and a hash of the weights).
"""

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)  # The tutorial downloads MNIST; the same shapes, no network.
    x_train = rng.integers(0, 255, size=(1024, 28, 28)).astype(np.float32) / np.float32(255)
    y_train = (x_train.mean(axis=(1, 2)) > 0.5).astype(np.int64) + (x_train[:, 0, 0] > 0.5)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1024, seed=1).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential(
        [
            keras.layers.InputLayer(input_shape=(28, 28)),
            keras.layers.Reshape(target_shape=(28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tfdist.build_strategy("auto")
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

keras.utils.set_random_seed(1)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=10, verbose=0)
digest = hashlib.sha1(b"".join(w.tobytes() for w in multi_worker_model.get_weights())).hexdigest()
result = {
    "task": tf_config["task"],
    "replicas": strategy.num_replicas_in_sync,
    "keras": keras.__version__,
    "loss": [float(v) for v in history.history["loss"]],
    "weights_sha1": digest,
}
sys.stdout.write("RESULT " + json.dumps(result) + "\n")
