"""``tfdist plan``: per-step communication and memory estimates, and which parallelism to use."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Any, TypeVar

from tfdist._options import flagged_options
from tfdist.cli._flags import flag_names
from tfdist.comm.compressor import Compressor, TrafficModel
from tfdist.comm.host import RATE_NAMES, HostRates
from tfdist.comm.registry import compressor_for, registered_compressors
from tfdist.comm.traffic import compressed_traffic
from tfdist.comm.variants import VariantEstimate, choose_variant, estimate_variants
from tfdist.errors import Error, LaunchError, PlanError, StrategyError, invalid
from tfdist.launch.network import Link
from tfdist.plan import LAN_LATENCY, OPTIMIZER_SLOTS, Plan, parse_quantity
from tfdist.runtime.program import one_line

_Default = TypeVar("_Default", float, None)  # optional()'s default: a float gives a float.


def _options(compressions: dict[str, type[Compressor]]) -> dict[str, tuple[dataclasses.Field[Any], str]]:
    """Each compressor option (a field of its dataclass) by name, with the first compression that has it."""
    options: dict[str, tuple[dataclasses.Field[Any], str]] = {}
    for name, cls in compressions.items():
        for field in dataclasses.fields(cls):
            options.setdefault(field.name, (field, name))
    return options


# The registered compressors by their --compression spelling ('local-sgd'), and their options: each is a flag
# of its own (--rank), read from the compressor's dataclass.
_COMPRESSIONS = {name.replace("_", "-"): cls for name, cls in registered_compressors().items()}
_OPTIONS = _options(_COMPRESSIONS)
# Plan's fields and the compressors' options as this command's flags, and the quantities' examples, for its errors.
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
    "shapes": "--shapes",
    **flag_names(HostRates),
    **{option: "--" + option.replace("_", "-") for option in _OPTIONS},
}
# The host's rates a compressor's compute takes besides the memory bandwidth (with --compression as well).
_COMPUTE_RATES = tuple(name for name in RATE_NAMES if name not in ("collective_bandwidth", "memory_bandwidth"))
_EXAMPLES = {
    "params": "7B",
    "bandwidth": "10Gbps",
    "latency": "50us",
    "device_memory": "16GiB",
    "compute_s": "120ms",
    "embedding_values": "320M",
    "embedding_touched": "20k",
}


def _in_flags(err: Error) -> Error:
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
    parser.add_argument(
        "--params", default=None, help="trainable parameters, e.g. 25.6M or 7B (default: from --shapes or --model)"
    )
    parser.add_argument("--workers", type=int, required=True, help="machines")
    parser.add_argument(
        "--gpus-per-worker", type=int, default=1, help="devices per machine (replicas = workers x this)"
    )
    _add_link(parser)
    parser.add_argument("--device-memory", default=None, help="memory per device, e.g. 16GiB")
    parser.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZER_SLOTS))
    _add_compression(parser)
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


def _add_link(parser: argparse.ArgumentParser) -> None:
    """The link's flags: ``--bandwidth`` and ``--latency``, or ``--link`` (latency default a LAN's)."""
    link = parser.add_mutually_exclusive_group(required=True)
    link.add_argument("--bandwidth", help="per-machine link, e.g. 10Gbps or 1.25GB/s")
    link.add_argument(
        "--link",
        metavar="RATE",
        help="per-machine link, each way, as tfdist-launch --link and tfdist doctor --measure-link write it: "
        f"1gbit, 100mbit (latency default {LAN_LATENCY * 1e6:g}us)",
    )
    parser.add_argument("--latency", help="message latency, e.g. 50us (required with --bandwidth)")


def _add_compression(parser: argparse.ArgumentParser) -> None:
    """The compressors' flags (each option its own), the weights' shapes, and ``--choose``."""
    shaped = ", ".join(name for name, cls in _COMPRESSIONS.items() if issubclass(cls, TrafficModel))
    parser.add_argument(
        "--compression",
        choices=tuple(_COMPRESSIONS),
        default="none",
        help=f"gradient compression on the wire; {shaped} need the weights' shapes",
    )
    for option, (field, name) in _OPTIONS.items():
        parser.add_argument(
            _FLAGS[option],
            type=type(field.default),
            default=None,
            help=f"{field.metadata.get('help', option)} (--compression {name}; default {field.default})",
        )
    for opt in flagged_options(HostRates):  # The host's rates, declared with HostRates.
        parser.add_argument(
            opt.flag_name(),
            default=None,
            metavar="RATE",
            help=f"{opt.flag.help}; default {rate_text(opt.default)} with --choose, none (the wire only) for "
            f"--compression ({shaped}), where it adds the compressor's compute"
            if opt.name == "memory_bandwidth"
            else f"{opt.flag.help}; default {rate_text(opt.default)}"
            + ("" if opt.name in _COMPUTE_RATES else ", --choose only"),
        )
    parser.add_argument("--shapes", default=None, help="the trainable weights' shapes: a JSON list, or a JSON file")
    parser.add_argument(
        "--model", default=None, help="a tf_keras.applications model whose weights' shapes to use, e.g. ResNet50"
    )
    parser.add_argument(
        "--choose",
        action="store_true",
        help="price every variant (fp32, bf16, fp16, PowerSGD rank 1/2/4, top-k 1%%, local SGD k=4) on the wire "
        "and the host (--collective-bandwidth, --memory-bandwidth) and pick the fastest; needs --shapes or --model",
    )


def rate_text(bytes_per_second: float) -> str:
    """A rate in bytes per second as the flags take it, to three digits: '300MB/s', '9.61GB/s'.

    Example:
        >>> rate_text(313.4e6), rate_text(9.612e9)
        ('313MB/s', '9.61GB/s')
    """
    return f"{bytes_per_second / 1e9:.3g}GB/s" if bytes_per_second >= 1e9 else f"{bytes_per_second / 1e6:.3g}MB/s"


def run(args: argparse.Namespace) -> int:
    try:
        plan, compressed, variants, host = _plan(args)
    except (PlanError, StrategyError) as err:  # StrategyError: a compressor's option.
        sys.stderr.write(f"tfdist plan: error: {one_line(str(_in_flags(err)))}\n")
        return 2
    data = plan.to_dict()
    if compressed is not None:
        data["compressed"] = compressed.to_dict()
    if variants:
        data["variants"] = [_variant_dict(v) for v in variants]
        data["choice"] = choose_variant(variants).label
        data["host"] = dataclasses.asdict(host)
    if args.json:
        sys.stdout.write(json.dumps(data, allow_nan=False) + "\n")  # Strict JSON: never Infinity or NaN.
    else:
        sys.stdout.write(_report(args, data, compressed) + _variants_report(variants, host, _host_given(args)))
    return 0


def _link(args: argparse.Namespace) -> tuple[float, float]:
    """(bandwidth in bytes/s, latency in s) of ``--link`` (and ``--latency``, default a LAN's), or of
    ``--bandwidth`` and ``--latency``."""
    latency = None if args.latency is None else parse_quantity(args.latency, "time", field="--latency")
    if args.link is None:
        if latency is None:
            raise invalid(
                PlanError, "--latency", None, "a latency with --bandwidth", "Pass e.g. --latency 50us, or --link 1gbit."
            )
        return parse_quantity(args.bandwidth, "bandwidth", field="--bandwidth"), latency
    try:
        link = Link.parse(args.link)
    except LaunchError:
        link = None
    if link is None or link.task is not None:
        raise invalid(
            PlanError,
            "--link",
            args.link,
            "a RATE: a number and bit, kbit, mbit, gbit or tbit, from 10kbit to 1tbit",
            "Pass e.g. --link 1gbit.",
        )
    return link.bits_per_second / 8, LAN_LATENCY if latency is None else latency


def _plan(args: argparse.Namespace) -> tuple[Plan, Any, list[VariantEstimate], HostRates]:
    """The plan of the flags, the compressor's traffic where it models one (else None), with ``--choose``
    every variant's estimate, and the host's rates it priced them with."""
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

    shapes = _shapes(args)
    if args.params is None and shapes is None:
        raise invalid(
            PlanError, "--params", None, "a parameter count, or --shapes or --model", "Pass e.g. --params 25.6M."
        )
    options = {option: getattr(args, option) for option in _OPTIONS if getattr(args, option) is not None}
    compressor = compressor_for(_COMPRESSIONS[args.compression].name, options)
    if shapes is None and isinstance(compressor, TrafficModel):
        raise _needs_shapes("--compression", args.compression, "it sends")
    if shapes is None and args.choose:
        raise _needs_shapes("--choose", True, "each variant sends")
    params = (
        parse_quantity(args.params, field="--params")
        if args.params is not None
        else float(sum(math.prod(s) for s in shapes or []))
    )
    bandwidth, latency = _link(args)
    plan = Plan(
        params=params,
        workers=args.workers,
        gpus_per_worker=args.gpus_per_worker,
        bandwidth=bandwidth,
        latency=latency,
        device_memory=optional(args.device_memory, "bytes", None, "--device-memory"),
        optimizer=args.optimizer,
        bytes_per_value=compressor.value_bytes,
        ps_shards=args.ps_shards,
        compute_s=optional(args.compute, "time", None, "--compute"),
        embedding_values=optional(args.embedding_values, "count", 0.0, "--embedding-values"),
        embedding_touched=optional(args.embedding_touched, "count", 0.0, "--embedding-touched"),
    )
    host = HostRates(
        **{name: parse_quantity(text, "bandwidth", field=_FLAGS[name]) for name, text in _host_given(args).items()}
    )
    link: dict[str, Any] = {"workers": plan.workers, "bandwidth": bandwidth, "latency": latency}
    variants = estimate_variants(shapes=shapes or [], host=host, **link) if args.choose else []
    if not isinstance(compressor, TrafficModel):
        return plan, None, variants, host
    rates = host if "memory_bandwidth" in _host_given(args) else None  # Its compute on the host, or the wire only.
    traffic = compressed_traffic(shapes=shapes or [], compression=compressor, host=rates, **link)
    return plan, traffic, variants, host


def _host_given(args: argparse.Namespace) -> dict[str, str]:
    """The host's rates given as flags, by field."""
    return {
        opt.name: getattr(args, opt.name) for opt in flagged_options(HostRates) if getattr(args, opt.name) is not None
    }


def _needs_shapes(flag: str, value: Any, sends: str) -> PlanError:
    return invalid(
        PlanError,
        flag,
        value,
        f"--shapes or --model with it (what {sends} depends on each weight's shape)",
        "Pass e.g. --model ResNet50, or --shapes '[[2048, 1000], [1000]]'.",
    )


def _variant_dict(estimate: VariantEstimate) -> dict[str, Any]:
    return {
        "variant": estimate.label,
        "seconds": estimate.seconds,
        "wire_seconds": estimate.wire_seconds,
        "arithmetic_seconds": estimate.arithmetic_seconds,
        "host_seconds": estimate.host_seconds,
        "bytes_per_step": estimate.bytes_per_step,
    }


def _variants_report(variants: list[VariantEstimate], host: HostRates, given: dict[str, str]) -> str:
    """The variants' lines of ``--choose``: each one's time per step, then the fastest."""
    if not variants:
        return ""
    lines = [
        f"host:              collectives {rate_text(host.collective_bandwidth)}, memory {rate_text(host.memory_bandwidth)}, "
        f"top-k selection {rate_text(host.select_bandwidth)} and scatter {rate_text(host.scatter_bandwidth)}, thin "
        f"products {rate_text(host.matmul_bandwidth)} (rank 1: {rate_text(host.matvec_bandwidth)}), "
        f"{host.overlap:.0%} of the shorter of wire and host hidden",
        "variants:          ms/step (wire; host: collectives + compute), MB/worker step",
    ]
    if len(given) < len(flagged_options(HostRates)):
        lines.insert(
            1, "                   (defaults measured on 2 CPU cores: tfdist doctor --measure-host measures yours)"
        )
    for v in variants:
        lines.append(
            f"  {v.label:<17}{v.seconds * 1e3:10.2f} ({v.wire_seconds * 1e3:.2f}; {(v.host_seconds or 0) * 1e3:.2f} + "
            f"{(v.arithmetic_seconds or 0) * 1e3:.2f}), {v.bytes_per_step / 1e6:.3f}"
        )
    lines.append(f"choice:            {choose_variant(variants).label} (accuracy not priced: docs/communication.md)")
    return "\n".join(lines) + "\n"


def _report(args: argparse.Namespace, data: dict[str, Any], compressed: Any) -> str:
    """The plan as the lines ``tfdist plan`` prints."""
    embedding = ""
    if compressed is not None:
        embedding += (
            f"{args.compression + ':':19}{compressed.seconds_per_step * 1e3:10.2f} ms/step, "
            f"{compressed.bytes_per_step / 1e6:.3f} MB/worker step ({compressed.fewer_bytes:.1f}x fewer bytes "
            "than float32; the wire only)\n"
        )
        if compressed.warmup_steps:
            embedding += (
                f"{'  first steps:':19}{compressed.warmup_seconds_per_step * 1e3:10.2f} ms/step, "
                f"{compressed.warmup_bytes_per_step / 1e6:.3f} MB/worker step for the first "
                f"{compressed.warmup_steps} (its warm-up)\n"
            )
        if compressed.arithmetic_seconds is None:
            embedding += "                   (add --memory-bandwidth for the compressor's compute)\n"
        else:
            embedding += (
                f"{'  + compute:':19}{compressed.arithmetic_seconds * 1e3:10.2f} ms/step, "
                f"{(compressed.total_seconds or 0.0) * 1e3:.2f} ms/step in all\n"
            )
    if "embedding_ratio" in data:
        embedding = (
            f"embedding tables:  {data['embedding_ps_bytes'] / 1e6:10.3f} MB/worker step as ps rows, "
            f"{data['embedding_allreduce_bytes'] / 1e6:.3f} MB as a dense all-reduce "
            f"({data['embedding_ratio']:.1f}x)\n"
        )
    return (
        f"ring all-reduce:   {data['ring_allreduce_s'] * 1e3:10.2f} ms/step\n"
        f"tree all-reduce:   {data['tree_allreduce_s'] * 1e3:10.2f} ms/step\n"
        f"parameter servers: {data['ps_s'] * 1e3:10.2f} ms/step\n"
        f"replicas:          {data['replicas']:10d} ({args.workers} machines x {args.gpus_per_worker} device{'s' * (args.gpus_per_worker != 1)})\n"
        f"memory/replica:    {data['memory_per_replica_bytes'] / 2**30:10.2f} GiB (no activations)\n"
        f"{embedding}recommendation:    {data['recommendation']}\n"
        + "".join(f"  - {reason}\n" for reason in data["reasons"])
        + (
            f"launch:            tfdist-launch --workers {args.workers} --mesh {data['mesh']} -- python train.py "
            "(docs/model-parallel.md)\n"
            if data["mesh"]
            else ""
        )
    )


def _shapes(args: argparse.Namespace) -> list[list[int]] | None:
    """The weights' shapes from ``--shapes`` (JSON, or a JSON file) or ``--model`` (tf_keras.applications)."""
    if args.shapes is not None and args.model is not None:
        raise invalid(PlanError, "--model", args.model, "either --shapes or --model, not both", "Drop one of them.")
    if args.shapes is not None:
        text = args.shapes
        if os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        try:
            shapes: Any = json.loads(text)
        except json.JSONDecodeError:
            shapes = None
        if (
            not isinstance(shapes, list)
            or not all(
                isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in s)
                for s in shapes
            )
            or not shapes
        ):
            raise invalid(
                PlanError,
                "--shapes",
                args.shapes,
                "a JSON list of shapes (each a list of positive integers), or a file holding one",
                "Pass e.g. --shapes '[[3, 3, 64, 64], [64]]'.",
            )
        return [list(s) for s in shapes]
    if args.model is not None:
        return _application_shapes(args.model)
    return None


def _application_shapes(name: str) -> list[list[int]]:
    """The trainable weights' shapes of ``tf_keras.applications.<name>`` (built without weights)."""
    import tf_keras

    names = sorted(n for n in dir(tf_keras.applications) if n[:1].isupper())
    if name not in names:
        from tfdist._names import describe_choices

        raise invalid(PlanError, "--model", name, describe_choices(name, names))
    model = getattr(tf_keras.applications, name)(weights=None)
    return [[int(d) for d in w.shape] for w in model.trainable_weights]
