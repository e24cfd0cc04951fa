"""The two validators together: graph rules from both sides, and the shape error winning."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.errors import (
    DefinitionConflictError,
    DefinitionError,
    InvalidDefinitionError,
)
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.planning import plan
from flowforge.domain.validation import parse_definition, validate_spec
from tests.unit.domain_builders import spec, task


def verdict(document: Any) -> list[tuple[str, str]]:
    return [(error.kind, error.path) for error in validate_spec(document)]


def test_a_valid_definition_parses_into_typed_models() -> None:
    definition = parse_definition(
        spec(
            task("extract", config={"source": "s3://b"}, retries=2, timeoutSeconds=600),
            task("load", "extract"),
            task("undo-extract", compensateFor="extract"),
            description="Nightly ETL",
        )
    )
    assert definition.workflow == "etl" and definition.version == 3
    assert definition.description == "Nightly ETL"
    assert definition.task("extract").timeout_seconds == 600
    assert definition.task("extract").retries == 2
    assert definition.task("load").depends_on == ("extract",)
    assert [task.key for task in definition.forward_tasks] == ["extract", "load"]
    assert definition.compensators["extract"].key == "undo-extract"
    assert definition.task_types["py"].image == "python:3.12-slim"
    assert definition.fingerprint.startswith("sha256:")
    with pytest.raises(KeyError):
        definition.task("ghost")


def test_to_document_round_trips() -> None:
    document = spec(
        task("extract", config={"b": [1, {"c": None}], "a": True}, retries=0),
        task("load", "extract", timeoutSeconds=5),
        task("undo", compensateFor="extract"),
        taskTypes={
            "py": {
                "image": "python",
                "env": [{"name": "A", "value": "1"}],
                "resources": {"limits": {"cpu": 2, "memory": "1Gi"}},
                "serviceAccountName": "runner",
                "nodeSelector": {"pool": "batch"},
                "tolerations": [{"key": "batch", "operator": "Exists"}],
            }
        },
    )
    definition = parse_definition(document)
    again = parse_definition(definition.to_document())
    assert again == definition
    assert again.fingerprint == definition.fingerprint
    assert definition.to_document()["taskTypes"]["py"]["serviceAccountName"] == "runner"


def test_models_are_frozen() -> None:
    definition = parse_definition(spec())
    with pytest.raises(ValueError, match="frozen"):
        definition.workflow = "other"


def test_duplicate_task_keys_are_a_graph_error_the_schema_cannot_see() -> None:
    errors = validate_spec(spec(task("extract"), task("load"), task("extract")))
    assert [(error.kind, error.path) for error in errors] == [
        ("duplicate-key", "spec.tasks[2].key")
    ]
    assert "spec.tasks[0]" in errors[0].message


def test_an_unknown_dependency_names_the_missing_task() -> None:
    errors = validate_spec(spec(task("extract"), task("load", "extract", "ghost")))
    assert [(error.kind, error.path) for error in errors] == [
        ("unknown-dependency", "spec.tasks[1].dependsOn[1]")
    ]
    assert errors[0].message == 'task "load" depends on unknown task "ghost"'


def test_an_unknown_task_type() -> None:
    errors = validate_spec(spec(task("extract", type="java")))
    assert [(error.kind, error.path) for error in errors] == [
        ("unknown-task-type", "spec.tasks[0].type")
    ]
    assert '"java"' in errors[0].message and "py" in errors[0].message


def test_a_missing_task_types_map_makes_every_type_unknown() -> None:
    document = spec(task("extract"))
    del document["taskTypes"]
    assert verdict(document) == [("unknown-task-type", "spec.tasks[0].type")]


def test_a_two_task_cycle() -> None:
    errors = validate_spec(spec(task("a", "b"), task("b", "a")))
    assert [(error.kind, error.path, error.message) for error in errors] == [
        ("cycle", "spec.tasks", "dependency cycle detected: a -> b -> a")
    ]


def test_a_cyclic_definition_does_not_parse() -> None:
    with pytest.raises(InvalidDefinitionError) as raised:
        parse_definition(spec(task("a", "b"), task("b", "a")))
    assert str(raised.value) == "spec.tasks: dependency cycle detected: a -> b -> a"
    assert [error.kind for error in raised.value.errors] == ["cycle"]


def test_the_shape_error_wins_over_the_graph_error() -> None:
    # malformed (a bad retries value) and cyclic at once: only the shape is reported
    document = spec(task("a", "b", retries=-1), task("b", "a"))
    assert verdict(document) == [("schema", "spec.tasks[0].retries")]


def test_a_cycle_at_the_end_of_a_3000_task_chain_is_found() -> None:
    keys = [f"t{index:04d}" for index in range(3000)]
    tasks = [
        task(key, keys[index - 1]) if index else task(key, keys[-1])
        for index, key in enumerate(keys)
    ]
    errors = validate_spec(spec(*tasks))
    assert [error.kind for error in errors] == ["cycle"]
    assert errors[0].message.startswith("dependency cycle detected: t0000 -> t2999 -> t2998")
    assert errors[0].message.endswith("t0001 -> t0000")


@pytest.mark.parametrize(
    ("tasks", "expected"),
    [
        # a compensator declares no dependsOn
        (
            [task("a"), task("u", "a", compensateFor="a")],
            [("compensation", "spec.tasks[1].dependsOn")],
        ),
        # it does not compensate itself
        (
            [task("a"), task("u", compensateFor="u")],
            [("compensation", "spec.tasks[1].compensateFor")],
        ),
        # nor another compensator
        (
            [task("a"), task("u", compensateFor="a"), task("v", compensateFor="u")],
            [("compensation", "spec.tasks[2].compensateFor")],
        ),
        # it names an existing forward task
        (
            [task("a"), task("u", compensateFor="ghost")],
            [("compensation", "spec.tasks[1].compensateFor")],
        ),
        # at most one compensator per forward task
        (
            [task("a"), task("u", compensateFor="a"), task("v", compensateFor="a")],
            [("compensation", "spec.tasks[2].compensateFor")],
        ),
        # no forward task depends on a compensator
        (
            [task("a"), task("u", compensateFor="a"), task("b", "u")],
            [("compensation", "spec.tasks[2].dependsOn[0]")],
        ),
    ],
)
def test_compensation_rules(tasks: list[dict[str, Any]], expected: list[tuple[str, str]]) -> None:
    assert verdict(spec(*tasks)) == expected


def test_compensation_rules_accept_the_normal_case() -> None:
    document = spec(
        task("a"),
        task("b", "a"),
        task("undo-a", compensateFor="a"),
        task("undo-b", compensateFor="b", dependsOn=[]),
    )
    assert validate_spec(document) == []


def test_every_graph_error_is_reported_in_document_order_with_the_cycle_last() -> None:
    document = spec(
        task("a", "c"),
        task("b", "a", "ghost", type="java"),
        task("c", "b"),
        task("u", compensateFor="nobody"),
    )
    assert verdict(document) == [
        ("unknown-task-type", "spec.tasks[1].type"),
        ("unknown-dependency", "spec.tasks[1].dependsOn[1]"),
        ("compensation", "spec.tasks[3].compensateFor"),
        ("cycle", "spec.tasks"),
    ]
    assert validate_spec(document)[-1].message == "dependency cycle detected: a -> c -> b -> a"


def test_errors_carry_kind_path_and_message() -> None:
    error = validate_spec(spec(task("a", "ghost")))[0]
    assert isinstance(error, DefinitionError)
    assert error.to_dict() == {
        "kind": "unknown-dependency",
        "path": "spec.tasks[0].dependsOn[0]",
        "message": 'task "a" depends on unknown task "ghost"',
    }


def test_integral_floats_are_integers_as_the_schema_says() -> None:
    definition = parse_definition(spec(task("a", retries=2.0)))
    assert definition.task("a").retries == 2
    assert isinstance(definition.task("a").retries, int)


def test_plan_of_a_definition() -> None:
    definition = parse_definition(
        spec(
            task("load", "clean", "enrich"),
            task("enrich", "extract"),
            task("clean", "extract"),
            task("extract"),
            task("undo-extract", compensateFor="extract"),
            task("undo-clean", compensateFor="clean"),
        )
    )
    schedule = plan(definition)
    assert schedule.order == ("extract", "clean", "enrich", "load")
    assert schedule.levels == (("extract",), ("clean", "enrich"), ("load",))
    assert dict(schedule.compensation) == {"clean": "undo-clean", "extract": "undo-extract"}
    assert schedule.to_dict() == {
        "order": ["extract", "clean", "enrich", "load"],
        "levels": [["extract"], ["clean", "enrich"], ["load"]],
        "compensation": {"clean": "undo-clean", "extract": "undo-extract"},
    }
    compensators = {key: task.key for key, task in definition.compensators.items()}
    assert definition.graph.compensation_order({"extract", "clean", "enrich"}, compensators) == (
        "undo-clean",
        "undo-extract",
    )


def test_a_definition_conflict_says_publish_a_new_version() -> None:
    error = DefinitionConflictError(
        namespace="team-a",
        workflow="etl",
        version=3,
        existing_fingerprint="sha256:aaa",
        new_fingerprint="sha256:bbb",
    )
    text = str(error)
    assert "version 3" in text and "sha256:aaa" in text and "sha256:bbb" in text
    assert "publish a new version" in text
    assert error.workflow == "etl" and error.namespace == "team-a"


def test_models_can_be_read_without_the_validator_for_trusted_documents() -> None:
    definition = DefinitionSpec.model_validate(spec(task("a")))
    assert definition.graph.topological_order() == ("a",)
