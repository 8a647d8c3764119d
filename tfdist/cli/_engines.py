"""The engines that ``tfdist-launch`` builds from flags of their own (``--ray-*``, ``--spark-*``).

An engine's flags are the declared fields of its options class (:func:`tfdist._options.option`): each is
``--ENGINE-FIELD`` (``--ray-address``) unless it declares a flag it shares with the emitters (the Ray engine's
``gpus_per_task`` is ``--gpus``). An engine without an entry here is made by
:func:`tfdist.launch.engines.registry.engine_for` from its name alone.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from tfdist.launch.engines.base import Engine
from tfdist.launch.engines.ray.engine import LOOPBACK_VAR, RayEngine, RayOptions, is_local_ray
from tfdist.launch.engines.spark.engine import SparkEngine, SparkOptions

Options = dict[str, Any]


def _unchanged(options: Options, args: argparse.Namespace) -> Options:
    del args
    return options


def _no_variables(options: Options) -> dict[str, str]:
    del options
    return {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineFlags:
    """An engine that ``tfdist-launch`` configures from flags.

    Attributes:
      options: The engine's options dataclass: each field declared with ``option`` is a flag.
      build: Makes the engine from those options (keyword arguments).
      more: Options that other flags imply (Spark: ``--cpus-per-task`` is ``spark.task.cpus``).
      launcher_env: Variables the launcher's own environment needs before the engine's package is imported
        (set only where unset: the user's environment wins).
    """

    options: type
    build: Callable[..., Engine]
    more: Callable[[Options, argparse.Namespace], Options] = _unchanged
    launcher_env: Callable[[Options], dict[str, str]] = _no_variables


def _ray_env(options: Options) -> dict[str, str]:
    # Read by Ray at import: a local Ray then binds every daemon to loopback.
    return {LOOPBACK_VAR: "0"} if is_local_ray(options.get("address")) else {}


def _spark_cpus(options: Options, args: argparse.Namespace) -> Options:
    if args.cpus_per_task is None:
        return options
    return {**options, "conf": {**options.get("conf", {}), "spark.task.cpus": str(args.cpus_per_task)}}


ENGINE_FLAGS: dict[str, EngineFlags] = {
    "ray": EngineFlags(options=RayOptions, build=RayEngine, launcher_env=_ray_env),
    "spark": EngineFlags(options=SparkOptions, build=SparkEngine, more=_spark_cpus),
}
