"""shard_model, mesh_optimizer and the mesh input refuse what cannot work before DTensor runs (one process)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tf_keras

from tfdist import keras as tk
from tfdist.errors import StrategyError


@pytest.fixture
def mixed_policy() -> Iterator[None]:
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_mixed_precision_is_refused_with_the_alternative(mixed_policy: None) -> None:
    with pytest.raises(StrategyError, match="mixed_bfloat16.*set_global_policy\\('float32'\\)") as err:
        tk.shard_model(lambda: tf_keras.Sequential(), mesh=None)
    assert err.value.field == "mixed_precision policy"


def test_shard_model_needs_a_builder() -> None:
    with pytest.raises(StrategyError, match="`build`.*not `make_model\\(\\)`"):
        tk.shard_model(tf_keras.Sequential(), mesh=None)
    with pytest.raises(StrategyError, match="`mesh`.*build_mesh"):
        tk.shard_model(tf_keras.Sequential, mesh="model=2")


@pytest.mark.parametrize("source", [np.zeros((4, 2)), [1, 2, 3]])
def test_numpy_and_lists_cannot_feed_a_mesh(source: object) -> None:
    with pytest.raises(StrategyError, match="`source`.*Numpy arrays and plain datasets cannot be split"):
        tk.fit_input(source, mesh=object())


def test_optimizer_names_and_arguments_are_checked() -> None:
    with pytest.raises(StrategyError, match="did you mean 'adam'"):
        tk.mesh_optimizer("adma", mesh=None)
    with pytest.raises(StrategyError, match="did you mean 'learning_rate'.*Adam's own arguments"):
        tk.mesh_optimizer("adam", mesh=None, learnin_rate=0.1)
