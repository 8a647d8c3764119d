"""tfdist-launch's flags are made from the options they set: each is declared once, with its default and help.

LaunchConfig's option groups and the engines' options declare their flags (``tfdist._options.option``); the
parser is built from them, and docs/launch.md's table of every flag is checked against the parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re

import pytest

from tfdist._options import flagged_options
from tfdist.cli import launch as launch_cli
from tfdist.cli._flags import option_values
from tfdist.launch import KillAt, LaunchConfig, Link, LoseAt, RayOptions, ReturnAt, SparkOptions, Topology
from tfdist.launch.inspection import STALL_SECONDS

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "launch.md"
COMMAND = ("python", "train.py")


def _config(argv: list[str]) -> LaunchConfig:
    parser = launch_cli._parser()
    return LaunchConfig(command=COMMAND, **option_values(parser, parser.parse_args(argv), LaunchConfig))


def _flags() -> list[argparse.Action]:
    """Every flag but --help and --version, in --help's order."""
    sections = launch_cli._parser()._action_groups
    return [a for s in sections for a in s._group_actions if a.option_strings and a.dest not in ("help", "version")]


def test_defaults_are_the_options_own_but_the_declared_cli_default() -> None:
    """The one default that differs, --workers 2 (Topology.workers is 1), is declared on the field itself."""
    assert _config([]) == LaunchConfig(command=COMMAND, workers=2)
    assert [(o.name, o.default) for o in flagged_options(Topology) if o.flag.cli_default == o.default] == [
        ("workers", 2)
    ]
    assert Topology().workers == 1


def test_each_flag_sets_its_option() -> None:
    config = _config(
        ["--chief", "--workers", "3", "--ps", "1", "--evaluator", "--run-on", "all", "--max-restarts", "2"]
        + ["--threads-per-task", "4", "--timeout", "60", "--grace", "1.5", "--log-dir", "logs", "--log-level", "debug"]
        + ["--kill", "worker:1@after=Epoch 3/", "--kill", "ps:0@20", "--isolate-network"]
    )
    assert (config.chief, config.workers, config.ps, config.evaluator, config.run_on) == (True, 3, 1, True, "all")
    assert (config.max_restarts, config.threads_per_task, config.timeout, config.grace_seconds) == (2, 4, 60.0, 1.5)
    assert (config.log_dir, config.log_level, config.isolate_network) == ("logs", "debug", True)
    assert config.kills == (KillAt(task="worker:1", after="Epoch 3/"), KillAt(task="ps:0", seconds=20.0))
    elastic = _config(["--workers", "3", "--min-workers", "2", "--max-workers", "3", "--lose", "worker:2@5"])
    assert (elastic.min_workers, elastic.max_workers, elastic.loses) == (2, 3, (LoseAt(task="worker:2", seconds=5.0),))
    back = _config(["--workers", "2", "--min-workers", "1", "--lose", "worker:1@5", "--return", "worker:1@9"])
    assert back.returns == (ReturnAt(task="worker:1", seconds=9.0),)
    assert (_config(["--data-service-workers", "2"]).data_service_workers, _config(["--mesh", "model=2"]).mesh) == (
        2,
        "model=2",
    )
    hosts = _config(["--simulate-hosts", "2", "--link", "1gbit", "--link", "worker:1=100mbit"])
    assert (hosts.simulate_hosts, hosts.links) == (2, (Link(rate="1gbit"), Link(rate="100mbit", task="worker:1")))


def test_stall_seconds_alone_is_its_declared_bare_value() -> None:
    """--stall-seconds is off by default, 300 given alone, S given with a value (also before another flag)."""
    assert _config([]).stall_seconds is None
    assert _config(["--stall-seconds"]).stall_seconds == STALL_SECONDS == 300.0
    assert _config(["--stall-seconds", "--workers", "3"]).stall_seconds == STALL_SECONDS
    assert _config(["--stall-seconds", "45"]).stall_seconds == 45.0
    assert [o.name for o in flagged_options(LaunchConfig) if o.flag.takes_bare] == ["stall_seconds"]


def test_flags_are_named_after_their_options_or_declare_their_name() -> None:
    """--grace, --kill, --lose and --return keep their spellings, declared on the fields (one event per flag)."""
    declared = {o.name: o.flag.name for o in flagged_options(LaunchConfig) if o.flag.name}
    assert declared == {
        "grace_seconds": "--grace",
        "kills": "--kill",
        "loses": "--lose",
        "returns": "--return",
        "links": "--link",
    }
    for option in flagged_options(LaunchConfig):
        assert launch_cli.FLAGS[option.name] == (option.flag.name or "--" + option.name.replace("_", "-"))


@pytest.mark.parametrize("options", [RayOptions, SparkOptions], ids=lambda kind: kind.__name__)
def test_engine_flags_come_from_the_engine_options(options: type) -> None:
    engine = options.__name__.removesuffix("Options").lower()
    fields = {f.name for f in dataclasses.fields(options)}
    assert set(launch_cli.ENGINE_FLAG_NAMES[engine]) == fields  # Every option of the engine has a flag.
    parser = launch_cli._parser()
    args = parser.parse_args(["--engine", engine])
    assert options(**option_values(parser, args, options, prefix=engine)) == options()  # Same defaults.


def test_every_flag_says_where_it_acts() -> None:
    assert {a.dest for a in _flags()} - {"emit"} == set(launch_cli._ACTS)


def _flag_table() -> str:
    """docs/launch.md's table, as the parser has it."""
    rows = ["| flag | default | acts with | what it does |", "|---|---|---|---|"]
    everywhere = launch_cli._RUN | launch_cli._EMITTED
    for action in _flags():
        default = "" if action.default in (None, False, [], 0) else f"`{action.default}`"
        modes = launch_cli._ACTS.get(action.dest, everywhere)
        acts = "all" if modes >= everywhere else ", ".join(sorted(modes))
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        what = (action.help or "").replace("%%", "%").replace("|", "\\|")
        rows.append(f"| {names} | {default} | {acts} | {what} |")
    return "\n".join(rows)


def test_the_docs_table_lists_every_flag_as_declared() -> None:
    """If this fails, replace the table under "## Every flag" in docs/launch.md with the one printed."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Every flag") :]
    table = re.search(r"^\| flag .*?(?=\n\n|\Z)", section, re.S | re.M)
    expected = _flag_table()
    assert table is not None and table.group(0) == expected, "\n" + expected
