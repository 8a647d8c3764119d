"""TensorFlow runtime internals: strategies, sharded variables, errors, coordination, tf.data service."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from tfdist._compat._common import _attr, _missing


def stop_data_server(server: Any) -> None:
    """Stops an in-process tf.data service dispatcher or worker (TF has no public stop)."""
    _attr(server, "_stop", "LocalDataService.stop")()


def communication_options(strategy: Any) -> Any:
    """The ``CommunicationOptions`` a MultiWorkerMirroredStrategy merges into every all-reduce."""
    return _attr(
        _attr(strategy, "extended", "communication_options"), "_communication_options", "communication_options"
    )


def _sharded_variable_class() -> type:
    try:
        from tensorflow.python.distribute.sharded_variable import ShardedVariable
    except ImportError:
        raise _missing(
            "tensorflow.python.distribute.sharded_variable.ShardedVariable", "embedding_layout/local_weights"
        ) from None
    return ShardedVariable


def is_sharded_variable(value: Any) -> bool:
    """Whether ``value`` is a ParameterServerStrategy ``ShardedVariable`` (no public class exists)."""
    return isinstance(value, _sharded_variable_class())


def _accelerator_util() -> Any:
    try:
        from tensorflow.dtensor.python import accelerator_util
    except ImportError:
        raise _missing("tensorflow.dtensor.python.accelerator_util", "build_mesh") from None
    return accelerator_util


def dtensor_initialized() -> bool:
    """Whether DTensor's accelerator system is initialized in this process (TF has no public query)."""
    return bool(_attr(_accelerator_util(), "is_initialized", "build_mesh")())


def replica_dtensor_dataset(per_replica: Callable[[int], Any], **kwargs: Any) -> Any:
    """A ``DTensorDataset`` whose local devices each read a dataset of their own, ``per_replica(replica_id)``.

    ``DTensorDataset`` takes one dataset, gives each local replica a copy auto-sharded by element, and each
    device of a replica an iterator over a repeated, sharded copy of that: every record is read once per
    local device, each batch is repeated when a replica spans processes, and input whose iterations are
    numbered (tfdist's resumable order counts each new iteration as the next epochs) sees its copies as
    later epochs. Here every device iterates a dataset built for it, for its replica's share alone.
    ``kwargs`` are DTensorDataset's (``mesh``, ``layouts``, ``global_batch_size``, ``batch_dim``,
    ``prefetch``), with already batched input whose layouts split the batch dimension only.
    """
    base, iterator_class, pack = _dtensor_input()

    class _ReplicaDataset(base):  # type: ignore[misc, valid-type]
        def __iter__(self) -> Any:
            datasets = []  # One per local device, grouped by replica: the order of the mesh's local devices.
            for replica_id in self._local_replica_ids:
                for _ in range(self._num_local_devices_per_replica):
                    dataset = per_replica(replica_id)
                    if self._prefetch is not None:
                        dataset = dataset.prefetch(self._prefetch)
                    datasets.append((replica_id, dataset))
            resource = pack(datasets=datasets, layouts=self._layouts, mesh=self._mesh, num_local_devices_per_replica=1)
            return iterator_class(
                dtensor_components=(resource,), global_element_spec=self._global_element_spec, layouts=self._layouts
            )

    mesh, batch_dim = kwargs["mesh"], kwargs.get("batch_dim")
    first = sorted({loc[batch_dim] for loc in mesh.local_device_locations()})[0] if batch_dim else 0
    return _ReplicaDataset(per_replica(first), dataset_already_batched=True, **kwargs)


def _dtensor_input() -> tuple[type, type, Callable[..., Any]]:
    try:
        from tensorflow.dtensor.python import input_util
    except ImportError:
        raise _missing("tensorflow.dtensor.python.input_util", "mesh input") from None
    base = _attr(input_util, "DTensorDataset", "mesh input")
    return (
        base,
        _attr(input_util, "_DTensorIterator", "mesh input"),
        _attr(input_util, "_pack_iterator_resource_dtensor", "mesh input"),
    )


def is_tf_error(exc: BaseException, names: tuple[str, ...]) -> bool:
    """Whether ``exc`` is one of ``tf.errors.<name>`` (without importing TensorFlow if nothing has yet)."""
    tf = sys.modules.get("tensorflow")
    classes = tuple(c for c in (getattr(getattr(tf, "errors", None), n, None) for n in names) if isinstance(c, type))
    return bool(classes) and isinstance(exc, classes)


