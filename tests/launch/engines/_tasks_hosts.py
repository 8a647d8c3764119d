"""What the tasks of tests/launch/engines/test_hosts.py run (each task imports this file by path)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from tests.support.cluster_tasks import _regression_dataset, _small_model, ps_fit

STEPS_ON = 1000  # the second fit's steps: far more than the test lets it take


def _binds(host: str) -> bool:
    """Whether ``host`` is an address of this task's own network (a socket can bind it)."""
    try:
        with socket.socket() as sock:
            sock.bind((host, 0))
    except OSError:
        return False
    return True


def addresses() -> dict[str, Any]:
    """This task's address in TF_CONFIG, whether it is its own, and whether any other task's is too."""
    spec = json.loads(os.environ["TF_CONFIG"])
    me = spec["cluster"][spec["task"]["type"]][spec["task"]["index"]].rsplit(":", 1)[0]
    others = {a.rsplit(":", 1)[0] for job in spec["cluster"].values() for a in job} - {me}
    return {"address": me, "own": _binds(me), "others_own": sorted(o for o in others if _binds(o))}


def mwms_fit_until_cut() -> dict[str, Any]:
    """A short MultiWorkerMirroredStrategy fit (RING all-reduce over the hosts' links), then one that steps on.

    After the first fit each task prints ``HOSTS`` and what it saw as JSON (its address, the replicas, the
    loss); the second prints ``STEP n`` after each of its steps, for the test to cut a link on: it stalls
    there, and the launcher's stall inspector ends the run (it ends by itself after ``STEPS_ON`` steps).
    """
    import tfdist

    strategy = tfdist.build_strategy("auto", communication="ring")
    from tfdist import keras

    with strategy.scope():
        model = _small_model(keras)
    history = model.fit(_regression_dataset(), epochs=1, steps_per_epoch=4, verbose=0)
    seen = {**addresses(), "replicas": strategy.num_replicas_in_sync, "loss": history.history["loss"]}
    print("HOSTS " + json.dumps(seen), flush=True)

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            print(f"STEP {batch}", flush=True)

    model.fit(_regression_dataset().repeat(), epochs=1, steps_per_epoch=STEPS_ON, verbose=0, callbacks=[Steps()])
    return seen


def ps_coordinator() -> dict[str, Any]:
    """The coordinator of a short parameter-server fit (workers and ps run tfdist's TF server)."""
    return {**addresses(), **ps_fit(1, 5)}
