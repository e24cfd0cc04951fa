"""The input caps of domain/caps.py as the validator applies them: clean errors with field
paths, never a RecursionError, and nothing recursive ever reading a too-deep config."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.caps import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_EDGES,
    nesting_depth,
    parameter_env_name,
)
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.validation import parse_definition, validate_spec


def spec_with(**task: Any) -> dict[str, Any]:
    return {
        "workflow": "etl",
        "version": 1,
        "taskTypes": {"py": {"image": "python:3.12-slim"}},
        "tasks": [{"key": "a", "type": "py", **task}],
    }


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


@pytest.mark.parametrize("levels", [MAX_CONFIG_DEPTH + 1, 3_000, 100_000])
def test_a_config_nested_too_deep_is_refused_with_its_path(levels: int) -> None:
    errors = validate_spec(spec_with(config=nested(levels)))
    assert [(error.path, error.kind) for error in errors] == [("spec.tasks[0].config", "schema")]
    assert f"more than {MAX_CONFIG_DEPTH} levels deep" in errors[0].message
    with pytest.raises(InvalidDefinitionError):  # not RecursionError: no fingerprint is taken
        parse_definition(spec_with(config=nested(levels)))


def test_a_config_at_the_depth_cap_passes() -> None:
    assert validate_spec(spec_with(config=nested(MAX_CONFIG_DEPTH))) == []


def test_a_config_over_the_size_cap_is_refused() -> None:
    errors = validate_spec(spec_with(config={"blob": "é" * (MAX_CONFIG_BYTES // 6 + 10)}))
    assert [error.path for error in errors] == ["spec.tasks[0].config"]
    assert f"at most {MAX_CONFIG_BYTES} are allowed" in errors[0].message


def test_too_many_edges_in_total_are_refused() -> None:
    keys = [f"t{i}" for i in range(400)]
    tasks: list[dict[str, Any]] = [{"key": key, "type": "py"} for key in keys]
    for index in range(1, len(tasks)):
        tasks[index]["dependsOn"] = keys[:index]
    spec = spec_with()
    spec["tasks"] = tasks
    errors = validate_spec(spec)
    assert [error.path for error in errors] == ["spec.tasks"]
    assert f"at most {MAX_EDGES}" in errors[0].message


def test_nesting_depth_stops_at_the_limit() -> None:
    assert nesting_depth(nested(10), limit=50) == 10
    assert nesting_depth([[[]]], limit=50) == 3
    assert nesting_depth(nested(1_000_000), limit=5) == 6


def test_parameter_env_names_fold_case_and_punctuation() -> None:
    assert parameter_env_name("batch-size") == parameter_env_name("BATCH_SIZE")
    assert parameter_env_name("a.b") == "FLOWFORGE_PARAM_A_B"
