"""Compressed all-reduce steps on real replicas (MirroredStrategy over logical CPUs), for NumPy checks."""

from __future__ import annotations

import os
from typing import Any

SHAPES = [(6, 5), (3, 3, 4, 6), (7,), (5, 2), (8, 16)]  # Matrices, a conv kernel, a vector, a thin matrix.
WARMUP = 2  # PowerSGD's plain steps in the warm-up run
RATE = 1.0  # Every matrix the factors shrink at all is compressed: (6, 5) at rank 2 (1.4x) too.


def inputs(replicas: int, steps: int, rank: int, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """Every step's gradient of every replica (float32), and the initial Q factors of the matrices."""
    import numpy as np

    from tfdist.comm.powersgd import matrix_shape

    rng = np.random.default_rng(seed)
    grads = [[[rng.normal(size=s).astype("float32") for s in SHAPES] for _ in range(replicas)] for _ in range(steps)]
    views = [matrix_shape(s, rank=rank, min_compression_rate=RATE) for s in SHAPES]
    qs = [None if v is None else rng.normal(size=(v[1], rank)).astype("float32") for v in views]
    return grads, qs


def compressed_steps(replicas: int, steps: int, rank: int, density: float) -> dict[str, Any]:
    """``steps`` of PowerSGD, of PowerSGD after ``WARMUP`` plain steps and of top-k on ``replicas`` replicas:
    sums, errors and Q factors (and the warm-up's step counts) per step."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    from tfdist.comm import Collectives, PowerSGD
    from tfdist.comm.powersgd import matrix_shape, powersgd_sum
    from tfdist.comm.topk import topk_sum

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    grads, q0 = inputs(replicas, steps, rank)
    compressed = [i for i, s in enumerate(SHAPES) if matrix_shape(s, rank=rank, min_compression_rate=RATE) is not None]

    def reduce(tensors: Any) -> Any:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(tensors))

    def gather(tensors: Any) -> Any:
        return tf.distribute.get_replica_context().all_gather(list(tensors), axis=0)

    @tf.function
    def power_step(step_grads: Any, errors: Any, qs: Any) -> Any:
        def replica(g: Any, e: Any, q: Any) -> Any:
            full_e, full_q = [None] * len(SHAPES), [None] * len(SHAPES)
            for k, i in enumerate(compressed):
                full_e[i], full_q[i] = e[k], q[k]
            out, new_e, new_q = powersgd_sum(g, full_e, full_q, rank=rank, all_reduce=reduce, min_compression_rate=RATE)
            return out, [new_e[i] for i in compressed], [new_q[i] for i in compressed]

        return strategy.run(replica, args=(step_grads, errors, qs))

    warm = PowerSGD(rank=rank, warmup_steps=WARMUP, min_compression_rate=RATE)
    collectives = Collectives(all_reduce=reduce, all_gather=gather)

    @tf.function
    def warm_step(step_grads: Any, errors: Any, qs: Any, counts: Any) -> Any:
        def replica(g: Any, e: Any, q: Any, c: Any) -> Any:
            states: list[dict[str, Any]] = [{} for _ in SHAPES]
            for k, i in enumerate(compressed):
                states[i] = {"error": e[k], "q": q[k], "steps": c[k]}
            out, new = warm.step(g, states, collectives)
            return out, *([new[i][kind] for i in compressed] for kind in ("error", "q", "steps"))

        return strategy.run(replica, args=(step_grads, errors, qs, counts))

    @tf.function
    def topk_step(step_grads: Any, errors: Any) -> Any:
        return strategy.run(lambda g, e: topk_sum(g, e, density=density, all_gather=gather), args=(step_grads, errors))

    def local(value: Any) -> list[Any]:
        return [[t.numpy().tolist() for t in tf.nest.flatten(r)] for r in strategy.experimental_local_results(value)]

    errors: Any = [tf.zeros(matrix_shape(SHAPES[i], rank=rank, min_compression_rate=RATE)) for i in compressed]
    qs: Any = [tf.constant(q0[i]) for i in compressed]
    top_errors: Any = [tf.zeros(s) for s in SHAPES]
    warm_state: Any = (errors, qs, [tf.zeros([1]) for _ in compressed])
    out: dict[str, Any] = {"powersgd": [], "topk": [], "warm": []}
    for step in range(steps):
        step_grads = strategy.experimental_distribute_values_from_function(
            lambda ctx, step=step: [tf.constant(g) for g in grads[step][ctx.replica_id_in_sync_group]]
        )
        summed, errors, qs = power_step(step_grads, errors, qs)
        out["powersgd"].append({"sums": local(summed), "errors": local(errors), "qs": local(qs)})
        warm_summed, *warm_state = warm_step(step_grads, *warm_state)
        out["warm"].append({"sums": local(warm_summed), "errors": local(warm_state[0]), "qs": local(warm_state[1])})
        out["warm"][-1]["steps"] = local(warm_state[2])
        top_summed, top_errors = topk_step(step_grads, top_errors)
        out["topk"].append({"sums": local(top_summed), "errors": local(top_errors)})
    return out


def per_replica_round_trip() -> dict[str, Any]:
    """Per-replica values (replica r holds ``r + 1``) of a SUM variable saved on 2 replicas, read back on
    2 replicas (before and after the variable exists), on 3 and on no strategy. A process of its own: TF
    numbers the collectives of every MirroredStrategy from the same key."""
    import tempfile

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)

    from tfdist import _compat

    resized: list[tuple[int, int]] = []

    def tracked(strategy: Any) -> tuple[Any, Any]:
        with strategy.scope():
            variable = tf.Variable(
                tf.zeros([2, 3]),
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
        return variable, _compat.per_replica_checkpoint(variable, strategy, lambda *sizes: resized.append(sizes))

    def values(strategy: Any, variable: Any) -> list[Any]:
        return [v.numpy().tolist() for v in strategy.experimental_local_results(variable)]

    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    saved, state = tracked(two)
    for r, component in enumerate(two.experimental_local_results(saved)):
        component.assign(tf.fill([2, 3], float(r + 1)))
    module = tf.Module()
    module.states = [state]
    path = tf.train.Checkpoint(m=module).write(os.path.join(tempfile.mkdtemp(), "ckpt"))
    out: dict[str, Any] = {
        "keys": sorted(name for name, _ in tf.train.list_variables(path) if name.startswith("m/")),
        "saved": tf.train.load_variable(path, "m/states/0/.ATTRIBUTES/per_replica").tolist(),
        "ids": tf.train.load_variable(path, "m/states/0/.ATTRIBUTES/replica_ids").tolist(),
    }
    for name, strategy in (
        ("two", two),
        ("three", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1", "/cpu:2"])),
        ("none", tf.distribute.get_strategy()),
    ):
        variable, state = tracked(strategy)
        module = tf.Module()
        module.states = []
        tf.train.Checkpoint(m=module).read(path)  # Deferred: restored when the state is tracked, as in fit.
        module.states.append(state)
        out[name] = values(strategy, variable)
    out["resized"] = resized
    return out
