"""Fuzz: any JSON value, and any mutation of a valid TF_CONFIG, parses or raises ClusterSpecError."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tfdist import ClusterSpec, ClusterSpecError

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 70000)
    | st.floats(allow_nan=False)
    | st.sampled_from(
        ["", "a:1", "b:2", "[::1]:3", "worker", "ps", "chief", "master", "evaluator", "0", "x:0", "²", "٣", "a:²"]
    )
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "cluster",
                    "task",
                    "type",
                    "index",
                    "worker",
                    "ps",
                    "chief",
                    "evaluator",
                    "master",
                    "rpc_layer",
                    "environment",
                    "0",
                    "1",
                    "²",
                    "٣",
                ]
            )
            | st.text(max_size=5),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)

VALID = {
    "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]},
    "task": {"type": "worker", "index": 1},
    "environment": "cloud",
}


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            paths += _paths(item, prefix + (i,))
    return paths


def _parse_or_spec_error(config: Any) -> str:
    """'rejected' for a ClusterSpecError, 'parsed' for a consistent spec; any other exception escapes."""
    try:
        spec = ClusterSpec.from_tf_config(config)
    except ClusterSpecError:
        return "rejected"
    assert spec.num_workers >= 1
    assert len(spec.fingerprint) == 12
    if spec.task_type is not None:
        assert ClusterSpec.from_tf_config(spec.to_tf_config()) == spec
    return "parsed"


OUTCOMES = ("parsed", "rejected")


@settings(max_examples=400, deadline=None)
@given(_json)
def test_any_json_value(value: Any) -> None:
    for config in (value, json.dumps(value), {"cluster": value}, {"cluster": {"worker": value}}):
        assert _parse_or_spec_error(config) in OUTCOMES


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_valid_configs(data: st.DataObject) -> None:
    config = json.loads(json.dumps(VALID))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(config)))
        if not path:
            continue
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(_json)
        elif isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    assert _parse_or_spec_error(config) in OUTCOMES


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text(text: str) -> None:
    assert _parse_or_spec_error(text) in OUTCOMES
