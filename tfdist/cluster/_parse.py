"""Parsing and validation of the raw TF_CONFIG forms real cluster managers write.

Everything here is pure Python and raises only :class:`ClusterSpecError`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from tfdist._names import describe_choices
from tfdist.cluster.address import check_address, is_loopback, same_endpoint_key, split_address
from tfdist.errors import ClusterSpecError, invalid

_log = logging.getLogger("tfdist.cluster.spec")

JOB_NAMES = ("chief", "worker", "ps", "evaluator")
_LEGACY_CHIEF = "master"
# Keys TF ignores but managers add (AI Platform/Vertex: job, trial; TFJob: none).
_KNOWN_TOP_KEYS = frozenset({"cluster", "task", "rpc_layer", "environment", "job", "session_master"})


def load_json(text: str) -> Any:
    """Parses TF_CONFIG text, turning JSON errors into ClusterSpecError."""
    if not text.strip():
        raise invalid(
            ClusterSpecError,
            "TF_CONFIG",
            text,
            "a JSON object with a 'cluster' key",
            "Set TF_CONFIG to the JSON your cluster manager writes, or unset it to run locally.",
        )
    try:
        return json.loads(text)
    except RecursionError:
        raise invalid(
            ClusterSpecError,
            "TF_CONFIG",
            text,
            "JSON nested a few levels deep",
            "TF_CONFIG is an object of jobs, each a list of 'host:port' strings.",
        ) from None
    except json.JSONDecodeError as err:
        hint = "Quote the whole value in the shell: TF_CONFIG='{\"cluster\": ...}'"
        if "'" in text:
            hint = "JSON needs double quotes around keys and strings, not single quotes."
        raise invalid(
            ClusterSpecError,
            "TF_CONFIG",
            text,
            f"valid JSON (error at line {err.lineno} column {err.colno}: {err.msg})",
            hint,
        ) from None


def normalize_job_name(field: str, name: object) -> str:
    """Maps a job name to its canonical form; ``master`` becomes ``chief``."""
    if not isinstance(name, str):
        raise invalid(ClusterSpecError, field, name, f"a job name, {describe_choices('', JOB_NAMES)}")
    if name == _LEGACY_CHIEF:
        _log.warning("TF_CONFIG uses the legacy job name 'master'; tfdist treats it as 'chief'.")
        return "chief"
    if name not in JOB_NAMES:
        raise invalid(
            ClusterSpecError,
            field,
            name,
            describe_choices(name, JOB_NAMES),
            "Rename the job; TensorFlow's strategies know only these job names.",
        )
    return name


def parse_index(field: str, value: object) -> int:
    """Accepts an int >= 0 or its plain decimal text (some managers write "0"): no spaces, signs or leading zeros."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise invalid(ClusterSpecError, field, value, "an integer >= 0")
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= 9) or (value.startswith("0") and value != "0"):
            raise invalid(
                ClusterSpecError,
                field,
                value,
                "an integer >= 0 written as plain digits, e.g. 1",
                "Remove spaces and leading zeros.",
            )
        value = int(value)
    if value < 0:
        raise invalid(ClusterSpecError, field, value, "an integer >= 0")
    return value


def _parse_job(job: str, tasks: object) -> dict[int, str]:
    field = f"cluster.{job}"
    if isinstance(tasks, str):
        raise invalid(
            ClusterSpecError,
            field,
            tasks,
            "a list of 'host:port' strings",
            f'Wrap the address in a list: "{job}": [{json.dumps(tasks)}].',
        )
    if isinstance(tasks, Mapping):  # Sparse form: {"1": "host:port"} (TFJob dynamic workers).
        parsed = {}
        for key, addr in tasks.items():
            index = parse_index(f"{field} key {key!r}", key)
            if index in parsed:
                raise invalid(
                    ClusterSpecError,
                    f"{field} key {key!r}",
                    key,
                    "each task index once",
                    f"Index {index} is given twice; remove one of the two tasks.",
                )
            parsed[index] = check_address(f"{field}[{key}]", addr)
    elif isinstance(tasks, (list, tuple)):
        parsed = {i: check_address(f"{field}[{i}]", addr) for i, addr in enumerate(tasks)}
    else:
        raise invalid(
            ClusterSpecError, field, tasks, "a list of 'host:port' strings or a mapping of task index to address"
        )
    if not parsed:
        raise invalid(
            ClusterSpecError,
            field,
            tasks,
            "at least one task address",
            f"Remove the empty '{job}' job or give it an address.",
        )
    return dict(sorted(parsed.items()))


def parse_cluster(cluster: object) -> dict[str, dict[int, str]]:
    """Validates the ``cluster`` part; returns job -> {index: address}."""
    if not isinstance(cluster, Mapping):
        raise invalid(
            ClusterSpecError,
            "cluster",
            cluster,
            "a mapping of job name to task addresses",
            'For example {"worker": ["host0:2222", "host1:2222"]}.',
        )
    if not cluster:
        raise invalid(
            ClusterSpecError,
            "cluster",
            cluster,
            "at least one job",
            "Add a 'worker' (or 'chief') job with the task addresses.",
        )
    jobs: dict[str, dict[int, str]] = {}
    for raw_name, tasks in cluster.items():
        name = normalize_job_name("cluster job name", raw_name)
        if name in jobs:
            raise invalid(
                ClusterSpecError,
                "cluster",
                sorted(cluster),
                "only one of 'chief' and 'master'",
                "Remove the legacy 'master' job; 'chief' replaces it.",
            )
        jobs[name] = _parse_job(str(raw_name), tasks)
    check_jobs(jobs)
    return {name: jobs[name] for name in JOB_NAMES if name in jobs}


