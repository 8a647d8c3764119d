"""The Ray engine: every task is an actor in one placement group, running the task's program as a subprocess.

Ray places the tasks (gang-scheduled in one placement group, packed on few nodes or spread across them); each
actor picks its task's port on its own node; the driver builds the cluster from the reported addresses. The
supervisor in :mod:`tfdist.launch.supervisor.runner` keeps every rule (restarts, fail-fast, fault injection, timeout,
environment): this module only places, starts, streams, signals and reports, like the local engine.

Without ``address`` a local Ray is started for the run and shut down afterwards; with ``'auto'`` or
``'host:port'`` the run joins that cluster and leaves it running.

Nodes that leave and join: when a task's actor dies with its node, :meth:`RayEngine.lost` says so (the
supervisor then counts an elastic worker as lost instead of restarting it where it cannot run), and a new
actor is asked for in the same placement-group bundle at once. Ray reschedules that bundle when the cluster has
room for it again (a node joins); the new actor then reports its address and :meth:`RayEngine.returned` hands
the task back, so the worker rejoins at the next epoch boundary.

Example:
    >>> from tfdist.launch import RayOptions
    >>> options = RayOptions(cpus_per_task=2, placement="spread")   # RayEngine(**same) runs with them
    >>> options.bundle(), options.strategy
    ({'CPU': 2.0}, 'SPREAD')
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist._names import describe_choices
from tfdist._options import option
from tfdist.cluster.spec import ClusterSpec
from tfdist.errors import EngineError, LaunchError, LaunchFailure, invalid, require_int, require_number
from tfdist.launch.config import LaunchConfig
from tfdist.launch.engines._host import TaskHost
from tfdist.launch.engines.base import (
    Engine,
    LineSink,
    TaskProcess,
    cluster_of,
    placed_service,
    refuse_network_isolation,
)
from tfdist.launch.engines.ray._task import CALL_TIMEOUT, RayTaskProcess
from tfdist.runtime.versions import install_hint

__all__ = ["RayEngine", "RayOptions"]

_log = logging.getLogger("tfdist.launch.ray")
INSTALL_HINT = f"{install_hint('ray')}: Ray 2.60 with the pins this stack needs"
# Read by Ray when it is imported: "0" keeps every Ray daemon and worker on the loopback address.
LOOPBACK_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict_pack": "STRICT_PACK", "strict_spread": "STRICT_SPREAD"}
DATA_SERVICE_TASK = "data-service:0"
# After an actor died: seconds for the GCS to mark its node dead. Ray's defaults take about 20 s for a hard-killed
# raylet (health checks: 5 s initial delay, then 5 failures 3 s apart); later, the actor died on a live node.
_NODE_DEATH_WAIT = 30.0
_NODES_LOOK = 0.5  # seconds between looks at Ray's node table while a death is undecided
_RETURN_LOOK = 1.0  # seconds between looks for re-placed actors


def import_ray() -> Any:
    """The ``ray`` module, or EngineError saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise EngineError(
            f"The Ray engine needs Ray, which is not installed ({err}). Install it with: {INSTALL_HINT}",
            field="engine",
            value="ray",
            fix=f"Install it: {INSTALL_HINT}",
        ) from None
    return ray


def _ray_installed() -> bool:
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def is_local_ray(address: str | None) -> bool:
    """Whether ``address`` names a Ray on this machine's loopback: None (a Ray started for the run) or a
    ``host:port`` on 127.0.0.1, localhost or ::1. Such a Ray can keep every daemon on loopback (``LOOPBACK_VAR``).

    Example:
        >>> is_local_ray(None), is_local_ray("127.0.0.1:6379"), is_local_ray("auto"), is_local_ray("head:6379")
        (True, True, False, False)
    """
    if address is None:
        return True
    host = address.split("://")[-1].rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


