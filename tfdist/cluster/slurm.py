"""Pure-Python reading of a Slurm step's layout from ``SLURM_*`` variables.

The layout matches TensorFlow's ``SlurmClusterResolver``: hosts sorted by
name, ``port_base + i`` for the i-th task on a host, job names sorted and
filled in rank order. Unlike TF's resolver it needs no GPUs, runs no
``nvidia-smi`` and never writes ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tfdist.errors import ClusterSpecError, invalid, require_int

_PART = re.compile(r"^([^,\[\]]*)(?:\[([^\]]+)\])?(.*)$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _expand_hostlist(field: str, hostlist: str) -> list[str]:
    """Expands ``'n[01-02],m5'`` to ``['n01', 'n02', 'm5']`` (order kept)."""
    hosts: list[str] = []
    for part in _split_top(hostlist.strip()):
        match = _PART.match(part)
        if not part or match is None or "[" in match.group(3) or "]" in match.group(3):
            raise invalid(
                ClusterSpecError,
                field,
                hostlist,
                "a Slurm hostlist such as 'node[01-04],gpu7'",
                "Run inside an allocation (sbatch/salloc) so Slurm sets it.",
            )
        prefix, ranges, suffix = match.groups()
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            high = high or low
            if not (f"{low}{high}".isascii() and low.isdigit() and high.isdigit()) or int(high) < int(low):
                raise invalid(ClusterSpecError, field, hostlist, "ranges like '[1-4,7]' with low <= high")
            hosts.extend(f"{prefix}{str(n).zfill(len(low))}{suffix}" for n in range(int(low), int(high) + 1))
    return hosts


def expand_tasks_per_node(field: str, text: str) -> list[int]:
    """Expands ``'2(x3),1'`` to ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = _TASKS.match(part)
        if match is None:
            raise invalid(ClusterSpecError, field, text, "a Slurm task count list such as '2(x3),1'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str]:
    for name in names:
        if env.get(name):
            return name, env[name]
    raise invalid(
        ClusterSpecError,
        names[0],
        None,
        "a value set by Slurm",
        f"Run inside 'srun' or an 'sbatch' script (looked for {', '.join(names)}).",
    )


def slurm_layout(
    env: Mapping[str, str], *, jobs: Mapping[str, int] | None, port_base: int
) -> tuple[dict[str, list[str]], str, int]:
    """Returns ``(cluster, task_type, task_id)`` for this Slurm task."""
    if not isinstance(env, Mapping):
        raise invalid(ClusterSpecError, "env", env, "a mapping of SLURM_* variables, e.g. os.environ")
    if jobs is not None and (not isinstance(jobs, Mapping) or not all(isinstance(job, str) for job in jobs)):
        raise invalid(ClusterSpecError, "jobs", jobs, "a mapping of job name to task count, e.g. {'worker': 2}")
    for job, count in (jobs or {}).items():
        require_int(ClusterSpecError, f"jobs[{job!r}]", count, minimum=0)
    require_int(ClusterSpecError, "port_base", port_base, minimum=1, maximum=65535)
    name, procid = _first(env, "SLURM_PROCID")
    if not (procid.isascii() and procid.isdigit()):
        raise invalid(ClusterSpecError, name, procid, "a non-negative integer")
    rank = int(procid)
    list_name, hostlist = _first(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    hosts = _expand_hostlist(list_name, hostlist)
    count_name, per_node = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    counts = expand_tasks_per_node(count_name, per_node)
    if len(counts) != len(hosts):
        raise invalid(
            ClusterSpecError,
            count_name,
            per_node,
            f"one count per host of {list_name}={hostlist!r} ({len(hosts)} hosts)",
        )
    addresses = [f"{host}:{port_base + i}" for host, n in sorted(zip(hosts, counts)) for i in range(n)]
    jobs = dict(jobs) if jobs is not None else {"worker": len(addresses)}
    if sum(jobs.values()) != len(addresses) or any(n < 1 for n in jobs.values()):
        raise invalid(
            ClusterSpecError,
            "jobs",
            jobs,
            f"task counts >= 1 that add up to the {len(addresses)} Slurm tasks of this step",
            "Match 'sbatch --ntasks' to the jobs you ask for.",
        )
    if rank >= len(addresses):
        raise invalid(ClusterSpecError, name, procid, f"a rank below the {len(addresses)} tasks of this step")
    cluster: dict[str, list[str]] = {}
    task_type, task_id, start = "", 0, 0
    for job in sorted(jobs):
        cluster[job] = addresses[start : start + jobs[job]]
        if start <= rank < start + jobs[job]:
            task_type, task_id = job, rank - start
        start += jobs[job]
    return cluster, task_type, task_id


# Per-job ports: job J starts its search at slot J mod SLOTS of PORT_SLOT ports in [PORT_LOW, PORT_HIGH),
# below Linux's ephemeral range (32768+), so two jobs on one node start on different ports.
PORT_LOW, PORT_HIGH, PORT_SLOT = 20000, 32768, 32


def job_port_base(job_id: int, tasks_per_node: int, is_free: Callable[[int], bool]) -> int:
    """The first port of this job's tasks on each node, from its Slurm job id.

    Job ``J`` takes slot ``J mod S`` of ``S`` slots of 32 ports (or of the next
    multiple of 32 above ``tasks_per_node``) in ``[20000, 32768)``. When one of
    the slot's ports is taken (``is_free`` says no), the next slot is tried.

    Example:
        >>> job_port_base(7, 3, lambda port: True)
        20224
        >>> job_port_base(7, 3, lambda port: port >= 20256)  # Slot 7 busy: slot 8.
        20256
    """
    width = PORT_SLOT * -(-max(tasks_per_node, 1) // PORT_SLOT)
    slots = (PORT_HIGH - PORT_LOW) // width
    if slots < 1:
        raise invalid(
            ClusterSpecError, "SLURM_TASKS_PER_NODE", tasks_per_node, f"at most {PORT_HIGH - PORT_LOW} tasks per node"
        )
    for step in range(slots):
        base = PORT_LOW + width * ((job_id + step) % slots)
        if all(is_free(base + i) for i in range(tasks_per_node)):
            return base
    raise invalid(
        ClusterSpecError,
        "ports",
        f"{PORT_LOW}-{PORT_HIGH - 1}",
        f"{tasks_per_node} free consecutive ports in one slot",
        "Pass a fixed --port-base.",
    )


def allocated_tasks(env: Mapping[str, str]) -> int:
    """The tasks of this job's allocation as Slurm granted them (``SLURM_TASKS_PER_NODE``, e.g. ``'3(x2)'`` -> 6).

    In a batch script this follows the allocation the job actually got: fewer nodes of a ``--nodes=MIN-MAX``
    range, or a requeued job given fewer tasks, give a smaller count. (``SLURM_NTASKS`` does not: it keeps the
    value computed at submission.)

    Example:
        >>> allocated_tasks({"SLURM_TASKS_PER_NODE": "3(x2),1"})
        7
    """
    name, text = _first(env, "SLURM_TASKS_PER_NODE")
    return sum(expand_tasks_per_node(name, text))


def step_tasks(env: Mapping[str, str]) -> int:
    """The tasks of this job step (``SLURM_STEP_TASKS_PER_NODE``, else the allocation's)."""
    name, text = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    return sum(expand_tasks_per_node(name, text))


def restart_count(env: Mapping[str, str]) -> int:
    """How often Slurm requeued this job (``SLURM_RESTART_COUNT``; unset before the first requeue: 0).

    Example:
        >>> restart_count({}), restart_count({"SLURM_RESTART_COUNT": "2"})
        (0, 2)
    """
    text = env.get("SLURM_RESTART_COUNT", "") or "0"
    if not (text.isascii() and text.isdigit()):
        raise invalid(ClusterSpecError, "SLURM_RESTART_COUNT", text, "a non-negative integer set by Slurm")
    return int(text)


def elastic_jobs(jobs: Mapping[str, int], tasks: int, *, min_workers: int) -> dict[str, int]:
    """``jobs`` plus ``worker`` = every task of the step that ``jobs`` does not name (at least ``min_workers``).

    Example:
        >>> elastic_jobs({"chief": 1}, 3, min_workers=2)
        {'chief': 1, 'worker': 2}
    """
    require_int(ClusterSpecError, "min_workers", min_workers, minimum=1)
    if "worker" in jobs:
        raise invalid(ClusterSpecError, "jobs", dict(jobs), "no 'worker' count (the step's other tasks are workers)")
    workers = tasks - sum(jobs.values())
    if workers < min_workers:
        raise invalid(
            ClusterSpecError,
            "SLURM_STEP_TASKS_PER_NODE",
            tasks,
            f"at least {sum(jobs.values()) + min_workers} tasks ({dict(jobs)} and >= {min_workers} workers)",
            "The allocation is smaller than --min-workers allows: request at least that many nodes "
            "(#SBATCH --nodes=MIN-MAX).",
        )
    return {**jobs, "worker": workers}
