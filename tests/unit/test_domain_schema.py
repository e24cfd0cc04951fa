"""Shape validation: the JSON Schema, its error paths, and the compiled fast path."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from flowforge.domain.errors import DefinitionSchemaError
from flowforge.domain.fastcheck import compile_check
from flowforge.domain.schema import DEFINITION_SPEC_SCHEMA, shape_errors
from tests.unit.domain_builders import spec, task


def paths(errors: list[DefinitionSchemaError]) -> list[str]:
    return [error.path for error in errors]


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(DEFINITION_SPEC_SCHEMA)
    assert DEFINITION_SPEC_SCHEMA["$schema"].endswith("2020-12/schema")


def _walk_properties(schema: Any, where: str = "spec") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    if isinstance(schema, dict):
        for name, subschema in schema.get("properties", {}).items():
            found.append((f"{where}.{name}", subschema))
            found.extend(_walk_properties(subschema, f"{where}.{name}"))
        for keyword in ("items", "additionalProperties"):
            found.extend(_walk_properties(schema.get(keyword), f"{where}[]"))
        for alternative in schema.get("anyOf", []):
            found.extend(_walk_properties(alternative, where))
    return found


def test_every_property_has_a_description() -> None:
    undocumented = [
        where
        for where, subschema in _walk_properties(DEFINITION_SPEC_SCHEMA)
        if not subschema.get("description")
    ]
    assert undocumented == []


def test_every_object_outside_config_forbids_unknown_fields() -> None:
    def objects(schema: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
        if not isinstance(schema, dict):
            return []
        found = [(where, schema)] if schema.get("type") == "object" else []
        for name, subschema in schema.get("properties", {}).items():
            found.extend(objects(subschema, f"{where}.{name}"))
        for keyword in ("items", "additionalProperties"):
            found.extend(objects(schema.get(keyword), f"{where}[]"))
        return found

    open_objects = [
        where
        for where, schema in objects(DEFINITION_SPEC_SCHEMA, "spec")
        if schema.get("additionalProperties", True) is True
    ]
    # a parameter's items schema is checked by flowforge.domain.parameters, keyword by keyword
    assert sorted(open_objects) == [
        "spec.finally[].config",
        "spec.parameters[].items",
        "spec.tasks[].config",
    ]


def test_a_valid_spec_has_no_shape_errors() -> None:
    assert shape_errors(spec(task("extract"), task("load", "extract"))) == []


def test_empty_tasks_is_a_shape_error_at_tasks() -> None:
    errors = shape_errors(spec(tasks=[]))
    assert [(error.path, error.message) for error in errors] == [
        ("spec.tasks", "must not be empty")
    ]


def test_a_missing_required_field_is_reported_at_its_parent() -> None:
    # JSON Schema reports "required" at the object that lacks the field, not at the field.
    document = spec()
    del document["workflow"]
    errors = shape_errors(document)
    assert paths(errors) == ["spec"]
    assert '"workflow"' in errors[0].message
    document = spec(tasks=[{"type": "py"}])
    assert paths(shape_errors(document)) == ["spec.tasks[0]"]


def test_an_unknown_field_is_reported_at_its_own_path() -> None:
    errors = shape_errors(spec(task("extract", timeout=5)))
    assert [(error.path, error.kind) for error in errors] == [("spec.tasks[0].timeout", "schema")]


def test_an_unknown_template_field_names_the_task_type_in_brackets() -> None:
    document = spec(taskTypes={"py": {"image": "x", "imagePolicy": "Always"}})
    assert paths(shape_errors(document)) == ["spec.taskTypes[py].imagePolicy"]


def test_errors_use_kubernetes_style_paths_for_list_items() -> None:
    errors = shape_errors(spec(task("extract"), task("load", "Extract")))
    assert paths(errors) == ["spec.tasks[1].dependsOn[0]"]
    assert "DNS-1123 label" in errors[0].message


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("key", "Extract", "spec.tasks[0].key"),
        ("key", "x" * 51, "spec.tasks[0].key"),
        ("key", "-extract", "spec.tasks[0].key"),
        ("key", "extract\n", "spec.tasks[0].key"),
        ("type", "", "spec.tasks[0].type"),
        ("retries", -1, "spec.tasks[0].retries"),
        ("retries", True, "spec.tasks[0].retries"),
        ("retries", "2", "spec.tasks[0].retries"),
        ("timeoutSeconds", 0, "spec.tasks[0].timeoutSeconds"),
        ("timeoutSeconds", None, "spec.tasks[0].timeoutSeconds"),
        ("config", [1, 2], "spec.tasks[0].config"),
        ("dependsOn", "load", "spec.tasks[0].dependsOn"),
        ("compensateFor", "", "spec.tasks[0].compensateFor"),
    ],
)
def test_task_field_rules(field: str, value: Any, path: str) -> None:
    document = spec({**task("extract"), field: value})
    assert set(paths(shape_errors(document))) == {path}


def test_a_key_of_exactly_50_characters_is_accepted() -> None:
    assert shape_errors(spec(task("x" * 50))) == []


def test_depends_on_entries_must_be_unique() -> None:
    errors = shape_errors(spec(task("extract"), task("load", "extract", "extract")))
    assert [(error.path, error.message) for error in errors] == [
        ("spec.tasks[1].dependsOn", 'has duplicate items: "extract"')
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workflow", "ETL"),
        ("workflow", "a" * 64),
        ("version", 0),
        ("version", 2**31),
        ("version", "3"),
        ("description", 5),
    ],
)
def test_spec_field_rules(field: str, value: Any) -> None:
    assert paths(shape_errors(spec(**{field: value}))) == [f"spec.{field}"]


def test_a_template_needs_an_image() -> None:
    assert paths(shape_errors(spec(taskTypes={"py": {"command": ["x"]}}))) == ["spec.taskTypes[py]"]


def test_template_pod_settings_are_accepted() -> None:
    template = {
        "image": "python:3.12-slim",
        "command": ["python"],
        "args": ["-m", "steps"],
        "env": [{"name": "MODE", "value": "full"}, {"name": "EMPTY"}],
        "resources": {"limits": {"cpu": 1, "memory": "1Gi"}, "requests": {"cpu": "250m"}},
        "annotations": {"example.com/team": "data"},
        "labels": {"team": "data"},
        "serviceAccountName": "etl-runner",
        "nodeSelector": {"pool": "batch"},
        "tolerations": [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert shape_errors(spec(taskTypes={"py": template})) == []


def test_more_than_10000_tasks_is_rejected_cleanly() -> None:
    errors = shape_errors(spec(*(task(f"t{index}") for index in range(10_001))))
    assert [(error.path, error.message) for error in errors] == [
        ("spec.tasks", "must have at most 10000 items (has 10001)")
    ]


def test_a_spec_that_is_not_an_object() -> None:
    assert [(error.path, error.message) for error in shape_errors(["x"])] == [
        ("spec", "must be of type object, not array")
    ]


def test_config_must_hold_only_json_values() -> None:
    import datetime

    document = spec(task("extract", config={"at": datetime.date(2026, 11, 30), "n": float("nan")}))
    errors = shape_errors(document)
    assert paths(errors) == ["spec.tasks[0].config.at", "spec.tasks[0].config.n"]


def test_errors_come_in_a_deterministic_document_order() -> None:
    document = spec(task("B"), task("extract", retries=-1), version=0)
    del document["workflow"]
    expected = ["spec", "spec.tasks[0].key", "spec.tasks[1].retries", "spec.version"]
    assert paths(shape_errors(document)) == expected
    reordered = dict(reversed(list(document.items())))
    assert paths(shape_errors(reordered)) == expected


def test_the_fast_path_rejects_keywords_it_cannot_compile() -> None:
    with pytest.raises(ValueError, match="cannot compile"):
        compile_check({"type": "object", "patternProperties": {"x": {}}})
    with pytest.raises(ValueError, match="cannot compile"):
        compile_check({"type": "string", "format": "email"})


def test_the_fast_path_reads_dollar_as_the_end_of_the_text() -> None:
    fast = compile_check(DEFINITION_SPEC_SCHEMA)
    assert fast(spec(task("extract")))
    assert not fast(spec(task("extract\n")))
    assert not fast(spec(task("extract", retries=True)))


# --- differential: the compiled fast path never accepts what jsonschema rejects -------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 200),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(["", "a", "py", "extract", "Extract", "x" * 51, "etl\n", "Exists", "1Gi"]),
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["key", "type", "image", "a", "name"]), inner, max_size=3),
    ),
    max_leaves=6,
)


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    document: Any = spec(
        task("extract", config={"a": [1, 2]}, retries=1, timeoutSeconds=5),
        task("load", "extract"),
        task("undo", compensateFor="extract"),
        taskTypes={
            "py": {
                "image": "python",
                "env": [{"name": "A", "value": "b"}],
                "resources": {"limits": {"cpu": 1}},
                "tolerations": [{"operator": "Exists"}],
                "serviceAccountName": "runner",
            }
        },
        description="d",
    )
    for _ in range(draw(st.integers(1, 3))):
        document = _mutate(document, draw)
    return document


def _mutate(document: Any, draw: st.DrawFn) -> Any:
    document = copy.deepcopy(document)
    containers: list[Any] = []
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict | list):
            containers.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    target = draw(st.sampled_from(containers))
    value = draw(_json)
    if isinstance(target, dict):
        keys = [*sorted(target), "extra"]
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()) and key in target:
            del target[key]
        else:
            target[key] = value
    elif target:
        index = draw(st.integers(0, len(target) - 1))
        target[index] = value
    else:
        target.append(value)
    return document


@settings(max_examples=400, deadline=None)
@given(mutated_specs())
def test_the_fast_path_agrees_with_jsonschema_when_it_accepts(document: Any) -> None:
    fast = compile_check(DEFINITION_SPEC_SCHEMA)
    if fast(document):
        assert list(Draft202012Validator(DEFINITION_SPEC_SCHEMA).iter_errors(document)) == []
    # and shape_errors, which uses it, matches jsonschema's verdict either way
    # (patterns aside: a trailing newline is rejected here as Kubernetes rejects it)
    reference = not list(Draft202012Validator(DEFINITION_SPEC_SCHEMA).iter_errors(document))
    if not shape_errors(document):
        assert reference
