"""Device meshes for model parallelism: their shape, and what each process of a mesh is told (pure Python).

A mesh is a grid of devices with named axes, ``batch=2,model=2``. tfdist lays it out over processes so that
the **model axis spans processes first**: with ``model=2`` on two processes, each process holds half of
every sharded weight and of its optimizer state. The exception is a process that would hold several model
slices and several batch replicas, which DTensor's input cannot feed: there the batch axis goes first
(:meth:`MeshShape.device_order`). Other axes keep the order given.

A multi-client DTensor program learns its cluster from ``DTENSOR_*`` variables, which only a launcher may
write; :func:`dtensor_variables` computes them from a :class:`~tfdist.cluster.ClusterSpec`, together with
the settings TensorFlow needs for correct results (see :data:`DTENSOR_SETTINGS`).

Example:
    >>> shape = MeshShape.parse("batch=2,model=2")
    >>> str(shape), shape.size, str(shape.device_order(processes=2))
    ('batch=2,model=2', 4, 'model=2,batch=2')
    >>> from tfdist.cluster import ClusterSpec
    >>> spec = ClusterSpec(jobs={"worker": ["h0:2222", "h1:2222"]}, task_type="worker", task_id=1)
    >>> env = dtensor_variables(spec, MeshShape.parse("model=2"))
    >>> env["DTENSOR_JOBS"], env["DTENSOR_CLIENT_ID"], env["DTENSOR_NUM_CLIENTS"]
    ('h0:2222,h1:2222', '1', '2')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import Error, StrategyError, invalid

__all__ = ["DTENSOR_SETTINGS", "MeshShape", "dtensor_variables"]

MESH_VAR = "TFDIST_MESH"  # The launcher's --mesh, for build_mesh() in the task.
MODEL_AXIS = "model"  # The axis laid out across processes first.
BATCH_AXIS = "batch"  # The axis the global batch is split along.
_MAX_DEVICES = 1 << 20
_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Settings a multi-client DTensor run needs for correct results, written into every client's environment.
# DTensor's combined all-reduces let some variable updates land one step late (a loss drift of 1.48 over 40
# steps on the probe of issue #25); with the optimization off, multi-client training matches one process.
DTENSOR_SETTINGS: Mapping[str, str] = {"DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION": "0"}

_EXAMPLE = "'model=2' or 'batch=2,model=2' (name=size, comma separated)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshShape:
    """The named axes of a device mesh and their sizes, in the order given.

    Attributes:
      axes: ``(name, size)`` pairs; names are identifiers, unique; sizes are integers >= 1.

    Example:
        >>> MeshShape(axes=(("batch", 2), ("model", 4))).sizes
        {'batch': 2, 'model': 4}
    """

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        axes = self.axes
        if isinstance(axes, Mapping):
            axes = tuple(axes.items())
        if not isinstance(axes, (tuple, list)) or not axes:
            raise invalid(StrategyError, "axes", self.axes, f"at least one mesh axis, e.g. {_EXAMPLE}")
        seen: set[str] = set()
        for item in axes:
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise invalid(StrategyError, "axes", self.axes, "(name, size) pairs, e.g. (('model', 2),)")
            name, size = item
            if not isinstance(name, str) or not _AXIS_NAME.match(name):
                raise invalid(StrategyError, "axes", name, "an axis name made of letters, digits and '_'")
            if name in seen:
                raise invalid(StrategyError, "axes", name, "each axis named once", "Merge the repeated axis.")
            if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= _MAX_DEVICES:
                raise invalid(StrategyError, f"axes[{name!r}]", size, f"an integer from 1 to {_MAX_DEVICES}")
            seen.add(name)
        object.__setattr__(self, "axes", tuple((str(n), int(s)) for n, s in axes))

    @classmethod
    def parse(cls, value: Any, *, field: str = "mesh", error: type[Error] = StrategyError) -> MeshShape:
        """A shape from ``'batch=2,model=2'``, a mapping ``{'batch': 2, 'model': 2}`` or a MeshShape.

        Errors are ``error`` (a ValueError subclass) naming ``field``.

        Example:
            >>> MeshShape.parse({"model": 2}).axes
            (('model', 2),)
            >>> MeshShape.parse("model=two")
            Traceback (most recent call last):
            ...
            tfdist.errors.StrategyError: Invalid value for `mesh`. Received: 'model=two'. Expected \
