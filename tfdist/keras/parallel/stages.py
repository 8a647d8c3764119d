"""Pipeline parallelism for tf-keras: consecutive layers in S stages on worker tasks, M micro-batches per step.

In a script launched with ``tfdist-launch --chief --workers 2 --run-on chief`` (the chief runs it, the
workers serve their devices)::

    stages = tfdist.parallel.connect_stages()
    model = tfdist.keras.stage_model(make_layers, stages, input_shape=(784,), micro_batches=4)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(dataset, epochs=3)

:func:`stage_model` cuts the layers into ``len(stages)`` consecutive stages of balanced parameter bytes
(or the ``costs`` you measured), creates each stage's weights on its device, and trains with one gradient
tape per stage, so each stage's backward pass runs on its own device too. A step splits the batch into M
micro-batches; TensorFlow runs stage s of micro-batch m+1 while stage s+1 works on micro-batch m (GPipe's
schedule), and the gradients are the mean over micro-batches: the same update as the whole batch in one
process. ``pipeline_model`` is the same function under the name of the technique ("pipeline" alone, in
tfdist, is the input pipeline).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from tfdist import _compat
from tfdist.errors import StrategyError, invalid, require_int
from tfdist.keras._builders import require_builder
from tfdist.parallel.stages import split_layers

__all__ = ["pipeline_model", "stage_model"]

_log = logging.getLogger("tfdist.keras")


def stage_model(
    build: Callable[[], Any],
    stages: Sequence[str],
    *,
    input_shape: Sequence[int],
    input_dtype: str = "float32",
    micro_batches: int = 1,
    costs: Sequence[float] | None = None,
) -> Any:
    """A tf-keras model whose consecutive layers run on ``stages`` (devices), trained with ``micro_batches``.

    Args:
      build: A function returning a ``tf_keras.Sequential``. It is called once, without allocating
        anything (tf-keras's lazy variables); each layer is then made again from its config and built on
        its stage's device, so the model is never created whole on the chief.
      stages: One device per stage, e.g. from :func:`tfdist.parallel.connect_stages`.
      input_shape: One example's shape (without the batch dimension).
      input_dtype: The input's dtype.
      micro_batches: Micro-batches per step (the batch must divide by it); 1: no pipelining.
      costs: Each layer's cost to balance the stages by (for example measured seconds); default the
        layers' parameter counts.

    Returns:
      A ``tf_keras.Model``; ``model.stage_of`` maps each layer's name to its stage.
    """
    tf_keras = _compat.tf_keras_module("stage_model")
    require_int(StrategyError, "micro_batches", micro_batches, minimum=1)
    if isinstance(stages, str) or not stages or not all(isinstance(s, str) for s in stages):
        raise invalid(StrategyError, "stages", stages, "a list of device names, one per stage")
    with _compat.lazy_variables():
        probe = _sequential(build, tf_keras)
        if not probe.built:
            probe.build((None, *input_shape))
        counts = [float(sum(_elements(w.shape) for w in layer.weights)) for layer in probe.layers]
        configs = [(type(layer), _config(layer)) for layer in probe.layers]
    del probe
    if costs is not None and len(costs) != len(counts):
        raise invalid(StrategyError, "costs", list(costs), f"one cost per layer ({len(counts)} layers)")
    groups = split_layers(list(costs) if costs is not None else counts, stages=len(stages))
    layers = [cls.from_config(config) for cls, config in configs]  # Fresh, unbuilt: built on their stages.
    model = _staged_class(tf_keras)(
        stage_layers=[[layers[i] for i in group] for group in groups],
        devices=list(stages),
        micro_batches=micro_batches,
    )
    import tensorflow as tf

    model(tf.zeros((micro_batches, *input_shape), dtype=input_dtype))  # Each stage's weights on its device.
    _log.info(
        "stage_model: %s",
        "; ".join(
            f"stage {s} on {stages[s]}: {[layers[i].name for i in g]} ({int(sum(counts[i] for i in g))} values)"
            for s, g in enumerate(groups)
        ),
    )
    return model


def _elements(shape: Any) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total


def _sequential(build: Callable[[], Any], tf_keras: Any) -> Any:
    require_builder(
        build, returns="a tf_keras.Sequential", example="make_layers", why="the layers are made on their stages"
    )
    model = build()
    if not isinstance(model, tf_keras.Sequential):
        raise invalid(StrategyError, "build", type(model).__name__, "a function returning a tf_keras.Sequential")
    return model


def _config(layer: Any) -> dict[str, Any]:
    try:
        return dict(layer.get_config())
    except NotImplementedError:
        raise invalid(
            StrategyError,
            "build",
            layer.name,
            f"layers with a get_config() ({type(layer).__name__} has none)",
            "Each layer is made again from its config on its stage: give the layer a get_config().",
        ) from None


def _staged_class(tf_keras: Any) -> type:
    import tensorflow as tf

    class StagedModel(tf_keras.Model):
        """Stages of layers, each on its device; one tape per stage and micro-batches in ``train_step``."""

        def __init__(self, *, stage_layers: list[list[Any]], devices: list[str], micro_batches: int) -> None:
            super().__init__(name="staged_model")
            self.stage_layers = stage_layers
            self.devices = devices
            self.micro_batches = micro_batches
            self.stage_of = {layer.name: s for s, group in enumerate(stage_layers) for layer in group}

        def _stage(self, s: int, x: Any, training: bool) -> Any:
            with tf.device(self.devices[s]):
                for layer in self.stage_layers[s]:
                    x = layer(x, training=training)
            return x

        def call(self, inputs: Any, training: bool = False) -> Any:
            x = inputs
            for s in range(len(self.stage_layers)):
                x = self._stage(s, x, training)
            return x

        def train_step(self, data: Any) -> Any:
            x, y = data[0], data[1]
            count = self.micro_batches
            xs, ys = tf.split(x, count), tf.split(y, count)
            variables = [[v for layer in group for v in layer.trainable_variables] for group in self.stage_layers]
            sums: list[list[Any]] = [[None] * len(vs) for vs in variables]
            predictions = []
            for m in range(count):
                h, grads = _micro_batch(self, tf, xs[m], ys[m], variables)
                predictions.append(h)
                for s, stage in enumerate(grads):
                    for i, g in enumerate(stage):
                        g = tf.convert_to_tensor(g) / count
                        sums[s][i] = g if sums[s][i] is None else sums[s][i] + g
            pairs = [(g, v) for gs, vs in zip(sums, variables) for g, v in zip(gs, vs)]
            self.optimizer.apply_gradients(pairs)
            self.compiled_metrics.update_state(y, tf.concat(predictions, axis=0))
            return {metric.name: metric.result() for metric in self.metrics}

    return StagedModel


def _micro_batch(model: Any, tf: Any, x: Any, y: Any, variables: list[list[Any]]) -> tuple[Any, list[list[Any]]]:
    """One micro-batch through every stage, one tape each, then back: its predictions and each stage's gradients.

    Each stage's input is watched on that stage's device, so the gradient flowing back to a stage is its
    output's (``output_gradients``) and the stages' gradient work stays on their devices.
    """
    tapes, h, loss, last = [], x, None, len(model.stage_layers) - 1
    for s in range(last + 1):
        with tf.GradientTape() as tape:
            with tf.device(model.devices[s]):
                h_in = tf.identity(h)
            tape.watch(h_in)
            h = model._stage(s, h_in, True)
            if s == last:
                with tf.device(model.devices[s]):
                    loss = model.compiled_loss(y, h)
        tapes.append((tape, h_in, h))
    grads: list[list[Any]] = [[] for _ in tapes]
    upstream = None
    for s in range(last, -1, -1):
        tape, h_in, h_out = tapes[s]
        with tf.device(model.devices[s]):
            target = loss if s == last else h_out
            found = tape.gradient(target, [h_in, *variables[s]], output_gradients=upstream)
            upstream, grads[s] = found[0], list(found[1:])
    return h, grads


pipeline_model = stage_model