_MAX_PER_TASK = 4096  # CPUs or GPUs one task may reserve
_MAX_READY_TIMEOUT = 86400.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Where and how a run uses Ray.

    Args:
      address: None: start a local Ray for the run (shut down afterwards).
        'auto' or 'host:port': join that cluster and leave it running.
      cpus_per_task: CPUs each task reserves in the placement group.
      gpus_per_task: GPUs each task reserves (Ray sets the task's
        ``CUDA_VISIBLE_DEVICES``).
      placement: 'pack' (as few nodes as possible), 'spread' (across nodes),
        'strict_pack' (one node) or 'strict_spread' (one node per task).
      ready_timeout: Seconds to wait until the cluster holds every task.
      num_cpus: CPUs of the local Ray (default: enough for the job, at least
        this machine's count). Only without ``address``.
    """

    address: str | None = option(
        None,
        help="join this Ray cluster ('auto' or host:port) and leave it running; default: start a local Ray for "
        "the run and stop it afterwards",
        metavar="ADDR",
    )
    cpus_per_task: float = option(1.0, help="CPUs each task reserves", flag="--cpus-per-task")
    gpus_per_task: float = option(0.0, help="GPUs each task reserves", flag="--gpus")
    placement: str = option(
        "pack", help="pack: as few nodes as possible; spread: across nodes", choices=tuple(PLACEMENTS)
    )
    ready_timeout: float = option(
        120.0, help="seconds to wait until the Ray cluster holds every task", metavar="SECONDS"
    )
    num_cpus: int | None = option(
        None,
        help="CPUs of the local Ray started for the run (default: enough for the job, at least this machine's "
        "count); not with `address`",
        metavar="N",
    )

    def __post_init__(self) -> None:
        for name in ("cpus_per_task", "gpus_per_task"):  # finite: nan and inf would reach Ray's scheduler
            value = require_number(LaunchError, name, getattr(self, name), minimum=0)
            if value > _MAX_PER_TASK:
                raise invalid(LaunchError, name, value, f"a number <= {_MAX_PER_TASK}")
            object.__setattr__(self, name, float(value))
        if self.cpus_per_task == 0 and self.gpus_per_task == 0:
            raise invalid(
                LaunchError,
                "cpus_per_task",
                0,
                "> 0 when `gpus_per_task` is 0",
                "Every task must reserve something, or Ray may put them all anywhere.",
            )
        if self.placement not in PLACEMENTS:
            raise invalid(LaunchError, "placement", self.placement, describe_choices(self.placement, PLACEMENTS))
        require_number(LaunchError, "ready_timeout", self.ready_timeout, above=0)
        if self.ready_timeout > _MAX_READY_TIMEOUT:
            raise invalid(LaunchError, "ready_timeout", self.ready_timeout, f"seconds <= {_MAX_READY_TIMEOUT}")
        if self.num_cpus is not None:
            require_int(LaunchError, "num_cpus", self.num_cpus, minimum=1, maximum=_MAX_PER_TASK * 10000)
        if self.address is not None and (not isinstance(self.address, str) or not self.address.strip()):
            raise invalid(LaunchError, "address", self.address, "'auto' or 'host:port'")
        if self.num_cpus is not None and self.address is not None:
            raise invalid(
                LaunchError,
                "num_cpus",
                self.num_cpus,
                "None when joining a cluster (`address`)",
                "A running cluster has its own CPUs; drop num_cpus.",
            )

    @property
    def strategy(self) -> str:
        """Ray's name of the placement strategy."""
        return PLACEMENTS[self.placement]

    def bundle(self) -> dict[str, float]:
        """The resources one task reserves."""
        bundle = {"CPU": self.cpus_per_task} if self.cpus_per_task else {}
        return {**bundle, "GPU": self.gpus_per_task} if self.gpus_per_task else bundle


class RayEngine(Engine):
    """Runs every task as a subprocess of an actor in one Ray placement group.

    Args:
      **options: The fields of :class:`RayOptions`.
    """

    name = "ray"

    def __init__(self, **options: Any) -> None:
        self.options = RayOptions(**options)
        if not _ray_installed():
            import_ray()  # Raises EngineError with the install command, before anything starts.
        self._ray: Any = None
        self._owns_connection = False
        self._pg: Any = None
        self._actors: dict[str, Any] = {}
        self._nodes: dict[str, str] = {}
        self._driver_node = ""
        self._spare_address: str | None = None
        self._bundles: dict[str, int] = {}
        self._procs: dict[str, RayTaskProcess] = {}
        self._gone: dict[str, tuple[Any, Any]] = {}  # lost task -> (its new actor, that actor's address ref)
        self._next_look = 0.0
        self._died: dict[str, tuple[Any, float]] = {}  # task -> (its attempt whose actor died, when it was seen)
        self._alive_nodes: tuple[float, frozenset[str]] = (-_NODES_LOOK, frozenset())

    # -- placing -------------------------------------------------------------------------------------------

    def place(self, config: LaunchConfig) -> ClusterSpec:
        refuse_network_isolation(config, "Ray")
        tasks = config.task_names() + ([DATA_SERVICE_TASK] if config.data_service_workers else [])
        try:
            self._connect(len(tasks))
            self._reserve(tasks)
            addresses = self._addresses(tasks)
        except BaseException:
            self.close()
            raise
        self._spare_address = addresses.pop(DATA_SERVICE_TASK, None)
        spec = cluster_of(config, addresses)
        _log.info(
            "Ray placed %d tasks (%s): %s",
            len(tasks),
            self.options.strategy,
            ", ".join(f"{t}@{a}" for t, a in addresses.items()),
        )
        return spec

    def reserve_address(self) -> str:
        return placed_service(self._spare_address, "RayEngine")

    def _connect(self, tasks: int) -> None:
        ray = self._ray = import_ray()
        if ray.is_initialized():
            _log.info("Using the Ray this process already started or joined.")
            self._driver_node = ray.get_runtime_context().get_node_id()
            return
        options = self.options
        if options.address is None:
            if os.environ.get(LOOPBACK_VAR) != "0":
                _log.warning(
                    "%s=0 is not set in this process, so the local Ray binds to the machine's routable "
                    "address; tfdist-launch sets it for you.",
                    LOOPBACK_VAR,
                )
            needed = int(-(-tasks * options.cpus_per_task // 1))
            num_cpus = options.num_cpus or max(needed, os.cpu_count() or 1)
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            try:
                ray.init(address=options.address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, ValueError, RuntimeError) as err:
                raise EngineError(
                    f"Could not join the Ray cluster at {options.address!r}: {err}. Check the address "
                    "(`ray status` on the head shows it), or drop `address` to start a local Ray. "
                    "If the cluster uses token authentication, set RAY_AUTH_MODE=token (Ray enables "
                    "it by itself only for the address 'auto').",
                    field="address",
                    value=options.address,
                ) from None
        self._owns_connection = True
        self._driver_node = ray.get_runtime_context().get_node_id()

    def _reserve(self, tasks: list[str]) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        ray, options = self._ray, self.options
        bundle = options.bundle()
        self._pg = placement_group([dict(bundle) for _ in tasks], strategy=options.strategy, name="")
        # The actors are asked for at once, without first waiting on the driver for the group: Ray schedules
        # each as soon as its bundle is placed. This saves a round trip, not the actors' worker start-up.
        for index, task in enumerate(tasks):
            self._bundles[task] = index
            self._actors[task] = self._new_actor(task)
        ready, _ = ray.wait([self._pg.ready()], timeout=options.ready_timeout)
        if not ready:  # place() closes the engine: the pending actors are killed there
            pg, self._pg = self._pg, None
            remove_placement_group(pg)
            total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
            raise EngineError(
                f"The Ray cluster could not hold the job within {options.ready_timeout:g}s: it needs {len(tasks)} "
                f"bundles of {bundle} placed {options.strategy}, the cluster has {total} ({free} free, "
                f"{len(ray.nodes())} node(s)). Lower --cpus-per-task/--gpus-per-task, use fewer tasks, add nodes, "
                "or use --ray-placement pack.",
                field="placement group",
                value=[bundle] * len(tasks),
            )

    def _new_actor(self, task: str) -> Any:
        """An actor for ``task`` in its bundle of the placement group (pending until the bundle is placed)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = self.options
        return (
            self._ray.remote(TaskHost)
            .options(
                num_cpus=options.cpus_per_task,
                num_gpus=options.gpus_per_task,
                max_concurrency=8,
                max_restarts=0,
                name=None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, self._bundles[task]),
            )
            .remote(task)
        )

    def _addresses(self, tasks: list[str]) -> dict[str, str]:
        """Each actor's 'host:port' on its own node; picked again where two tasks on one node drew one port."""
        addresses: dict[str, str] = {}
        pending = list(tasks)
        for _ in range(5):
            replies = self._get(
                [self._actors[t].address.remote() for t in pending], self.options.ready_timeout, "report its address"
            )
            for task, (address, node) in zip(pending, replies):
                addresses[task], self._nodes[task] = address, node
            seen: set[str] = set()
            pending = []
            for task in tasks:
                if addresses[task] in seen:
                    pending.append(task)
                seen.add(addresses[task])
            if not pending:
                return addresses
        raise LaunchFailure(f"Ray tasks kept drawing the same ports: {addresses}.")

    def _get(self, refs: Any, timeout: float, what: str) -> Any:
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise EngineError(f"Ray actors did not {what} within {timeout:g}s; is the cluster overloaded?") from None
        except ray.exceptions.RayError as err:
            raise LaunchFailure(f"A Ray actor failed to {what}: {err}") from None

    # -- running -------------------------------------------------------------------------------------------

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], on_line: LineSink) -> TaskProcess:
        if task not in self._actors:
            raise invalid(LaunchError, "task", task, describe_choices(task, self._actors))
        if task in self._gone:
            raise LaunchFailure(
                f"{task} cannot start: its Ray node left the cluster, and Ray has not placed it "
                "again yet (no node with room for it). With --min-workers, an elastic run goes on "
                "without it and takes it back when a node joins."
            )
        actor = self._actors[task]
        pid = self._get(actor.start.remote(list(argv), dict(env)), CALL_TIMEOUT, f"start {task}")
        local = self._nodes.get(task) == self._driver_node
        proc = self._procs[task] = RayTaskProcess(self._ray, task, actor, on_line, pid, local)
        return proc

    # -- nodes that leave and join -------------------------------------------------------------------------

    def lost(self, task: str) -> bool:
        """True when ``task``'s actor died because its node left; a new actor is then asked for at once."""
        return self._verdict(task) is True

    def deciding(self, task: str) -> bool:
        """True while ``task``'s actor died on a node Ray still counts alive, for up to 30 s (never blocks)."""
        return self._verdict(task) is None

    def _verdict(self, task: str) -> bool | None:
        """Whether the last attempt of ``task`` ended by a node loss; None while Ray cannot tell yet."""
        if task in self._gone:
            return True
        proc = self._procs.get(task)
        if self._ray is None or proc is None or not proc.host_lost:
            return False
        seen, since = self._died.get(task, (None, 0.0))
        if seen is not proc:
            since = time.monotonic()
            self._died[task] = (proc, since)
        if self._nodes.get(task, "") in self._alive():
            # Not yet marked dead; after the wait, the actor died on a live node (killed, out of memory).
            return None if time.monotonic() - since < _NODE_DEATH_WAIT else False
        actor = self._new_actor(task)
        self._gone[task] = (actor, actor.address.remote())
        _log.info("The Ray node of %s (%s) left; asked Ray to place it again.", task, self._nodes.get(task))
        return True

    def _alive(self) -> frozenset[str]:
        """The ids of the nodes Ray counts alive, looked up at most every 0.5 s."""
        looked, alive = self._alive_nodes
        if time.monotonic() - looked >= _NODES_LOOK:
            alive = frozenset(n.get("NodeID", "") for n in self._ray.nodes() if n.get("Alive"))
            self._alive_nodes = (time.monotonic(), alive)
        return alive

    def returned(self) -> dict[str, str]:
        """Lost tasks whose new actor is up (Ray placed their bundle again), with their new addresses."""
        now = time.monotonic()
        if not self._gone or self._ray is None or now < self._next_look:
            return {}
        self._next_look = now + _RETURN_LOOK
        ray, back = self._ray, {}
        for task, (actor, ref) in list(self._gone.items()):
            if not ray.wait([ref], timeout=0)[0]:
                continue
            try:
                address, node = ray.get(ref, timeout=CALL_TIMEOUT)
            except ray.exceptions.RayError as err:  # Died again before it started: ask once more.
                _log.info("The new actor of %s failed (%s); asking again.", task, err)
                actor = self._new_actor(task)
                self._gone[task] = (actor, actor.address.remote())
                continue
            del self._gone[task]
            self._actors[task], self._nodes[task] = actor, node
            _log.info("Ray placed %s again: %s on node %s.", task, address, node)
            back[task] = address
        return back

    def close(self) -> None:
        ray, self._ray = self._ray, None
        if ray is None:
            return
        actors = list(self._actors.values()) + [actor for actor, _ in self._gone.values()]
        self._actors, self._gone, self._procs = {}, {}, {}
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)  # Its subprocess gets SIGKILL with it (parent-death signal).
            except Exception as err:
                _log.debug("ray.kill: %s", err)
        pg, self._pg = self._pg, None
        if pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(pg)
            except Exception as err:
                _log.debug("remove_placement_group: %s", err)
        if self._owns_connection:
            self._owns_connection = False
            # A local Ray started here stops with it; a joined cluster only loses this driver.
            ray.shutdown()