'model=2' or 'batch=2,model=2' (name=size, comma separated).
        """
        if isinstance(value, MeshShape):
            return value
        if isinstance(value, Mapping):
            pairs: Any = tuple(value.items())
        elif isinstance(value, str):
            pairs = []
            for part in value.split(","):
                name, sep, size = part.strip().partition("=")
                if not sep or not size.strip().isdigit():
                    raise invalid(error, field, value, _EXAMPLE)
                pairs.append((name.strip(), int(size.strip())))
            pairs = tuple(pairs)
        else:
            raise invalid(error, field, value, _EXAMPLE)
        try:
            return cls(axes=pairs)
        except StrategyError as exc:
            raise invalid(error, field, value, exc.expected or _EXAMPLE, exc.fix or "") from None

    @property
    def sizes(self) -> dict[str, int]:
        """Axis name -> size, in order."""
        return dict(self.axes)

    @property
    def size(self) -> int:
        """Devices in the mesh: the product of the axis sizes."""
        total = 1
        for _, size in self.axes:
            total *= size
        return total

    def process_major(self, model_axis: str = MODEL_AXIS) -> MeshShape:
        """The same axes with ``model_axis`` first, so that it spans processes before devices.

        Devices are numbered process by process; the first axis varies slowest, so it is the one that
        crosses processes. With the model axis first, each process holds its own slice of the weights.
        """
        first = [axis for axis in self.axes if axis[0] == model_axis]
        return MeshShape(axes=tuple(first + [axis for axis in self.axes if axis[0] != model_axis]))

    def device_order(self, processes: int, *, model_axis: str = MODEL_AXIS, batch_axis: str = BATCH_AXIS) -> MeshShape:
        """The axis order to lay the mesh out in over ``processes`` processes.

        The model axis goes first (across processes) when DTensor's input can still feed that layout:
        ``DTensorDataset`` needs each process's devices grouped by batch replica. When a process would hold
        several model slices *and* several batch replicas, the batch axis goes first instead: each process
        then holds whole replicas, split over its own devices.

        Example:
            >>> str(MeshShape.parse("batch=2,model=2").device_order(2))
            'model=2,batch=2'
            >>> str(MeshShape.parse("batch=2,model=2").device_order(1))
            'batch=2,model=2'
        """
        first = self.process_major(model_axis)
        if batch_axis not in self.sizes or self._grouped_by_replica(first, processes, batch_axis):
            return first
        batch = [axis for axis in self.axes if axis[0] == batch_axis]
        return MeshShape(axes=tuple(batch + [axis for axis in self.axes if axis[0] != batch_axis]))

    @staticmethod
    def _grouped_by_replica(order: MeshShape, processes: int, batch_axis: str) -> bool:
        """Whether the first process's devices, in order, visit each batch replica in one run."""
        per_process = order.size // max(processes, 1)
        names = [name for name, _ in order.axes]
        sizes = [size for _, size in order.axes]
        seen: list[int] = []
        for device in range(per_process):
            coordinate, rest = 0, device
            for name, size, stride in zip(names, sizes, _strides(sizes)):
                if name == batch_axis:
                    coordinate = rest // stride % size
            if not seen or seen[-1] != coordinate:
                if coordinate in seen:
                    return False
                seen.append(coordinate)
        return True

    def check_processes(
        self, processes: int, *, error: type[Error] = StrategyError, field: str = "mesh", fix: str = ""
    ) -> int:
        """Returns the devices per process; ``error`` naming ``field`` unless the mesh divides over ``processes``.

        Example:
            >>> MeshShape.parse("batch=2,model=2").check_processes(2)
            2
        """
        if self.size % processes:
            raise invalid(
                error,
                field,
                str(self),
                f"a device count that is a multiple of the {processes} processes (it has {self.size})",
                fix or f"Use a mesh such as 'model={processes}'.",
            )
        return self.size // processes

    def __str__(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self.axes)


def _strides(sizes: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return list(reversed(strides))


def mesh_clients(spec: ClusterSpec, shape: MeshShape, *, error: type[Error] = StrategyError) -> list[str]:
    """The addresses of the mesh's processes (DTensor clients): the chief first, then the workers.

    Raises ``error`` when the cluster cannot hold the mesh: parameter servers, or a mesh whose devices do
    not divide evenly over the processes.
    """
    if spec.num_ps:
        raise invalid(
            error,
            "mesh",
            str(shape),
            "a cluster without parameter servers",
            "A DTensor mesh trains on chief and workers only; drop the ps tasks, or train with "
            "ParameterServerStrategy without a mesh.",
        )
    clients = [task.address for task in spec.training_tasks()]
    if not clients:
        raise invalid(error, "mesh", str(shape), "a cluster with a chief or workers to hold the mesh")
    shape.check_processes(len(clients), error=error)
    return clients


def dtensor_variables(spec: ClusterSpec, shape: MeshShape) -> dict[str, str]:
    """The variables the current task of ``spec`` needs to be a client of a multi-client DTensor mesh.

    The clients reuse the training tasks' addresses (chief first, then workers) as DTensor's jobs. The
    mapping holds ``DTENSOR_*``, :data:`DTENSOR_SETTINGS` and ``TFDIST_MESH``; only launchers write it into
    a child's environment.
    """
    clients = mesh_clients(spec, shape)
    task = spec.task
    if task is None or task.type not in ("chief", "worker"):
        name = "none" if task is None else task.name
        raise invalid(StrategyError, "task", name, "a chief or worker task (the mesh's processes)")
    client_id = [t.name for t in spec.training_tasks()].index(task.name)
    env = {
        "DTENSOR_JOBS": ",".join(clients),
        "DTENSOR_NUM_CLIENTS": str(len(clients)),
        "DTENSOR_JOB_NAME": "worker",
        "DTENSOR_CLIENT_ID": str(client_id),
        MESH_VAR: str(shape),
    }
    env.update(DTENSOR_SETTINGS)
    return env