def wait_for_coordinated_peers(barrier_id: str, timeout_seconds: float) -> str | None:
    """Blocks until every task of this process's TF coordination service reached ``barrier_id``.

    Returns None once they all did, else why not (TensorFlow not loaded, no coordination service, a timeout,
    or the leader gone: it hosts the service and may exit as soon as the barrier passes, before its answer
    reaches the others). Never raises. The barrier itself is ``context.wait_at_barrier`` (no public API).
    """
    tf_context = sys.modules.get("tensorflow.python.eager.context")
    if tf_context is None:
        return "TensorFlow is not loaded"
    ctx = tf_context.context()
    if getattr(ctx, "coordination_service", None) is None:
        return "this process configured no coordination service"
    try:
        ctx.wait_at_barrier(barrier_id, int(timeout_seconds * 1000))
    except Exception as exc:  # TF's errors, or a stack without the method: the caller goes on either way
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    return None


def is_variable(value: Any) -> bool:
    """A ``tf.Variable`` (mirrored and PS variables included) or a ``ShardedVariable``."""
    import tensorflow as tf

    return isinstance(value, tf.Variable) or is_sharded_variable(value)


def _trackable_base() -> type:
    import tensorflow as tf

    return _attr(_attr(tf.__internal__, "tracking", "per-replica checkpoints"), "Trackable", "per-replica checkpoints")


def per_replica_checkpoint(variable: Any, strategy: Any, on_resize: Callable[[int, int], None]) -> Any:
    """A trackable that checkpoints every replica's own value of the ``ON_READ`` ``variable``.

    TF checkpoints an ``ON_READ`` variable as its aggregate (a ``SUM`` variable as the sum over the replicas)
    and restores that evenly: each replica's own value is lost. This trackable saves the values of all
    replicas instead (gathered over them at save time, a collective every replica's save joins, like the
    sum's) with their replica ids, and a restore gives each replica its own row. When the number of replicas
    changed, each gets the sum divided by the new number (nothing lost) and ``on_resize(saved, now)`` is
    called. Track the returned object instead of ``variable``. Hooks: ``Trackable._serialize_to_tensors`` and
    ``_restore_from_tensors`` (no public API saves per-replica values). A SavedModel export leaves the values
    out: its traced save function cannot reach the replicas' variables.
    """
    import tensorflow as tf

    def local_ids() -> list[int]:  # The global replica ids of this process's replicas, in device order.
        ids = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group)
        return [int(i) for i in strategy.experimental_local_results(ids)]

    gathers: dict[str, Any] = {}

    def gathered(name: str, value: Callable[[int], Any]) -> Any:
        """``value(replica_id)`` of every replica, gathered over all of them (a collective), in a function
        traced at the first save only: an eager ``gather`` traces one of its own at every call, ~0.1 s each."""
        if name not in gathers:
            gathers[name] = _traced_gather(strategy, value)
        return gathers[name]()

    def own(replica: int) -> Any:  # The value of the replica of this process whose global id is ``replica``.
        return tf.identity(dict(zip(local_ids(), strategy.experimental_local_results(variable)))[replica])

    class _PerReplica(_trackable_base()):  # type: ignore[misc]
        def _serialize_to_tensors(self) -> dict[str, Any]:
            # Callables, as TF's own ON_READ variables: a restore builds these specs too, and must not gather.
            def rows() -> Any:
                return gathered("rows", own)

            def ids() -> Any:
                return gathered("ids", lambda replica: tf.constant(replica, tf.int64))

            if _exporting_saved_model():  # Its traced save function cannot reach the replicas' variables.
                return {}
            device = strategy.experimental_local_results(variable)[0].device
            return {
                "per_replica": _save_spec(rows, variable.dtype, device),
                "replica_ids": _save_spec(ids, tf.int64, device),
            }

        def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
            if not restored_tensors:  # A SavedModel holds no per-replica state (see _serialize_to_tensors).
                return tf.no_op()
            rows, ids = restored_tensors["per_replica"], restored_tensors["replica_ids"]
            replicas = strategy.num_replicas_in_sync
            same_world = tf.equal(tf.shape(ids)[0], replicas)
            if tf.executing_eagerly() and not bool(same_world):
                on_resize(int(tf.shape(ids)[0]), replicas)
            share = tf.reduce_sum(rows, axis=0) / replicas
            assigns = []
            for component, replica in zip(strategy.experimental_local_results(variable), local_ids()):
                mine = tf.equal(ids, replica)
                own = tf.gather(rows, tf.argmax(tf.cast(mine, tf.int32)))
                found = tf.logical_and(same_world, tf.reduce_any(mine))
                assigns.append(component.assign(tf.where(found, own, share)))
            return tf.group(assigns)

    return _PerReplica()


