"""The rules that choose which weights split along the model axis (pure Python)."""

from __future__ import annotations

import pytest

from tfdist.errors import StrategyError
from tfdist.parallel.layouts import UNSHARDED, Weight, choose_layouts

U = UNSHARDED


def dense(layer: str, inputs: int, outputs: int) -> list[Weight]:
    return [
        Weight(layer=layer, kind="dense", name="kernel", shape=(inputs, outputs)),
        Weight(layer=layer, kind="dense", name="bias", shape=(outputs,)),
    ]


def test_consecutive_dense_layers_pair_columns_then_rows() -> None:
    weights = dense("a", 64, 256) + dense("b", 256, 64) + dense("c", 64, 256) + dense("d", 256, 64)
    specs = choose_layouts(weights, model_size=4, min_elements=1000)
    assert specs["a.kernel"] == (U, "model") and specs["a.bias"] == ("model",)
    assert specs["b.kernel"] == ("model", U) and specs["b.bias"] == (U,)
    assert specs["c.kernel"] == (U, "model") and specs["d.kernel"] == ("model", U)


def test_small_or_indivisible_layers_stay_replicated_and_break_the_pair() -> None:
    weights = dense("a", 64, 256) + dense("tiny", 256, 2) + dense("odd", 64, 255) + dense("e", 255, 64)
    specs = choose_layouts(weights, model_size=2, min_elements=1000)
    assert specs["a.kernel"] == (U, "model")
    assert specs["tiny.kernel"] == (U, U)  # 512 values: below min_elements.
    assert specs["odd.kernel"] == (U, U)  # 255 columns do not split in 2, and the pair is broken.
    assert specs["e.kernel"] == (U, "model")  # Starts a new pair: after a replicated layer, columns.


def test_embeddings_split_by_columns_and_other_weights_replicate() -> None:
    weights = [
        Weight(layer="emb", kind="embedding", name="embeddings", shape=(50_000, 128)),
        Weight(layer="norm", kind="other", name="gamma", shape=(128,)),
    ]
    specs = choose_layouts(weights, model_size=2)
    assert specs == {"emb.embeddings": (U, "model"), "norm.gamma": (U,)}


def test_overrides_win_and_are_checked() -> None:
    weights = dense("a", 64, 256) + dense("b", 256, 64)
    specs = choose_layouts(weights, model_size=2, min_elements=1, overrides={"a": "replicate", "b": "column"})
    assert specs["a.kernel"] == (U, U) and specs["b.kernel"] == (U, "model") and specs["b.bias"] == ("model",)
    with pytest.raises(StrategyError, match="did you mean 'a'"):
        choose_layouts(weights, model_size=2, overrides={"aa": "row"})
    with pytest.raises(StrategyError, match="did you mean 'row'"):
        choose_layouts(weights, model_size=2, overrides={"a": "rows"})
    with pytest.raises(StrategyError, match="divides by the model axis \\(3\\)"):
        choose_layouts(weights, model_size=3, overrides={"a": "row"})
    table = [Weight(layer="emb", kind="embedding", name="embeddings", shape=(64, 32))]
    with pytest.raises(StrategyError, match="split it by 'column'"):
        choose_layouts(table, model_size=2, overrides={"emb": "row"})


def test_one_process_along_the_model_axis_replicates_everything() -> None:
    specs = choose_layouts(dense("a", 512, 512) + dense("b", 512, 512), model_size=1)
    assert set(specs.values()) == {(U, U), (U,)}


def test_weight_kinds_are_checked() -> None:
    with pytest.raises(StrategyError, match="`kind`"):
        Weight(layer="a", kind="conv", name="kernel", shape=(3, 3))
