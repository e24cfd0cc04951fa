"""Typed run parameters (``domain/parameters.py``): declarations, a run's values, admission."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowforge.admission.review import decide_run_limits
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.parameters import ParameterError, effective_parameters
from flowforge.domain.validation import parse_definition, validate_spec
from tests.unit.admission_fakes import create, wrap
from tests.unit.domain_builders import spec, task

DECLARED: list[dict[str, Any]] = [
    {"name": "mode", "type": "string", "enum": ["full", "incremental"], "default": "incremental"},
    {
        "name": "regions",
        "type": "array",
        "items": {"type": "string"},
        "minItems": 1,
        "default": ["eu-west-1"],
    },
    {"name": "batchSize", "type": "integer", "minimum": 1, "default": 500},
    {"name": "dryRun", "type": "boolean", "default": False},
    {"name": "ratio", "type": "number", "maximum": 1},
    {"name": "owner", "type": "string", "pattern": "^[a-z]+$", "required": True},
    {"name": "labels", "type": "object"},
]


def typed(**fields: Any) -> dict[str, Any]:
    return spec(task("extract"), **{"parameters": DECLARED, **fields})


def refusal(raw: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ParameterError) as caught:
        effective_parameters(parse_definition(typed()), raw)
    return dict(caught.value.errors)


def test_defaults_are_filled_in_and_given_values_kept() -> None:
    values = effective_parameters(
        parse_definition(typed()), {"owner": "ops", "mode": "full", "batchSize": 2.0}
    )
    assert values == {
        "mode": "full",
        "regions": ["eu-west-1"],
        "batchSize": 2,  # an integral float is the integer Kubernetes stores
        "dryRun": False,
        "owner": "ops",
    }
    assert type(values["batchSize"]) is int


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ({"owner": "ops", "regoins": ["us"]}, "spec.parameters.regoins", "unknown parameter"),
        ({"owner": "ops", "batchSize": "500"}, "spec.parameters.batchSize", "must be of type"),
        ({"owner": "ops", "batchSize": True}, "spec.parameters.batchSize", "not boolean"),
        ({"owner": "ops", "batchSize": 0}, "spec.parameters.batchSize", "less than the minimum"),
        ({"owner": "ops", "mode": "fast"}, "spec.parameters.mode", '"full", "incremental"'),
        ({"owner": "ops", "regions": []}, "spec.parameters.regions", "non-empty"),
        ({"owner": "ops", "regions": [1]}, "spec.parameters.regions[0]", "must be of type"),
        ({"owner": "Ops"}, "spec.parameters.owner", "does not match"),
        ({"owner": "ops\n"}, "spec.parameters.owner", "does not match"),  # as Go reads $
        ({"owner": "ops", "ratio": 1.5}, "spec.parameters.ratio", "greater than the maximum"),
        ({"owner": "ops", "labels": []}, "spec.parameters.labels", "must be of type object"),
        ({}, "spec.parameters.owner", "required parameter of type string"),
    ],
    ids=repr,
)
def test_a_value_that_does_not_fit_is_refused_naming_the_parameter(
    raw: dict[str, Any], path: str, message: str
) -> None:
    errors = refusal(raw)
    assert path in errors, errors
    assert message in errors[path]


def test_every_problem_is_listed_at_once() -> None:
    assert sorted(refusal({"regoins": 1, "batchSize": -1})) == [
        "spec.parameters.batchSize",
        "spec.parameters.owner",
        "spec.parameters.regoins",
    ]


def test_without_declarations_parameters_stay_free_strings() -> None:
    definition = parse_definition(spec(task("extract")))
    assert effective_parameters(definition, {"date": "2026-11-30", "x": ""}) == {
        "date": "2026-11-30",
        "x": "",
    }
    with pytest.raises(ParameterError) as caught:
        effective_parameters(definition, {"n": 3})
    assert dict(caught.value.errors)["spec.parameters.n"].startswith("must be a string")


@pytest.mark.parametrize(
    ("declaration", "path", "message"),
    [
        ({"name": "a", "type": "string", "minimum": 1}, ".minimum", "does not apply to type"),
        ({"name": "a", "type": "integer", "items": {"type": "string"}}, ".items", "not apply"),
        ({"name": "a", "type": "string", "default": 3}, ".default", "must be of type string"),
        ({"name": "a", "type": "string", "enum": ["x", 1]}, ".enum[1]", "must be of type"),
        ({"name": "a", "type": "string", "enum": ["x"], "default": "y"}, ".default", "one of"),
        ({"name": "a", "type": "integer", "default": 1, "required": True}, ".required", "never"),
        ({"name": "a", "type": "string", "pattern": "("}, ".pattern", "regular expression"),
        ({"name": "a", "type": "array", "items": {"type": "strin"}}, ".items.type", "one of"),
        ({"name": "a", "type": "integer", "minimum": 5, "maximum": 1}, ".minimum", "greater"),
        ({"name": "a", "type": "array", "items": {"type": "string", "x": 1}}, ".items.x", "not"),
    ],
    ids=repr,
)
def test_a_declaration_that_cannot_hold_is_refused_with_its_field(
    declaration: dict[str, Any], path: str, message: str
) -> None:
    errors = validate_spec(spec(task("extract"), parameters=[declaration]))
    paths = {error.path: error.message for error in errors}
    assert f"spec.parameters[0]{path}" in paths, paths
    assert message in paths[f"spec.parameters[0]{path}"]


def test_shape_errors_of_declarations_name_the_field() -> None:
    errors = validate_spec(
        spec(task("extract"), parameters=[{"name": "1st", "type": "text", "extra": 1}])
    )
    assert {error.path for error in errors} == {
        "spec.parameters[0].name",
        "spec.parameters[0].type",
        "spec.parameters[0].extra",
    }


def test_a_parameter_is_declared_once() -> None:
    with pytest.raises(InvalidDefinitionError) as caught:
        parse_definition(
            spec(
                task("extract"),
                parameters=[{"name": "a", "type": "string"}, {"name": "a", "type": "integer"}],
            )
        )
    assert [error.path for error in caught.value.errors] == ["spec.parameters[1].name"]


def test_the_fingerprint_covers_the_declarations_and_keeps_old_ones() -> None:
    plain = parse_definition(spec(task("extract")))
    assert plain.fingerprint == parse_definition(spec(task("extract"), parameters=[])).fingerprint
    first = parse_definition(typed())
    changed = [dict(item) for item in DECLARED]
    changed[2]["default"] = 501
    assert first.fingerprint != plain.fingerprint
    assert first.fingerprint != parse_definition(typed(parameters=changed)).fingerprint
    same = [dict(item) for item in DECLARED]
    same[2]["default"] = 500.0
    assert first.fingerprint == parse_definition(typed(parameters=same)).fingerprint


async def test_admission_refuses_a_run_naming_the_parameter() -> None:
    definition = parse_definition(typed())
    bad = wrap("WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"regoins": ["x"]}})
    verdict = await decide_run_limits(create(bad), definition=definition, runs=None)
    assert not verdict.allowed and verdict.code == 422
    assert "spec.parameters.regoins: unknown parameter" in verdict.message
    assert "spec.parameters.owner: required parameter" in verdict.message
    good = wrap("WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"owner": "ops"}})
    assert (await decide_run_limits(create(good), definition=definition, runs=None)).allowed


async def test_admission_keeps_string_parameters_for_an_undeclared_definition() -> None:
    definition = parse_definition(spec(task("extract")))
    run = wrap("WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"n": 3}})
    verdict = await decide_run_limits(create(run), definition=definition, runs=None)
    assert not verdict.allowed
    assert "spec.parameters.n: must be a string" in verdict.message


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=8,
)


@given(raw=st.dictionaries(st.sampled_from([d["name"] for d in DECLARED] + ["x"]), _JSON))
def test_effective_parameters_always_fit_and_are_a_fixed_point(raw: dict[str, Any]) -> None:
    """Whatever a run gives: either a refusal naming fields of spec.parameters, or values
    that pass again unchanged (what the run records expands to itself)."""
    definition = parse_definition(typed())
    try:
        values = effective_parameters(definition, raw)
    except ParameterError as error:
        assert error.errors
        assert all(path.startswith("spec.parameters.") for path, _ in error.errors)
        return
    assert effective_parameters(definition, values) == values
    assert set(values) >= {"mode", "regions", "batchSize", "dryRun", "owner"}
