"""Which weights to split along the model axis, and how: the rules ``shard_model`` applies (pure Python).

The rules follow Megatron-LM's tensor parallelism:

- **Dense layers in a row pair up.** The first splits its kernel by columns (each process computes a slice
  of the outputs, bias split alike), the next by rows (each process multiplies its slice of the inputs;
  one all-reduce sums the partial outputs, bias replicated). A layer too small, or whose split size does
  not divide, is replicated and ends the pair.
- **Embeddings split by columns** (each process holds a slice of every vector, 1/M of the table). DTensor
  cannot gather from a table split by rows (``ResourceGather`` on a sharded 0th dimension), so 'row' is
  refused for embeddings.
- **Everything else is replicated**: biases of row-split layers, normalization, small tensors.
- **Overrides by layer name** win: 'column', 'row' or 'replicate'.

Example:
    >>> weights = [
    ...     Weight(layer="emb", kind="embedding", name="embeddings", shape=(1000, 64)),
    ...     Weight(layer="up", kind="dense", name="kernel", shape=(64, 256)),
    ...     Weight(layer="up", kind="dense", name="bias", shape=(256,)),
    ...     Weight(layer="down", kind="dense", name="kernel", shape=(256, 64)),
    ...     Weight(layer="down", kind="dense", name="bias", shape=(64,)),
    ... ]
    >>> choose_layouts(weights, model_size=2, min_elements=1000)  # doctest: +NORMALIZE_WHITESPACE
    {'emb.embeddings': ('unsharded', 'model'), 'up.kernel': ('unsharded', 'model'), 'up.bias': ('model',),
     'down.kernel': ('model', 'unsharded'), 'down.bias': ('unsharded',)}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tfdist._names import describe_choices
from tfdist.errors import StrategyError, invalid

__all__ = ["POLICIES", "Weight", "choose_layouts"]

UNSHARDED = "unsharded"  # DTensor's name for a dimension that is not split.
POLICIES = ("column", "row", "replicate")
_KINDS = ("dense", "embedding", "other")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Weight:
    """One weight of a model, as the rules see it.

    Attributes:
      layer: The layer's name (unique in a model).
      kind: 'dense', 'embedding' or 'other'.
      name: The weight's attribute: 'kernel', 'bias', 'embeddings', ...
      shape: Its shape.
    """

    layer: str
    kind: str
    name: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise invalid(StrategyError, "kind", self.kind, describe_choices(self.kind, _KINDS))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def path(self) -> str:
        """``layer.name``, the key tf-keras's LayoutMap looks up for a functional model's weight."""
        return f"{self.layer}.{self.name}"

    @property
    def elements(self) -> int:
        """Number of values in the weight."""
        total = 1
        for dim in self.shape:
            total *= dim
        return total


def choose_layouts(
    weights: Sequence[Weight],
    *,
    model_size: int,
    min_elements: int = 1 << 14,
    overrides: Mapping[str, str] | None = None,
    model_axis: str = "model",
) -> dict[str, tuple[str, ...]]:
    """``layer.weight`` -> sharding specs (one per dimension: ``model_axis`` or 'unsharded'), every weight listed.

    Args:
      weights: The model's weights in layer order (the order decides which Dense layers pair up).
      model_size: Processes (devices) along the model axis; 1 replicates everything.
      min_elements: Kernels and embeddings with fewer values stay replicated.
      overrides: Layer name -> 'column', 'row' or 'replicate'; wins over the rules.
      model_axis: The mesh axis weights are split along.
    """
    overrides = dict(overrides or {})
    layers = {w.layer for w in weights}
    for layer, policy in overrides.items():
        if layer not in layers:
            raise invalid(StrategyError, "overrides", layer, describe_choices(layer, sorted(layers)))
        if policy not in POLICIES:
            raise invalid(StrategyError, f"overrides[{layer!r}]", policy, describe_choices(policy, POLICIES))
    policy_of = _layer_policies(weights, model_size, min_elements, overrides)
    return {w.path: _specs(w, policy_of.get(w.layer, "replicate"), model_axis) for w in weights}


def _layer_policies(
    weights: Sequence[Weight], model_size: int, min_elements: int, overrides: Mapping[str, str]
) -> dict[str, str]:
    main = {w.layer: w for w in weights if (w.kind, w.name) in (("dense", "kernel"), ("embedding", "embeddings"))}
    policies: dict[str, str] = {}
    previous_column = False  # The Dense layer before this one was split by columns: this one pairs by rows.
    for layer, weight in main.items():
        if layer in overrides:
            policy = overrides[layer]
        elif model_size == 1 or weight.elements < min_elements or len(weight.shape) != 2:
            policy = "replicate"
        elif weight.kind == "embedding":
            policy = "column" if weight.shape[-1] % model_size == 0 else "replicate"
        elif previous_column and weight.shape[0] % model_size == 0:
            policy = "row"
        elif weight.shape[1] % model_size == 0:
            policy = "column"
        else:
            policy = "replicate"
        if weight.kind == "embedding" and policy == "row":
            raise invalid(
                StrategyError,
                f"overrides[{layer!r}]",
                policy,
                "'column' or 'replicate' for an embedding",
                "DTensor cannot gather rows of a table split by rows; split it by 'column'.",
            )
        if policy != "replicate" and not _divides(weight, policy, model_size):
            raise invalid(
                StrategyError,
                f"overrides[{layer!r}]",
                policy,
                f"a split whose size divides by the model axis ({model_size}); {weight.path} is {weight.shape}",
                "Choose another split, or 'replicate'.",
            )
        policies[layer] = policy
        if weight.kind == "dense":
            previous_column = policy == "column"
    return policies


def _divides(weight: Weight, policy: str, model_size: int) -> bool:
    dim = 0 if policy == "row" else len(weight.shape) - 1
    return len(weight.shape) >= 1 and weight.shape[dim] % model_size == 0


def _specs(weight: Weight, policy: str, axis: str) -> tuple[str, ...]:
    rank = len(weight.shape)
    specs = [UNSHARDED] * rank
    main = weight.name in ("kernel", "embeddings")
    if policy == "column" and rank and (main or weight.name == "bias"):
        specs[-1] = axis
    elif policy == "row" and main and rank:
        specs[0] = axis
    return tuple(specs)
