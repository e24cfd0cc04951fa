"""The fingerprint: what changes it and what must not."""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.domain.fingerprint import fingerprint
from flowforge.domain.validation import parse_definition
from tests.unit.domain_builders import spec, task


def base() -> dict[str, Any]:
    return spec(
        task(
            "extract",
            config={"source": "s3://b", "paths": ["a", "b"], "opts": {"x": 1, "y": 2}},
            retries=2,
            timeoutSeconds=600,
        ),
        task("clean", "extract"),
        task("load", "clean", "extract"),
        task("undo-extract", compensateFor="extract"),
        description="Nightly ETL",
    )


def print_of(document: dict[str, Any]) -> str:
    return parse_definition(document).fingerprint


def test_the_format_is_sha256_hex() -> None:
    value = print_of(base())
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", value)
    assert value == fingerprint(parse_definition(base()))


def test_declaration_order_dependency_order_and_key_order_do_not_matter() -> None:
    document = base()
    shuffled = copy.deepcopy(document)
    shuffled["tasks"].reverse()
    for item in shuffled["tasks"]:
        if "dependsOn" in item:
            item["dependsOn"].reverse()
        if "config" in item:
            item["config"] = dict(reversed(list(item["config"].items())))
            item["config"]["opts"] = {"y": 2, "x": 1}
    shuffled = dict(reversed(list(shuffled.items())))
    assert print_of(shuffled) == print_of(document)


def _edit(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(document: dict[str, Any]) -> None:
        target: Any = document
        parts = path.split(".")
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target[part]
        target[parts[-1]] = value

    return apply


@pytest.mark.parametrize(
    "edit",
    [
        _edit("workflow", "etl2"),
        _edit("version", 4),
        _edit("description", "Nightly ETL, now faster"),
        _edit("taskTypes.py.image", "python:3.13-slim"),
        _edit("taskTypes.py.command", ["python", "-m", "other"]),
        _edit("taskTypes.py.env", [{"name": "MODE", "value": "x"}]),
        _edit("tasks.0.retries", 3),
        _edit("tasks.0.timeoutSeconds", 601),
        _edit("tasks.0.config.source", "s3://c"),
        _edit("tasks.0.config.paths", ["b", "a"]),
        _edit("tasks.0.type", "sh"),
        _edit("tasks.2.dependsOn", ["clean"]),
        _edit("tasks.3.compensateFor", "clean"),
        _edit("tasks.3.key", "undo-it"),
    ],
    ids=lambda edit: "edit",
)
def test_anything_that_changes_a_run_changes_the_fingerprint(
    edit: Callable[[dict[str, Any]], None],
) -> None:
    document = base()
    document["taskTypes"]["sh"] = {"image": "busybox"}
    changed = copy.deepcopy(document)
    edit(changed)
    assert print_of(changed) != print_of(document)


def test_a_changed_description_changes_the_fingerprint() -> None:
    document = base()
    changed = {**document, "description": "something else"}
    assert print_of(changed) != print_of(document)


def test_an_integral_float_counts_as_the_integer_kubernetes_stores() -> None:
    document = base()
    changed = copy.deepcopy(document)
    changed["tasks"][0]["config"]["opts"]["x"] = 1.0
    assert print_of(changed) == print_of(document)
    changed["tasks"][0]["config"]["opts"]["x"] = 1.5
    assert print_of(changed) != print_of(document)


config_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def _shuffle_mappings(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffle_mappings(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffle_mappings(item, rng) for item in value]
    return value


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=4), config_values, max_size=4), st.randoms())
def test_order_and_fingerprint_ignore_shuffled_tasks_dependencies_and_config_keys(
    config: dict[str, Any], rng: random.Random
) -> None:
    document = spec(
        task("a", config=config),
        task("b", "a"),
        task("c", "a"),
        task("d", "b", "c", "a", config=config),
        task("e"),
    )
    shuffled = copy.deepcopy(document)
    rng.shuffle(shuffled["tasks"])
    for item in shuffled["tasks"]:
        if "dependsOn" in item:
            rng.shuffle(item["dependsOn"])
        if "config" in item:
            item["config"] = _shuffle_mappings(item["config"], rng)
    original, reordered = parse_definition(document), parse_definition(shuffled)
    assert reordered.fingerprint == original.fingerprint
    assert reordered.graph.topological_order() == original.graph.topological_order()
    assert reordered.graph.levels() == original.graph.levels()