def _traced_gather(strategy: Any, value: Callable[[int], Any]) -> Any:
    """A ``tf.function`` that gathers ``value(replica_id)`` of every replica over all of them (a collective)."""
    import tensorflow as tf

    def gather() -> Any:
        with _in_scope(strategy):
            rows = strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.expand_dims(value(ctx.replica_id_in_sync_group), 0)
            )
            return strategy.gather(rows, axis=0)

    return tf.function(gather, autograph=False)


def _exporting_saved_model() -> bool:
    """Whether ``tf.saved_model.save`` (or a tf-keras SavedModel save) is running in this thread."""
    try:
        from tensorflow.python.saved_model import save_context
    except ImportError:
        raise _missing("tensorflow.python.saved_model.save_context", "per-replica checkpoints") from None
    return bool(_attr(save_context, "in_save_context", "per-replica checkpoints")())


def _save_spec(tensor: Callable[[], Any], dtype: Any, device: str) -> Any:
    """A ``SaveSpec`` whose tensor is computed only when a checkpoint is written (no public class)."""
    try:
        from tensorflow.python.training.saving.saveable_object import SaveSpec
    except ImportError:
        raise _missing(
            "tensorflow.python.training.saving.saveable_object.SaveSpec", "per-replica checkpoints"
        ) from None
    return SaveSpec(tensor, "", "", dtype=dtype, device=device)


def _in_scope(strategy: Any) -> Any:
    """``strategy.scope()``, or nothing when its scope is already current."""
    import contextlib

    import tensorflow as tf

    if tf.distribute.has_strategy() and tf.distribute.get_strategy() is strategy:
        return contextlib.nullcontext()
    return strategy.scope()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClosureHooks:
    """What the coordinator calls around a closure that reads a watched dataset (:meth:`ClosureWatch.attach`).

    ``started(worker)`` runs in the coordinator's thread for ``worker`` before the closure runs there;
    ``failed(worker, token)`` runs when that closure goes back to the queue to run again (its worker failed,
    or a transient error), before it does, with what ``started`` returned for it, and returns the token a
    second put-back of the same run gets. ``begin`` (optional): a graph function of the worker's index (an
    int64 tensor) whose op every scheduled function given such a closure's input runs first, before its
    input is read; ``finished(worker, token, ok)`` (optional): the closure ran to its end (``ok``: without
    an error), with ``started``'s token.
    """

    started: Callable[[int], Any]
    failed: Callable[[int, Any], Any]
    begin: Callable[[Any], Any] | None = None
    finished: Callable[[int, Any, bool], Any] | None = None


_HOOKS = "_tfdist_closure_hooks"  # The attribute a watched dataset and its iterators carry their hooks in.