def check_jobs(jobs: Mapping[str, Mapping[int, str]]) -> None:
    """Cross-job rules: one chief, one evaluator, ps needs workers, no shared addresses."""
    for job in ("chief", "evaluator"):
        if len(jobs.get(job, ())) > 1:
            raise invalid(
                ClusterSpecError,
                f"cluster.{job}",
                list(jobs[job].values()),
                f"at most one {job} task",
                f"Keep one {job}; make the others 'worker' tasks."
                if job == "chief"
                else "Run one evaluator; it follows the chief's checkpoints.",
            )
    if not jobs.get("chief") and not jobs.get("worker"):
        raise invalid(
            ClusterSpecError,
            "cluster",
            {k: list(v.values()) for k, v in jobs.items()},
            "a 'chief' or 'worker' job",
            "Add the training tasks; ps and evaluator tasks do not train.",
        )
    if jobs.get("ps") and not jobs.get("worker"):
        raise invalid(
            ClusterSpecError,
            "cluster.worker",
            None,
            "worker tasks when 'ps' tasks are present",
            "ParameterServerStrategy needs at least one worker; add a 'worker' job or drop 'ps'.",
        )
    seen: dict[str, str] = {}
    loopback_ports: dict[int, tuple[str, str]] = {}
    for job, tasks in jobs.items():
        for index, address in tasks.items():
            where = f"{job}[{index}]"
            key = same_endpoint_key(address)
            if key in seen:
                raise invalid(
                    ClusterSpecError,
                    f"cluster.{where}",
                    address,
                    "an address used by one task only",
                    f"It is also {seen[key]} (host names ignore case); give each task its own port.",
                )
            seen[key] = where
            host, port = split_address(address)
            if is_loopback(host):
                if port in loopback_ports:
                    other, other_address = loopback_ports[port]
                    _log.warning(
                        "cluster.%s (%s) and cluster.%s (%s) both name this machine's port %d; the second "
                        "task will fail to start. Give each task its own port.",
                        where,
                        address,
                        other,
                        other_address,
                        port,
                    )
                loopback_ports.setdefault(port, (where, address))


def parse_task(task: object, jobs: Mapping[str, Mapping[int, str]]) -> tuple[str | None, int]:
    """Validates the ``task`` part against the cluster; returns (type, index)."""
    if task is None:
        return None, 0
    if not isinstance(task, Mapping):
        raise invalid(ClusterSpecError, "task", task, 'a mapping such as {"type": "worker", "index": 0}')
    if not task:
        return None, 0
    if "type" not in task:
        raise invalid(
            ClusterSpecError,
            "task.type",
            None,
            describe_choices("", JOB_NAMES),
            'Add "type" to "task", e.g. {"type": "worker", "index": 0}.',
        )
    task_type = normalize_job_name("task.type", task["type"])
    task_id = parse_index("task.index", task.get("index", 0))
    check_task(task_type, task_id, jobs)
    return task_type, task_id


def check_task(task_type: str, task_id: int, jobs: Mapping[str, Mapping[int, str]]) -> None:
    """Checks that the task exists in ``jobs`` (an evaluator need not)."""
    if task_type not in jobs:
        if task_type == "evaluator":  # TFJob and Vertex AI leave the evaluator out of "cluster".
            if task_id != 0:
                raise invalid(
                    ClusterSpecError,
                    "task.index",
                    task_id,
                    "0 for the evaluator (there is only one)",
                    "Run one evaluator with index 0; it follows the chief's checkpoints.",
                )
            return
        raise invalid(
            ClusterSpecError,
            "task.type",
            task_type,
            f"a job of the cluster, {describe_choices(task_type, jobs)}",
            "Every task but the evaluator must be listed in 'cluster'.",
        )
    if task_id not in jobs[task_type]:
        indices = sorted(jobs[task_type])
        raise invalid(
            ClusterSpecError,
            "task.index",
            task_id,
            f"one of the indices of job '{task_type}': {indices}",
            f"The '{task_type}' job lists {len(indices)} task(s); indices start at 0.",
        )


def parse_tf_config(config: object) -> dict[str, Any]:
    """Validates a whole TF_CONFIG object; returns the ClusterSpec fields."""
    if isinstance(config, str):
        config = load_json(config)
    if not isinstance(config, Mapping):
        raise invalid(ClusterSpecError, "TF_CONFIG", config, 'a JSON object like {"cluster": {...}, "task": {...}}')
    if "cluster" not in config:
        raise invalid(
            ClusterSpecError,
            "cluster",
            None,
            "a 'cluster' key in TF_CONFIG",
            'Add "cluster": {"worker": ["host:port", ...]}.',
        )
    unknown = sorted(str(key) for key in config if key not in _KNOWN_TOP_KEYS)
    if unknown:
        _log.debug("Ignoring TF_CONFIG keys TensorFlow does not read: %s", unknown)
    jobs = parse_cluster(config["cluster"])
    task_type, task_id = parse_task(config.get("task"), jobs)
    fields: dict[str, Any] = {"jobs": jobs, "task_type": task_type, "task_id": task_id}
    for key in ("rpc_layer", "environment"):
        value = config.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise invalid(ClusterSpecError, key, value, "a non-empty string or absent")
        fields[key] = value
    return fields
