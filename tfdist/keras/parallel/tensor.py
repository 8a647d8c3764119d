"""Tensor parallelism for tf-keras on a DTensor mesh: layouts by rule, a densifying optimizer, and a report.

In a training script launched with ``tfdist-launch --workers 2 --mesh model=2``::

    mesh = tfdist.parallel.build_mesh()
    model = tfdist.keras.shard_model(make_model, mesh)        # Megatron-style layouts, chosen for you
    model.compile(optimizer=tfdist.keras.mesh_optimizer("adam", mesh, learning_rate=1e-3), loss=...)
    model.fit(tfdist.keras.fit_input(pipeline, mesh=mesh), epochs=3)
    report = tfdist.keras.sharding_report(model)              # report.describe(): what each process holds

:func:`shard_model` builds the model once without allocating anything to read its layers, chooses the
layouts (:mod:`tfdist.parallel.layouts`) and builds it again under them, so a model too large for one
device is never materialized whole.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfdist import _compat
from tfdist._names import describe_choices
from tfdist.errors import StrategyError, check_keywords, invalid
from tfdist.keras._builders import require_builder
from tfdist.parallel.layouts import Weight, choose_layouts

__all__ = ["ShardingReport", "mesh_optimizer", "shard_model", "sharding_report"]

_log = logging.getLogger("tfdist.keras")
OPTIMIZERS = ("adadelta", "adagrad", "adam", "adamw", "rmsprop", "sgd")
_OPTIMIZER_CLASSES = {
    "adadelta": "Adadelta",
    "adagrad": "Adagrad",
    "adam": "Adam",
    "adamw": "AdamW",
    "rmsprop": "RMSprop",
    "sgd": "SGD",
}


def shard_model(
    build: Callable[[], Any],
    mesh: Any,
    *,
    overrides: Mapping[str, str] | None = None,
    min_elements: int = 1 << 14,
    model_axis: str = "model",
) -> Any:
    """Builds ``build()``'s functional tf-keras model with its weights split over ``mesh``'s model axis.

    Args:
      build: A function that returns a functional (or Sequential with an ``Input``) tf-keras model; it is
        called twice, so it must not depend on state it changes.
      mesh: The mesh from :func:`tfdist.parallel.build_mesh`.
      overrides: Layer name -> 'column', 'row' or 'replicate', over the rules.
      min_elements: Kernels and embeddings with fewer values stay replicated.
      model_axis: The mesh axis to split along; a mesh without it replicates every weight.

    Returns:
      The model, its variables DTensor variables with the chosen layouts (see :func:`sharding_report`).
    """
    tf_keras = _compat.tf_keras_module("shard_model")
    require_builder(
        build, returns="a tf-keras model", example="make_model", why="the weights are created under the layouts"
    )
    _check_policy(tf_keras)
    from tensorflow.experimental import dtensor

    if not isinstance(mesh, dtensor.Mesh):
        raise invalid(StrategyError, "mesh", type(mesh).__name__, "a Mesh from tfdist.parallel.build_mesh()")
    model_size = mesh.dim_size(model_axis) if model_axis in mesh.dim_names else 1
    with _compat.lazy_variables():
        probe = _built(build, tf_keras)
        weights = _weights(probe, tf_keras)
    del probe
    specs = choose_layouts(
        weights, model_size=model_size, min_elements=min_elements, overrides=overrides, model_axis=model_axis
    )
    layout_map = tf_keras.dtensor.experimental.LayoutMap(mesh=mesh)
    for path, spec in specs.items():
        if model_axis in spec:
            layout_map[re.escape(path) + "$"] = dtensor.Layout(list(spec), mesh)
    with layout_map.scope():
        model = _built(build, tf_keras)
    _guard(model, mesh)
    chosen = {path: spec for path, spec in specs.items() if model_axis in spec}
    _log.info("shard_model: %d of %d weights split along %r: %s", len(chosen), len(specs), model_axis, chosen)
    return model


_KERAS_FILES = (".keras", ".h5", ".hdf5")


def _guard(model: Any, mesh: Any) -> None:
    """Turns what DTensor cannot do into errors that say so: numpy or plain datasets, Keras-file saving.

    Without this, ``fit`` on numpy fails inside tf-keras (``Could not find tf._element_layouts``, and once a
    segfault on the next call) and ``.keras``/``.h5`` saving fails on the layouts.
    """
    from tensorflow.experimental import dtensor

    def checked_input(method: str, call: Any) -> Any:
        def run(x: Any = None, *args: Any, **kwargs: Any) -> Any:
            if method == "fit":
                _follow_leader(kwargs.get("callbacks"), mesh)
            if not isinstance(x, dtensor.DTensorDataset):
                raise invalid(
                    StrategyError,
                    "x",
                    type(x).__name__,
                    f"a DTensorDataset for {method} on a mesh",
                    "Pass tfdist.keras.fit_input(pipeline, mesh=mesh): numpy arrays and plain tf.data datasets "
                    "carry no layouts for DTensor.",
                )
            return call(x, *args, **kwargs)

        return run

    def checked_save(method: str, call: Any, allowed: tuple[str, ...]) -> Any:
        def run(filepath: Any, *args: Any, **kwargs: Any) -> Any:
            kind = str(kwargs.get("save_format") or "")
            if str(filepath).endswith(_KERAS_FILES) or kind in ("h5", "keras"):
                raise invalid(
                    StrategyError,
                    "filepath",
                    str(filepath),
                    f"a TensorFlow-format path for {method} on a mesh (no {', '.join(_KERAS_FILES)})",
                    f"Save with a path without those suffixes ({allowed[0]}), the same on every process, or "
                    "use tf.train.Checkpoint / BackupAndRestore.",
                )
            # TF format: the variables' shards are merged once every process wrote its own (as for backups).
            prefix = (
                str(filepath) if method == "save_weights" else os.path.join(str(filepath), "variables", "variables")
            )
            return _compat.merged_after_barrier(
                lambda: call(filepath, *args, **kwargs),
                prefix,
                leader=dtensor.client_id() == 0,
                barrier=lambda: dtensor.barrier(mesh, f"tfdist_{method}"),
            )

        return run

    for method in ("fit", "evaluate", "predict"):
        setattr(model, method, checked_input(method, getattr(model, method)))
    model.save = checked_save("save", model.save, ("'model_dir'",))
    model.save_weights = checked_save("save_weights", model.save_weights, ("'weights/ckpt'",))


def _follow_leader(callbacks: Any, mesh: Any) -> None:
    """Backups record only complete checkpoints, from the first process (``_compat.follow_leader_checkpoints``)."""
    import tf_keras
    from tensorflow.experimental import dtensor

    for callback in callbacks or ():
        if isinstance(callback, tf_keras.callbacks.BackupAndRestore) and not getattr(callback, "_tfdist_mesh", False):
            _compat.follow_leader_checkpoints(
                callback, leader=dtensor.client_id() == 0, barrier=lambda: dtensor.barrier(mesh, "tfdist_backup")
            )
            callback._tfdist_mesh = True


def _check_policy(tf_keras: Any) -> None:
    policy = tf_keras.mixed_precision.global_policy().name
    if policy != "float32":
        raise invalid(
            StrategyError,
            "mixed_precision policy",
            policy,
            "'float32' on a DTensor mesh (tf-keras's DTensor layers cannot lay out mixed-precision variables)",
            "Call tf_keras.mixed_precision.set_global_policy('float32') before shard_model, or train "
            "data parallel (MultiWorkerMirroredStrategy) for mixed precision.",
        )


def _built(build: Callable[[], Any], tf_keras: Any) -> Any:
    model = build()
    if not isinstance(model, tf_keras.Model):
        raise invalid(StrategyError, "build", type(model).__name__, "a function returning a tf_keras.Model")
    if not _compat.is_functional(model):
        raise invalid(
            StrategyError,
            "build",
            type(model).__name__,
            "a functional model (tf_keras.Model(inputs, outputs), or Sequential starting with an Input)",
            "Layouts by rule need the layer graph; for a subclassed model, build a "
            "tf_keras.dtensor.experimental.LayoutMap yourself.",
        )
    return model


def _weights(model: Any, tf_keras: Any) -> list[Weight]:
    out = []
    for layer in model.layers:
        kind = (
            "dense"
            if isinstance(layer, tf_keras.layers.Dense)
            else "embedding"
            if isinstance(layer, tf_keras.layers.Embedding)
            else "other"
        )
        for variable in layer.weights:
            name = variable.name.split("/")[-1].split(":")[0]
            out.append(Weight(layer=layer.name, kind=kind, name=name, shape=tuple(variable.shape)))
    return out


def mesh_optimizer(name: str, mesh: Any, **kwargs: Any) -> Any:
    """A tf-keras DTensor optimizer for ``mesh`` that also takes embedding gradients.

    tf-keras's DTensor optimizers cannot apply sparse (``IndexedSlices``) gradients: DTensor has no layout
    rule for the scatter they use. This one makes them dense first, which is what the update computes anyway.

    Args:
      name: One of :data:`OPTIMIZERS` ('adam', 'sgd', ...).
      mesh: The mesh the model's variables live on.
      **kwargs: The optimizer's own arguments (``learning_rate=...``).

    Example:
        >>> mesh_optimizer("lamb", mesh=None)
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyError: Invalid value for `name`. Received: 'lamb'. Expected one of 'adadelta', \
'adagrad', 'adam', 'adamw', 'rmsprop', 'sgd' (did you mean 'adam'?).
    """
    if not isinstance(name, str) or name.lower() not in _OPTIMIZER_CLASSES:
        raise invalid(StrategyError, "name", name, describe_choices(name, OPTIMIZERS))
    tf_keras = _compat.tf_keras_module("mesh_optimizer")
    base = getattr(tf_keras.dtensor.experimental.optimizers, _OPTIMIZER_CLASSES[name.lower()])
    accepted = [p for p in inspect.signature(base.__init__).parameters if p not in ("self", "mesh", "kwargs")]
    check_keywords(StrategyError, "kwargs", kwargs, accepted, f"They are {base.__name__}'s own arguments.")
    cls = type(f"Mesh{base.__name__}", (base,), {"apply_gradients": _dense_apply})
    return cls(mesh=mesh, **kwargs)


def _dense_apply(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
    import tensorflow as tf

    dense = [(tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v) for g, v in grads_and_vars]
    return super(type(self), self).apply_gradients(dense, *args, **kwargs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightShard:
    """One variable's layout and what this process holds of it.

    Attributes:
      name: The variable's name.
      shape: Its global shape.
      specs: Its sharding specs (one per dimension).
      global_bytes: Bytes of the whole variable.
      local_bytes: Bytes held by this process (all its devices' components).
      optimizer: Whether it is optimizer state.
    """

    name: str
    shape: tuple[int, ...]
    specs: tuple[str, ...]
    global_bytes: int
    local_bytes: int
    optimizer: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingReport:
    """What a process holds of a model's weights and optimizer state on a mesh.

    Attributes:
      shards: One :class:`WeightShard` per variable.
      local_devices: This process's devices in the mesh.
    """

    shards: tuple[WeightShard, ...]
    local_devices: int

    @property
    def local_bytes(self) -> int:
        """Bytes of weights and optimizer state this process holds (over all its devices)."""
        return sum(s.local_bytes for s in self.shards)

    @property
    def global_bytes(self) -> int:
        """Bytes of weights and optimizer state of the whole model (one copy)."""
        return sum(s.global_bytes for s in self.shards)

    def describe(self) -> str:
        """A table: each variable's shape, layout and bytes here, then the totals."""
        lines = [f"{'variable':40s} {'shape':>16s} {'layout':>24s} {'bytes here':>12s}"]
        for s in self.shards:
            lines.append(
                f"{s.name[:40]:40s} {list(s.shape)!s:>16s} {','.join(s.specs) or '-':>24s} {s.local_bytes:>12,d}"
            )
        lines.append(
            f"this process: {self.local_bytes:,d} bytes on {self.local_devices} device(s); "
            f"one whole copy: {self.global_bytes:,d} bytes"
        )
        return "\n".join(lines)


def sharding_report(model: Any) -> ShardingReport:
    """The layout of each of ``model``'s variables (and its optimizer's, once built) and the bytes held here."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    optimizer = getattr(model, "optimizer", None)
    found = getattr(optimizer, "variables", None) if optimizer is not None else None
    opt_vars = list(found() if callable(found) else found or [])
    shards, devices = [], 0
    for variable, is_opt in [(v, False) for v in model.variables] + [(v, True) for v in opt_vars]:
        try:
            layout = dtensor.fetch_layout(variable)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError):
            raise invalid(
                StrategyError,
                "model",
                variable.name,
                "DTensor variables (a model built by shard_model or under a LayoutMap)",
            ) from None
        components = dtensor.unpack(variable.read_value())
        devices = max(devices, len(components))
        size = variable.dtype.size
        elements = 1
        for dim in variable.shape:
            elements *= int(dim)
        shards.append(
            WeightShard(
                name=variable.name,
                shape=tuple(int(d) for d in variable.shape),
                specs=tuple(str(s) for s in layout.sharding_specs),
                global_bytes=elements * size,
                local_bytes=sum(int(tf.size(c)) for c in components) * size,
                optimizer=is_opt,
            )
        )
    return ShardingReport(shards=tuple(shards), local_devices=devices)
