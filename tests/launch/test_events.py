"""The events a launch injects: text forms, checks, and the faults that last (``for=``, ``until=``)."""

from __future__ import annotations

import re
from typing import Any, cast

import pytest

from tfdist import LaunchError
from tfdist.launch import Faults, KillAt, LaunchConfig, LoseAt, PartitionAt, SlowLink, Straggler


@pytest.mark.parametrize(
    "text,event",
    [
        ("worker:1@after=^EPOCH 1 world", PartitionAt(task="worker:1", after="^EPOCH 1 world")),
        ("worker:1@after=a,b{1,2},for=2.5", PartitionAt(task="worker:1", after="a,b{1,2}", for_seconds=2.5)),
        (
            "chief:0@30,until=^BEGIN 3 generation 1$",
            PartitionAt(task="chief:0", seconds=30, until="^BEGIN 3 generation 1$"),
        ),
        ("worker:1=100MBit", SlowLink(task="worker:1", rate="100mbit")),
        ("ps:0=1gbit@after=x,for=9", SlowLink(task="ps:0", rate="1gbit", after="x", for_seconds=9)),
        ("worker:1=0.25", Straggler(task="worker:1", fraction=0.25)),
        (
            "worker:0=0.5@after=^STEP 0$,until=^EPOCH 1$",
            Straggler(task="worker:0", fraction=0.5, after="^STEP 0$", until="^EPOCH 1$"),
        ),
    ],
)
def test_text_forms_parse_and_print_back(text: str, event: PartitionAt | SlowLink | Straggler) -> None:
    parsed = type(event).parse(text)
    assert parsed == event
    assert type(event).parse(str(parsed)) == parsed  # what the launcher logs reads back the same


def test_without_a_trigger_a_slow_link_or_straggler_starts_with_the_run_and_lasts_to_its_end() -> None:
    assert (Straggler(task="worker:1", fraction=0.25).seconds, SlowLink.parse("worker:1=1gbit").seconds) == (0.0, 0.0)
    assert Straggler.parse("worker:1=0.25").lasts() == "to the end of the run"
    assert PartitionAt.parse("worker:1@5,for=20").lasts() == "for 20 s"
    assert SlowLink.parse("worker:1=1gbit,until=^x$").lasts() == "until a line matches /^x$/"


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: PartitionAt.parse("worker:1"), "`partitions`. Received: 'worker:1'. Expected TASK:INDEX@TRIGGER"),
        (lambda: PartitionAt(task="worker:1"), "`partitions`.*Expected exactly one trigger"),
        (lambda: PartitionAt.parse("worker:1@after=x,for=soon"), "`partitions`. Received: 'worker:1@after=x,for=soon'"),
        (
            lambda: PartitionAt(task="worker:1", seconds=1, for_seconds=0),
            "`partitions`. Received: 0. Expected a number > 0",
        ),
        (lambda: PartitionAt(task="worker:1", seconds=1, for_seconds=1, until="x"), "at most one end"),
        (
            lambda: PartitionAt.parse("worker:1@after=x,until=("),
            "`partitions`. Received: '\\('. Expected a valid regular",
        ),
        (lambda: SlowLink.parse("worker:1=fast"), "`slow_links`. Received: 'fast'. Expected RATE or TASK=RATE"),
        (lambda: SlowLink.parse("worker:1=1bit"), "`slow_links`. Received: '1bit'. Expected a rate from 10kbit"),
        (
            lambda: SlowLink.parse("worker:1@after=x"),
            "`slow_links`. Received: 'worker:1@after=x'. Expected TASK:INDEX=RATE",
        ),
        (lambda: Straggler.parse("worker:1=1"), "`stragglers`. Received: 1.0. Expected a number >= 0.01 and <= 0.99"),
        (
            lambda: Straggler.parse("worker:1=quarter"),
            "`stragglers`. Received: 'worker:1=quarter'. Expected TASK:INDEX=FRACTION",
        ),
        (lambda: Straggler.parse("gpu:1=0.5"), "`stragglers`. Received: 'gpu:1=0.5'"),
        (lambda: Faults(stragglers=cast(Any, "worker:1=0.5")), "`stragglers`.*Put one in a tuple"),
        (
            lambda: Faults(partitions=cast(Any, (KillAt(task="worker:1", seconds=1),))),
            "`partitions`.*Build them with PartitionAt.parse",
        ),
    ],
)
def test_bad_faults_name_their_launch_config_argument(build, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        build()


def test_faults_are_checked_against_the_tasks_and_the_hosts() -> None:
    config = LaunchConfig(
        command=("python",),
        workers=2,
        simulate_hosts=2,
        stragglers=("worker:1=0.25",),
        partitions=("worker:1@after=^STEP 5$,for=20",),
        slow_links=("worker:0=10mbit@after=^STEP 9$",),
        kills=("worker:0@after=^STEP 30$",),
    )
    assert [type(e).__name__ for e in config.faults.events()] == ["KillAt", "Straggler", "PartitionAt", "SlowLink"]
    for options, message in (
        ({"partitions": ("worker:1@5",)}, "`partitions`. Received: 'worker:1@5'. Expected `simulate_hosts` as well"),
        ({"slow_links": ("worker:1=1gbit",)}, "`slow_links`. Received: 'worker:1=1gbit'. Expected `simulate_hosts`"),
        (
            {"stragglers": ("worker:2=0.5",)},
            "`stragglers`. Received: 'worker:2'. Expected one of 'worker:0', 'worker:1'",
        ),
        ({"simulate_hosts": 2, "partitions": ("ps:0@5",)}, "`partitions`. Received: 'ps:0'"),
    ):
        with pytest.raises(LaunchError, match=re.escape(message)):
            LaunchConfig(command=("python",), workers=2, **options)
    # A straggler needs no simulated hosts; kills keep their own rules.
    assert LaunchConfig(command=("python",), workers=2, stragglers=("worker:1=0.5",)).stragglers[0].fraction == 0.5
    assert LoseAt.parse("worker:1@3") != KillAt.parse("worker:1@3")
