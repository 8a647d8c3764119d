"""``tfdist plan``: per-step communication and memory estimates, and which parallelism to use."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TypeVar

from tfdist.comm.collective import GRADIENT_COMPRESSIONS, gradient_value_bytes
from tfdist.errors import PlanError, invalid
from tfdist.plan import OPTIMIZER_SLOTS, Plan, parse_quantity
from tfdist.runtime.program import one_line

_Default = TypeVar("_Default", float, None)  # optional()'s default: a float gives a float.


# Plan's fields as this command's flags, and the quantities' examples, for its errors.
_FLAGS = {
    "params": "--params",
    "workers": "--workers",
    "gpus_per_worker": "--gpus-per-worker",
    "bandwidth": "--bandwidth",
    "latency": "--latency",
    "device_memory": "--device-memory",
    "optimizer": "--optimizer",
    "bytes_per_value": "--compression",
    "ps_shards": "--ps-shards",
    "compute_s": "--compute",
    "embedding_values": "--embedding-values",
    "embedding_touched": "--embedding-touched",
}
_EXAMPLES = {
    "params": "7B",
    "bandwidth": "10Gbps",
    "latency": "50us",
    "device_memory": "16GiB",
    "compute_s": "120ms",
    "embedding_values": "320M",
    "embedding_touched": "20k",
}


def _in_flags(err: PlanError) -> PlanError:
    """``err`` restated for the command line: the flag instead of the field, a flag's example as the fix.

    Example:
        >>> print(_in_flags(invalid(PlanError, "compute_s", 0.0, "a number > 0", "Pass a number; ...")))
        Invalid value for `--compute`. Received: 0.0. Expected a number > 0. Pass e.g. --compute 120ms.
    """
    field = str(err.field or "")
    if field not in _FLAGS:
        return err  # Already a flag (parse_quantity was given one), or not one of Plan's fields.
    flag = _FLAGS[field]
    fix = f"Pass e.g. {flag} {_EXAMPLES[field]}." if field in _EXAMPLES else str(err.fix or "")
    expected = str(err.expected or "").removesuffix(" or None")  # Unset is leaving the flag out.
    return invalid(PlanError, flag, err.value, expected, fix)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="estimate communication and memory; recommend a parallelism",
        description="Alpha-beta cost model for ring and tree all-reduce and parameter "
        "servers, plus weights+gradients+optimizer memory per replica.",
    )
    parser.add_argument("--params", required=True, help="trainable parameters, e.g. 25.6M or 7B")
    parser.add_argument("--workers", type=int, required=True, help="machines")
    parser.add_argument(
        "--gpus-per-worker", type=int, default=1, help="devices per machine (replicas = workers x this)"
    )
    parser.add_argument("--bandwidth", required=True, help="per-machine link, e.g. 10Gbps or 1.25GB/s")
    parser.add_argument("--latency", required=True, help="message latency, e.g. 50us")
    parser.add_argument("--device-memory", default=None, help="memory per device, e.g. 16GiB")
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_SLOTS))
    parser.add_argument(
        "--compression", choices=GRADIENT_COMPRESSIONS, default="none", help="gradient compression on the wire"
    )
    parser.add_argument("--ps-shards", type=int, default=None, help="parameter servers (default: --workers)")
    parser.add_argument("--compute", default=None, help="compute time per step, e.g. 120ms")
    parser.add_argument(
        "--embedding-values",
        default=None,
        help="of --params, the values in embedding tables (rows x dim, all tables), e.g. 320M",
    )
    parser.add_argument(
        "--embedding-touched", default=None, help="values in the distinct rows one worker's batch reads, e.g. 20k"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        if (args.embedding_values is None) != (args.embedding_touched is None):
            given = "--embedding-values" if args.embedding_values is not None else "--embedding-touched"
            raise invalid(
                PlanError,
                given,
                args.embedding_values or args.embedding_touched,
                "both --embedding-values and --embedding-touched",
                "Pass both, e.g. --embedding-values 320M --embedding-touched 20k.",
            )

        def optional(text: str | None, kind: str, default: _Default, flag: str) -> float | _Default:
            return default if text is None else parse_quantity(text, kind, field=flag)  # "" is an error, not unset.

        plan = Plan(
            params=parse_quantity(args.params, field="--params"),
            workers=args.workers,
            gpus_per_worker=args.gpus_per_worker,
            bandwidth=parse_quantity(args.bandwidth, "bandwidth", field="--bandwidth"),
            latency=parse_quantity(args.latency, "time", field="--latency"),
            device_memory=optional(args.device_memory, "bytes", None, "--device-memory"),
            optimizer=args.optimizer,
            bytes_per_value=gradient_value_bytes(args.compression),
            ps_shards=args.ps_shards,
            compute_s=optional(args.compute, "time", None, "--compute"),
            embedding_values=optional(args.embedding_values, "count", 0.0, "--embedding-values"),
            embedding_touched=optional(args.embedding_touched, "count", 0.0, "--embedding-touched"),
        )
    except PlanError as err:
        sys.stderr.write(f"tfdist plan: error: {one_line(str(_in_flags(err)))}\n")
        return 2
    data = plan.to_dict()
    if args.json:
        sys.stdout.write(json.dumps(data, allow_nan=False) + "\n")  # Strict JSON: never Infinity or NaN.
        return 0
    embedding = ""
    if "embedding_ratio" in data:
        embedding = (
            f"embedding tables:  {data['embedding_ps_bytes'] / 1e6:10.3f} MB/worker step as ps rows, "
            f"{data['embedding_allreduce_bytes'] / 1e6:.3f} MB as a dense all-reduce "
            f"({data['embedding_ratio']:.1f}x)\n"
        )
    sys.stdout.write(
        f"ring all-reduce:   {data['ring_allreduce_s'] * 1e3:10.2f} ms/step\n"
        f"tree all-reduce:   {data['tree_allreduce_s'] * 1e3:10.2f} ms/step\n"
        f"parameter servers: {data['ps_s'] * 1e3:10.2f} ms/step\n"
        f"replicas:          {data['replicas']:10d} ({args.workers} machines x {args.gpus_per_worker} device{'s' * (args.gpus_per_worker != 1)})\n"
        f"memory/replica:    {data['memory_per_replica_bytes'] / 2**30:10.2f} GiB (no activations)\n"
        f"{embedding}recommendation:    {data['recommendation']}\n"
        + "".join(f"  - {reason}\n" for reason in data["reasons"])
    )
    return 0