class ClosureWatch:
    """A ``ClusterCoordinator``'s closures, seen through its ``Worker._process_closure`` methods, its queue's
    ``put_back`` and its ``create_per_worker_dataset``, all wrapped (:func:`closure_watch`).

    A dataset function traced in ``create_per_worker_dataset`` attaches hooks (:meth:`attach`) to the
    dataset made there; its iterators carry them, and a closure given one runs with them. Other closures
    (another fit's, an evaluation's) run as TF runs them: the hooks end with the dataset's last closure,
    whether its fit ended or failed.
    """

    def __init__(self, coordinator: Any) -> None:
        import functools
        import threading
        import weakref

        self._local = threading.local()  # Each Worker runs its closures in a thread of its own.
        cluster = _attr(coordinator, "_cluster", "claimed steps given back")
        for worker in _attr(cluster, "workers", "claimed steps given back"):
            run = _attr(worker, "_process_closure", "claimed steps given back")
            worker._process_closure = functools.partial(self._process, run, worker.worker_index)
        queue = _attr(cluster, "closure_queue", "claimed steps given back")
        queue.put_back = functools.partial(self._put_back, _attr(queue, "put_back", "claimed steps given back"))
        queue.mark_finished = functools.partial(self._finished, _attr(queue, "mark_finished", "claimed steps"))
        create = _attr(coordinator, "create_per_worker_dataset", "claimed steps given back")
        coordinator.create_per_worker_dataset = functools.partial(self._create, create)
        coordinator.schedule = functools.partial(self._schedule, _attr(coordinator, "schedule", "claimed steps"))
        self._begun: Any = weakref.WeakKeyDictionary()  # Scheduled function -> {begin: its wrapped function}.

    def attach(self, hooks: ClosureHooks) -> bool:
        """While a dataset function is traced in ``create_per_worker_dataset``: the closures given an iterator
        of the dataset made there run with ``hooks`` (the last attached wins). False (nothing attached)
        outside ``create_per_worker_dataset``, or in another thread than the one that called it."""
        asked = getattr(self._local, "asked", None)
        if asked is None:
            return False
        asked.append(hooks)
        return True

    def _create(self, create: Callable[[Any], Any], dataset_fn: Any) -> Any:
        outer = getattr(self._local, "asked", None)
        asked: list[ClosureHooks] = []
        self._local.asked = asked
        try:
            dataset = create(dataset_fn)
        finally:
            self._local.asked = outer
        if asked:
            _carry_hooks(dataset, asked[-1])
        return dataset

    def _process(self, run: Callable[[Any], Any], index: int, closure: Any) -> Any:
        hooks = _hooks_of(closure)
        self._local.hooks, self._local.worker, self._local.ended = hooks, index, False
        self._local.token = hooks.started(index) if hooks is not None else None
        try:
            return run(closure)
        finally:
            self._local.hooks = None
            if hooks is not None and hooks.finished is not None and self._local.ended is not None:
                hooks.finished(index, self._local.token, self._local.ended)  # Not put back: ended, or failed.

    def _put_back(self, put_back: Callable[[Any], Any], closure: Any) -> Any:
        hooks = getattr(self._local, "hooks", None)
        if hooks is not None:  # A closure with hooks that ran on this worker's thread goes back to the queue.
            self._local.token = hooks.failed(self._local.worker, self._local.token)
            self._local.ended = None  # It runs again: not ended.
        return put_back(closure)

    def _finished(self, mark_finished: Callable[[], Any]) -> Any:
        if getattr(self._local, "hooks", None) is not None:  # This worker's closure with hooks ran to its end.
            self._local.ended = True
        return mark_finished()

    def _schedule(self, schedule: Callable[..., Any], fn: Any, args: Any = None, kwargs: Any = None) -> Any:
        """``schedule``, the function wrapped to run the hooks' ``begin`` first when its input has hooks."""
        hooks = _hooks_in((args, kwargs))
        if hooks is not None and hooks.begin is not None:
            fn = self._begin_first(fn, hooks.begin)
        return schedule(fn, args=args, kwargs=kwargs)

    def _begin_first(self, fn: Any, begin: Callable[[Any], Any]) -> Any:
        """A ``tf.function`` running ``begin(worker index)`` on the worker, then ``fn`` on its inputs, which
        wait for it (made once per function and ``begin``)."""
        import tensorflow as tf

        made = self._begun.setdefault(fn, {})
        if begin not in made:

            def run(*args: Any, **kwargs: Any) -> Any:
                marked = begin(tf.distribute.coordinator.experimental_get_current_worker_index())
                with tf.control_dependencies([marked]):  # Nothing of ``fn`` reads its input before it.
                    args, kwargs = tf.nest.map_structure(_after, (args, kwargs), expand_composites=True)
                    return fn(*args, **kwargs)

            made[begin] = tf.function(run, autograph=False)
        return made[begin]


def _after(value: Any) -> Any:
    """A tensor input anew under the control dependencies in force (other values as they are)."""
    import tensorflow as tf

    return tf.identity(value) if isinstance(value, tf.Tensor) else value


_CARRIERS: dict[type, type] = {}


def _carry_hooks(dataset: Any, hooks: ClosureHooks) -> None:
    """``dataset`` (a per-worker dataset) hands ``hooks`` to every iterator ``iter(dataset)`` makes: its class
    becomes a subclass whose ``__iter__`` does (an instance attribute cannot change what ``iter`` calls)."""
    base = type(dataset)
    carrier = _CARRIERS.get(base)
    if carrier is None:

        def __iter__(self: Any) -> Any:
            iterator = base.__iter__(self)
            setattr(iterator, _HOOKS, getattr(self, _HOOKS))
            return iterator

        carrier = _CARRIERS.setdefault(base, type(base.__name__, (base,), {"__iter__": __iter__}))
    setattr(dataset, _HOOKS, hooks)
    dataset.__class__ = carrier


