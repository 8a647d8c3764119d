"""Where a model's embedding tables live: shards, rows and devices, for ParameterServerStrategy models.

Under ``tfdist.build_strategy("parameter_server", partition=...)`` every
variable created in ``strategy.scope()`` goes through TF's partitioner:
``partition="fixed"`` cuts each table into one shard per ps task,
``partition="min_size"`` (the default) only cuts variables larger than
``min_shard_bytes`` (up to one shard per ps), so small dense layers stay
whole. A tf-keras ``Embedding`` layer then holds a ``ShardedVariable``, and
its lookup (``tf.nn.embedding_lookup``) gathers only the requested rows from
each shard; its gradient is an ``IndexedSlices`` of those rows, so a step moves
rows, not tables. :func:`embedding_layout` reports the result, so a job can
check (and log) that its tables really are spread over every ps, and
:func:`local_weights` gathers the shards back into whole arrays, e.g. to
evaluate with a local copy of the model on the coordinator.

Example:
    >>> import tf_keras
    >>> from tfdist.keras import embedding_layout
    >>> layer = tf_keras.layers.Embedding(100, 8)
    >>> layer.build((None,))
    >>> [(t.name, t.rows, t.dim, len(t.shards)) for t in embedding_layout([layer])]
    [('embedding', 100, 8, 1)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from tfdist import _compat

__all__ = ["EmbeddingShard", "EmbeddingTable", "embedding_layout", "local_weights"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingShard:
    """One shard of an embedding table: its rows and the device holding them.

    Example:
        >>> EmbeddingShard(device="/job:ps/replica:0/task:1/device:CPU:0", rows=500).task
        'ps:1'
    """

    device: str
    rows: int

    @property
    def task(self) -> str:
        """'ps:0'-style name of the task holding the shard ('' when unplaced)."""
        parts = dict(p.split(":", 1) for p in self.device.split("/") if ":" in p)
        return f"{parts['job']}:{parts.get('task', '0')}" if "job" in parts else ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddingTable:
    """An embedding layer's table: name, full size and shards.

    Example:
        >>> shard = EmbeddingShard(device="/job:ps/replica:0/task:0/device:CPU:0", rows=10)
        >>> EmbeddingTable(name="users", rows=10, dim=4, shards=(shard,)).to_dict()["tasks"]
        ['ps:0']
    """

    name: str
    rows: int
    dim: int
    shards: tuple[EmbeddingShard, ...]

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(shard.task for shard in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "dim": self.dim,
            "shards": len(self.shards),
            "shard_rows": [s.rows for s in self.shards],
            "tasks": list(self.tasks),
        }


def _embedding_layers(layers: Iterable[Any]) -> Iterable[Any]:
    tf_keras = _compat.tf_keras_module("embedding_layout")
    for layer in layers:
        if isinstance(layer, tf_keras.layers.Embedding):
            yield layer
        elif hasattr(layer, "layers"):
            yield from _embedding_layers(layer.layers)


def embedding_layout(model_or_layers: Any) -> list[EmbeddingTable]:
    """The shards of every tf-keras ``Embedding`` table in a model (or a list of layers).

    Args:
      model_or_layers: A built tf-keras model, or an iterable of layers.

    Returns:
      One :class:`EmbeddingTable` per embedding layer, in layer order.
    """
    layers = model_or_layers.layers if hasattr(model_or_layers, "layers") else model_or_layers
    tables = []
    for layer in _embedding_layers(layers):
        variable = layer.embeddings
        parts = list(getattr(variable, "variables", None) or [variable])
        shards = tuple(EmbeddingShard(device=str(p.device), rows=int(p.shape[0])) for p in parts)
        tables.append(
            EmbeddingTable(
                name=layer.name, rows=sum(s.rows for s in shards), dim=int(variable.shape[-1]), shards=shards
            )
        )
    return tables


def local_weights(model: Any) -> list[Any]:
    """``model.get_weights()`` with every sharded variable gathered into one array.

    ``get_weights`` of a parameter-server model lists each shard separately,
    so it does not fit an unsharded copy of the model; this does
    (``copy.set_weights(local_weights(model))``). Shards are concatenated along
    axis 0, the axis TF's partitioners split.

    Args:
      model: A built tf-keras model (sharded or not).

    Returns:
      One numpy array per weight of an unsharded copy, in ``get_weights`` order.
    """
    import numpy as np

    out = []
    for layer in model.layers:
        seen: set[int] = set()
        for variable in _layer_variables(layer):
            if id(variable) in seen:
                continue
            seen.add(id(variable))
            parts = getattr(variable, "variables", None)
            out.append(np.concatenate([p.numpy() for p in parts]) if parts else variable.numpy())
    return out


def _layer_variables(layer: Any) -> list[Any]:
    """A layer's weights with each ShardedVariable kept whole (``layer.weights`` lists its shards)."""
    from tfdist._compat import is_sharded_variable

    sharded = {id(part): var for var in vars(layer).values() if is_sharded_variable(var) for part in var.variables}
    return [sharded.get(id(w), w) for w in layer.weights]
