"""``build_mesh``: this process's part of a DTensor device mesh, from the launcher's environment.

``tfdist-launch --workers 2 --mesh model=2 -- python train.py`` (or the Slurm and JobSet task entries with
``--mesh``) makes every chief and worker a DTensor client: it writes ``DTENSOR_*``, ``TFDIST_MESH`` and the
settings TensorFlow needs for correct results into the task's environment. In the script,
:func:`build_mesh` checks them, initializes DTensor on this process's devices and returns the mesh. Run
without a launcher, one process holds the whole mesh on logical CPUs (or its GPUs): the same script then
trains on one machine, which is also how tests compare a sharded run with a single process.

Example:
    >>> from tfdist.parallel import build_mesh
    >>> mesh = build_mesh({"batch": 2, "model": 2})  # doctest: +SKIP
    >>> mesh.dim_names, mesh.shape()  # doctest: +SKIP
    (['batch', 'model'], [2, 2])
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from tfdist import _compat
from tfdist.cluster.mesh_shape import DTENSOR_SETTINGS, MESH_VAR, MODEL_AXIS, MeshShape
from tfdist.cluster.spec import current_cluster
from tfdist.errors import RuntimeFailure, StrategyError, invalid

__all__ = ["build_mesh", "mesh_processes"]

_LOG = logging.getLogger("tfdist.parallel")
_DEVICE_TYPES = ("CPU", "GPU")
_LAUNCH_FIX = (
    "Launch with `tfdist-launch --workers N --mesh AXIS=SIZE,... -- python train.py` (or the Slurm/JobSet "
    "task entry with --mesh), which sets them for every task."
)


def mesh_processes() -> int:
    """How many processes (DTensor clients) share the mesh, from the launcher's ``DTENSOR_NUM_CLIENTS``; 1 alone."""
    text = os.environ.get("DTENSOR_NUM_CLIENTS", "1")
    return int(text) if text.isdigit() and int(text) >= 1 else 1


def build_mesh(
    axes: str | Mapping[str, int] | MeshShape | None = None,
    *,
    device_type: str | None = None,
    model_axis: str = MODEL_AXIS,
) -> Any:
    """Initializes DTensor for this process and returns the mesh (a ``tf.experimental.dtensor.Mesh``).

    Args:
      axes: The mesh, ``'batch=2,model=2'`` or ``{'batch': 2, 'model': 2}``. None: the launcher's
        ``--mesh`` (``TFDIST_MESH``). An explicit value wins over the launcher's, with a warning when they differ.
      device_type: 'CPU' (logical CPUs, as many per process as the mesh needs) or 'GPU' (one per device).
        None: 'GPU' when this process sees GPUs, else 'CPU'.
      model_axis: The axis laid out across processes first, so each process holds its slice of the weights.

    Returns:
      The mesh, its axes ordered with ``model_axis`` first where DTensor's input allows (see
      :meth:`tfdist.cluster.mesh_shape.MeshShape.device_order`).

    Raises:
      StrategyError: No mesh given, a mesh that does not divide over the processes, a process that is one
        task of a cluster but not a DTensor client, or a launch without the settings correct results need.
      RuntimeFailure: DTensor could not be initialized (for example a peer that never came up).

    Example:
        >>> build_mesh("model=2", device_type="TPU")
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyError: Invalid value for `device_type`. Received: 'TPU'. Expected 'CPU', 'GPU' or None \
(GPU when there is one).
    """
    if device_type is not None and device_type not in _DEVICE_TYPES:
        raise invalid(StrategyError, "device_type", device_type, "'CPU', 'GPU' or None (GPU when there is one)")
    shape = _requested_shape(axes)
    processes = _check_clients(shape)
    per_process = shape.size // processes
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    if device_type is None:
        device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"

    if _compat.dtensor_initialized():
        have = dtensor.num_local_devices(device_type)
        if have != per_process:
            raise invalid(
                StrategyError,
                "axes",
                str(shape),
                f"a mesh of {have * processes} devices: DTensor is already initialized with {have} per process",
                "Build every mesh of a process with the same number of devices.",
            )
    else:
        _initialize(dtensor, device_type, per_process)
    ordered = shape.device_order(processes, model_axis=model_axis)
    mesh = dtensor.create_distributed_mesh(list(ordered.axes), device_type=device_type)
    _LOG.info(
        "mesh %s over %d process(es), %d %s device(s) each; local devices %s",
        ordered,
        processes,
        per_process,
        device_type,
        list(mesh.local_device_ids()),
    )
    return mesh


def _requested_shape(axes: Any) -> MeshShape:
    launched = os.environ.get(MESH_VAR)
    if axes is None:
        if not launched:
            raise invalid(
                StrategyError,
                "axes",
                None,
                "a mesh such as 'model=2' or {'batch': 2, 'model': 2}",
                "Pass it to build_mesh(...), or launch with `tfdist-launch --mesh ...`.",
            )
        return MeshShape.parse(launched, field=MESH_VAR)
    shape = MeshShape.parse(axes, field="axes")
    if launched and launched != str(shape):
        _LOG.warning("build_mesh(%r) overrides the launcher's mesh %s=%s", str(shape), MESH_VAR, launched)
    return shape


def _check_clients(shape: MeshShape) -> int:
    """The number of DTensor clients; StrategyError when the environment cannot give correct results."""
    processes = mesh_processes()
    for name, value in DTENSOR_SETTINGS.items():
        if os.environ.get(name) != value:
            raise invalid(
                StrategyError,
                name,
                os.environ.get(name),
                f"{value!r}: without it some variable updates land one step late (losses drift from a "
                "one-device run), in one process as on many",
                _LAUNCH_FIX + f" Alone, start Python with {name}={value} in its environment.",
            )
    if "DTENSOR_JOBS" not in os.environ:
        cluster = current_cluster()
        tasks = len(cluster.training_tasks()) if cluster is not None else 1
        if tasks > 1:
            raise invalid(
                StrategyError,
                "DTENSOR_JOBS",
                None,
                f"the DTensor variables of one of the cluster's {tasks} training tasks (TF_CONFIG names them)",
                _LAUNCH_FIX,
            )
        return 1
    shape.check_processes(processes, field="axes")
    return processes


def _initialize(dtensor: Any, device_type: str, per_process: int) -> None:
    import tensorflow as tf

    try:
        if device_type == "CPU":
            dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=per_process)
        else:
            dtensor.initialize_accelerator_system("GPU")
    except (RuntimeError, ValueError, tf.errors.OpError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeFailure(
            f"DTensor could not start this process's part of the mesh ({device_type}, {per_process} device(s) "
            f"per process): {first}. Build the mesh before any other TensorFlow work, with every process "
            "of the launch running; check the other tasks' logs.",
            field="device_type",
            value=device_type,
        ) from None