def _hooks_of(closure: Any) -> ClosureHooks | None:
    """The hooks of the last watched iterator among ``closure``'s arguments (None: none)."""
    return _hooks_in((getattr(closure, "_args", ()), getattr(closure, "_kwargs", {})))


def _hooks_in(values: Any) -> ClosureHooks | None:
    """The hooks of the last watched iterator in ``values`` (None: none)."""
    import tensorflow as tf

    found = None
    for value in tf.nest.flatten(values):
        found = getattr(value, _HOOKS, found)
    return found


def worker_count(strategy: Any) -> int:
    """Worker tasks of ``strategy``'s cluster: ParameterServerStrategy keeps its resolver private and the
    count in ``extended._num_workers`` (its ``cluster_resolver`` property is None); 1 for a strategy without
    a cluster."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        return int(_attr(strategy.extended, "_num_workers", "claimed steps"))
    resolver = getattr(strategy, "cluster_resolver", None)
    jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
    return max(1, len(jobs.get("worker", ())))


def closure_watch(coordinator: Any) -> ClosureWatch:
    """The :class:`ClosureWatch` of ``coordinator`` (a ``ClusterCoordinator``), made the first time.

    Make it before the dataset whose closures it should see is created (for ``fit``: before ``fit``): a
    dataset function traced in a ``create_per_worker_dataset`` that started unwatched attaches nothing.

    TF 2.17-2.21 have no hook for closures: each ``Worker`` runs ``_process_closure`` in a thread of its own,
    one closure at a time, and every requeue of a closure goes through the queue's ``put_back``; a closure
    keeps its arguments in ``_args`` and ``_kwargs``.
    """
    cluster = _attr(coordinator, "_cluster", "claimed steps given back")
    watch = getattr(cluster, "_tfdist_watch", None)
    if watch is None:
        watch = ClosureWatch(coordinator)
        cluster._tfdist_watch = watch
    return watch


def watch_closures(strategy: Any) -> ClosureWatch:
    """The :class:`ClosureWatch` of the ``ClusterCoordinator`` of the parameter-server ``strategy`` (the
    coordinator made if none yet)."""
    import tensorflow as tf

    return closure_watch(tf.distribute.coordinator.ClusterCoordinator(strategy))


def check_closure_hooks() -> None:
    """Raises StackError unless ``Worker`` runs closures through ``_process_closure`` and requeues them
    through the queue's ``put_back`` (or ends them with its ``mark_finished``), ``ClusterCoordinator.schedule``
    makes its closures through ``Cluster.schedule``, a closure keeps its arguments in ``_args`` and ``_kwargs``, and a per-worker
    dataset of a function makes its iterators in ``__iter__`` (what :class:`ClosureWatch` relies on)."""
    import inspect

    import tensorflow as tf

    ps_module = tf.distribute.ParameterServerStrategy.__module__
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator as module
        from tensorflow.python.distribute.coordinator import values as values_module
    except ImportError:
        raise _missing("tensorflow.python.distribute.coordinator.cluster_coordinator", "claimed steps") from None
    worker = inspect.getsource(_attr(module, "Worker", "claimed steps given back"))
    cluster = inspect.getsource(_attr(module, "Cluster", "claimed steps given back"))
    coordinator = inspect.getsource(_attr(module, "ClusterCoordinator", "claimed steps given back"))
    closure = inspect.getsource(_attr(module, "Closure", "claimed steps given back"))
    queue = _attr(module, "_CoordinatedClosureQueue", "claimed steps given back")
    _attr(queue, "put_back", "claimed steps")
    _attr(queue, "mark_finished", "claimed steps")
    per_worker = _attr(values_module, "PerWorkerDatasetFromDatasetFunction", "claimed steps given back")
    needed = (
        "self._process_closure(closure)",
        "self._cluster.closure_queue.put_back(closure)",
        "self._cluster.closure_queue.mark_finished()",
    )
    extended = inspect.getsource(_attr(sys.modules[ps_module], "ParameterServerStrategyV2Extended", "claimed steps"))
    made = "self.workers = [" in cluster and "self._cluster = Cluster(strategy)" in coordinator
    made = made and "self._num_workers = len(" in extended and "__iter__" in vars(per_worker)
    made = made and "self._cluster.schedule(" in coordinator
    kept = "self._args = args" in closure and "self._kwargs = kwargs" in closure
    if not all(text in worker for text in needed) or not made or not kept:
        raise _missing(
            "Worker._process_closure, closure_queue.put_back, Closure._args and PerWorkerDataset.__iter__",
            "claimed steps given back",
        )
