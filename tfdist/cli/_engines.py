"""The engines that ``tfdist-launch`` builds from flags of their own (``--ray-*``, ``--spark-*``).

Each builder takes the parser (for usage errors) and the parsed flags; an engine without one is made by
:func:`tfdist.launch.engines.registry.engine_for` from its name alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tfdist.launch.engines.base import Engine


def _ray_env(args: argparse.Namespace) -> dict[str, str]:
    from tfdist.launch.engines.ray.engine import LOOPBACK_VAR, is_local_ray

    # Read by Ray at import: a local Ray then binds every daemon to loopback.
    return {LOOPBACK_VAR: "0"} if is_local_ray(args.ray_address) else {}


def _ray_engine(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Engine:
    del parser
    from tfdist.launch.engines.ray.engine import RayEngine

    cpus = 1 if args.cpus_per_task is None else args.cpus_per_task
    return RayEngine(
        address=args.ray_address,
        cpus_per_task=cpus,
        gpus_per_task=args.gpus,
        placement=args.ray_placement,
        ready_timeout=args.ray_ready_timeout,
        num_cpus=args.ray_num_cpus,
    )


def _spark_engine(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Engine:
    from tfdist.launch.engines.spark.engine import SparkEngine

    conf: dict[str, str] = {}
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            parser.error(f"--spark-conf {item!r}: expected KEY=VALUE with a Spark key, e.g. spark.task.cpus=2")
        conf[key.strip()] = value.strip()
    if args.cpus_per_task is not None:
        conf["spark.task.cpus"] = str(args.cpus_per_task)
    return SparkEngine(
        master=args.spark_master, conf=conf, python=args.spark_python, ready_timeout=args.spark_ready_timeout
    )


# What the launcher's own environment needs before an engine's package is imported (set by tfdist-launch only
# where unset: the user's environment wins).
LAUNCHER_ENV: dict[str, Callable[[argparse.Namespace], dict[str, str]]] = {"ray": _ray_env}

ENGINE_BUILDERS: dict[str, Callable[[argparse.ArgumentParser, argparse.Namespace], Engine]] = {
    "ray": _ray_engine,
    "spark": _spark_engine,
}
