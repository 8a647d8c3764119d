"""local_sgd's settings and errors in one process (its averaging on real workers: tests/comm/test_communication.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tfdist.errors import StrategyError


def _model(steps_per_execution: int = 1, compiled: bool = True) -> Any:
    import tf_keras as keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, name="out")])
    if compiled:
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=steps_per_execution)
    return model


def test_bad_settings_name_the_field_and_the_fix() -> None:
    from tfdist.keras import local_sgd

    with pytest.raises(StrategyError, match=r"`period`. Received: 0"):
        local_sgd(_model(), period=0)
    with pytest.raises(StrategyError, match=r"`model`.*compiled.*Call model.compile"):
        local_sgd(_model(compiled=False), period=2)
    with pytest.raises(
        StrategyError, match=r"`period`. Received: 6. Expected a multiple of the model's steps_per_execution \(4\)"
    ):
        local_sgd(_model(steps_per_execution=4), period=6)


def test_one_worker_trains_and_averages_at_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    # One replica: the mean is the weights themselves, so local SGD is plain SGD; the averaging runs every
    # 8 steps of 4 per call (steps_per_execution=4), counted by the optimizer's iterations.
    from tfdist.keras import averaging, local_sgd

    calls: list[int] = []
    original = averaging._Averaging.__call__

    def counted(self: averaging._Averaging) -> None:
        calls.append(int(self._model.optimizer.iterations.numpy()))
        original(self)

    monkeypatch.setattr(averaging._Averaging, "__call__", counted)
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    plain, local = _model(4), _model(4)
    local.set_weights(plain.get_weights())
    local_sgd(local, period=8)
    histories = [m.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"] for m in (plain, local)]
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-6)
    assert calls == [8, 16]  # 16 steps: two periods.
    assert local.local_sgd_period == 8
