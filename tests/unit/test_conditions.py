"""``when`` (``domain/conditions.py``) and a run's expansion (``domain/expansion.py``), as
admission, ``flowforge plan -p`` and the SDK see them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flowforge.admission.review import decide_run_limits
from flowforge.domain.conditions import (
    MAX_NESTING,
    ConditionError,
    evaluate,
    referenced_parameters,
)
from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.expansion import expand
from flowforge.domain.planning import plan
from flowforge.domain.projection import TaskCounts
from flowforge.domain.spec_schema import MAX_EXPRESSION_LENGTH
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.sdk import chain, task, workflow
from tests.support.cli import flowforge
from tests.unit.admission_fakes import create, wrap
from tests.unit.domain_builders import spec, succeeded_status
from tests.unit.domain_builders import task as spec_task

PARAMETERS: list[dict[str, Any]] = [
    {"name": "mode", "type": "string", "enum": ["full", "incremental"], "default": "incremental"},
    {"name": "regions", "type": "array", "items": {"type": "string"}, "default": ["eu"]},
    {"name": "batchSize", "type": "integer", "minimum": 1, "default": 500},
    {"name": "dryRun", "type": "boolean", "default": False},
]


def pipeline(*tasks: dict[str, Any]) -> dict[str, Any]:
    return spec(*tasks, parameters=PARAMETERS)


# extract -> migrate (full runs only) -> load; undo-migrate compensates migrate
MIGRATE = pipeline(
    spec_task("extract"),
    spec_task("migrate", "extract", when="params.mode == 'full'"),
    spec_task("load", "migrate"),
    spec_task("undo-migrate", compensateFor="migrate"),
)


def when_errors(expression: str) -> dict[str, str]:
    document = pipeline(spec_task("extract", when=expression))
    return {error.path: error.message for error in validate_spec(document)}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("params.modee == 'full'", "unknown parameter modee"),
        ("params['regoins'].size() > 0", "unknown parameter regoins"),
        ("params.mode > 3", "type error"),
        ("params.batchSize + 1", "must be a boolean, is int"),
        ("mode == 'full'", "names mode; a condition reads only params.NAME"),
        ("params.mode ==", "not a CEL expression"),
        ("params.regions.all(r, r != '') && params.regions.exists(r, true)", "comprehensions"),
        ("(" * (MAX_NESTING + 1) + "true" + ")" * (MAX_NESTING + 1), "nests brackets"),
    ],
    ids=repr,
)
def test_a_condition_that_does_not_type_check_is_refused_with_its_field(
    expression: str, message: str
) -> None:
    errors = when_errors(expression)
    assert list(errors) == ["spec.tasks[0].when"], errors
    assert message in errors["spec.tasks[0].when"]


def test_conditions_that_check() -> None:
    for expression in (
        "params.mode == 'full'",
        "params.dryRun || params.batchSize > 100",
        "'eu' in params.regions && params.regions.size() < 3",
        "params.regions.exists(r, r.startsWith('us'))",
        "params['mode'] != 'incremental'",
        "params.mode == 'params.nothing'",  # a name inside a string literal is text
    ):
        assert when_errors(expression) == {}, expression


def test_a_long_expression_is_refused_by_the_shape() -> None:
    errors = when_errors("true && " * (MAX_EXPRESSION_LENGTH // 8) + "true")
    assert "spec.tasks[0].when" in errors


def test_when_needs_declarations_and_a_forward_task() -> None:
    undeclared = spec(spec_task("extract", when="params.mode == 'full'"))
    assert [e.path for e in validate_spec(undeclared)] == ["spec.tasks[0].when"]
    on_compensator = pipeline(
        spec_task("extract"), spec_task("undo", compensateFor="extract", when="true")
    )
    assert [e.path for e in validate_spec(on_compensator)] == ["spec.tasks[1].when"]


def test_referenced_parameters_reads_fields_and_indexes_but_not_strings() -> None:
    assert referenced_parameters("params.a == 'params.b' && params [\"c\"] > 1") == {"a", "c"}


def test_evaluate_names_the_field_when_a_parameter_has_no_value() -> None:
    with pytest.raises(ConditionError) as caught:
        evaluate("params.owner == 'x'", {}, path="spec.tasks[2].when")
    assert caught.value.path == "spec.tasks[2].when"
    assert "has(params.owner)" in caught.value.message


def test_a_false_condition_skips_the_task_and_its_dependents_wait_for_its_upstreams() -> None:
    definition = parse_definition(MIGRATE)
    incremental = expand(definition, {})
    assert incremental.skipped == {"migrate"}
    assert dict(incremental.dependencies) == {"extract": (), "load": ("extract",)}
    assert incremental.levels() == [["extract"], ["load"]]
    assert incremental.parameters["batchSize"] == 500
    full = expand(definition, {"mode": "full"})
    assert full.skipped == frozenset()
    assert full.levels() == [["extract"], ["migrate"], ["load"]]


def test_the_plan_of_a_run_marks_skipped_tasks_and_keeps_their_compensators_out() -> None:
    schedule = plan(parse_definition(MIGRATE))
    assert schedule.to_dict() == {
        "order": ["extract", "load"],
        "levels": [["extract"], ["load"]],
        "compensation": {},
        "parameters": {
            "mode": "incremental",
            "regions": ["eu"],
            "batchSize": 500,
            "dryRun": False,
        },
        "skipped": [
            {"task": "migrate", "reason": "ConditionFalse", "when": "params.mode == 'full'"}
        ],
    }
    assert plan(parse_definition(MIGRATE), {"mode": "full"}).compensation == {
        "migrate": "undo-migrate"
    }


def test_the_fingerprint_covers_when() -> None:
    without = pipeline(spec_task("extract"), spec_task("load", "extract"))
    with_when = pipeline(spec_task("extract"), spec_task("load", "extract", when="true"))
    assert parse_definition(without).fingerprint != parse_definition(with_when).fingerprint


async def test_admission_refuses_a_run_whose_condition_cannot_be_decided() -> None:
    # owner is optional, without a default: a run that leaves it out cannot read it
    document = spec(
        spec_task("extract"),
        spec_task("load", "extract", when="params.owner == 'ops'"),
        parameters=[*PARAMETERS, {"name": "owner", "type": "string"}],
    )
    definition = parse_definition(document)
    run = wrap("WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {}})
    verdict = await decide_run_limits(create(run), definition=definition, runs=None)
    assert not verdict.allowed and verdict.code == 422
    assert "spec.tasks[1].when: parameter 'owner' has no value" in verdict.message
    given = wrap("WorkflowRun", {"workflow": "etl", "version": 3, "parameters": {"owner": "a"}})
    assert (await decide_run_limits(create(given), definition=definition, runs=None)).allowed


# --- the expansion's graph: a property test against networkx ----------------------------


@st.composite
def conditional_dags(draw: st.DrawFn) -> tuple[dict[str, Any], set[str]]:
    """A random DAG whose tasks are each guarded by one boolean parameter that is false
    (skipped) or true, and the set of tasks the parameters skip."""
    size = draw(st.integers(min_value=1, max_value=12))
    keys = [f"t{index}" for index in range(size)]
    tasks, skipped, parameters = [], set(), []
    for index, key in enumerate(keys):
        upstreams = draw(st.lists(st.sampled_from(keys[:index]), unique=True)) if index else []
        guarded = draw(st.booleans())
        fields: dict[str, Any] = {}
        if guarded:
            value = draw(st.booleans())
            parameters.append({"name": f"p{index}", "type": "boolean", "default": value})
            fields["when"] = f"params.p{index}"
            if not value:
                skipped.add(key)
        tasks.append(spec_task(key, *upstreams, **fields))
    parameters.append({"name": "unused", "type": "string", "default": ""})
    return spec(*tasks, parameters=parameters), skipped


@settings(max_examples=60, deadline=None)
@given(case=conditional_dags())
def test_the_expansion_keeps_every_order_between_the_tasks_that_run(
    case: tuple[dict[str, Any], set[str]],
) -> None:
    """A task that runs waits, in the run, for exactly the tasks that run and that it waited
    for in the definition, directly or through skipped tasks: no order is lost, none added."""
    document, skipped = case
    definition = parse_definition(document)
    expansion = expand(definition, {})
    assert expansion.skipped == skipped
    declared = nx.DiGraph()
    declared.add_nodes_from(task.key for task in definition.forward_tasks)
    declared.add_edges_from(
        (upstream, task.key) for task in definition.forward_tasks for upstream in task.depends_on
    )
    expanded = nx.DiGraph()
    expanded.add_nodes_from(expansion.dependencies)
    expanded.add_edges_from(
        (upstream, key)
        for key, upstreams in expansion.dependencies.items()
        for upstream in upstreams
    )
    running = set(declared) - skipped
    assert set(expanded) == running
    for task_key in running:
        before_declared = nx.ancestors(declared, task_key) & running
        assert nx.ancestors(expanded, task_key) == before_declared
    assert expand(definition, expansion.parameters) == expansion


# --- flowforge plan -p and the SDK ---------------------------------------------------------


@pytest.fixture
def migrate_file(tmp_path: Path) -> Path:
    document = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": "etl-v3"},
        "spec": pipeline(
            spec_task("extract"),
            spec_task("migrate", "extract", when="params.mode == 'full'"),
            spec_task(
                "per-region", "migrate", when="'us' in params.regions && params.batchSize > 10"
            ),
        ),
    }
    (tmp_path / "etl.yaml").write_text(yaml.safe_dump(document))
    return tmp_path


def test_plan_with_parameters_prints_the_run(migrate_file: Path) -> None:
    result = flowforge(
        "plan", "etl.yaml", "-p", "mode=full", "-p", 'regions=["eu","us"]', cwd=migrate_file
    )
    assert result.returncode == 0, result.stderr
    assert "level 2: per-region" in result.stdout
    assert "skipped" not in result.stdout
    assert '"regions": ["eu", "us"]' in result.stdout

    default = flowforge("plan", "etl.yaml", "-o", "json", cwd=migrate_file)
    assert default.returncode == 0, default.stderr
    assert json.loads(default.stdout)["skipped"] == [
        {"task": "migrate", "reason": "ConditionFalse", "when": "params.mode == 'full'"},
        {
            "task": "per-region",
            "reason": "ConditionFalse",
            "when": "'us' in params.regions && params.batchSize > 10",
        },
    ]
    text = flowforge("plan", "etl.yaml", cwd=migrate_file).stdout
    assert "skipped migrate: ConditionFalse (when params.mode == 'full')" in text
    wide = flowforge("plan", "etl.yaml", "-o", "wide", cwd=migrate_file).stdout
    assert [line.split()[:2] for line in wide.splitlines()[1:]] == [
        ["extract", "0"],
        ["migrate", "ConditionFalse"],
        ["per-region", "ConditionFalse"],
    ]


def test_plan_refuses_parameters_as_admission_would(migrate_file: Path) -> None:
    result = flowforge("plan", "etl.yaml", "-p", "regoins=[]", "-p", "mode=x", cwd=migrate_file)
    assert result.returncode == 1
    assert "spec.parameters.regoins: unknown parameter" in result.stderr
    assert "spec.parameters.mode: must be one of" in result.stderr
    not_json = flowforge("plan", "etl.yaml", "-p", "batchSize=many", cwd=migrate_file)
    assert not_json.returncode == 2
    assert "batchSize" in not_json.stderr


def test_validate_type_checks_conditions_offline(migrate_file: Path) -> None:
    document = yaml.safe_load((migrate_file / "etl.yaml").read_text())
    document["spec"]["tasks"][1]["when"] = "params.mode > 1"
    (migrate_file / "bad.yaml").write_text(yaml.safe_dump(document))
    result = flowforge("validate", "bad.yaml", cwd=migrate_file)
    assert result.returncode == 1
    assert "spec.tasks[1].when" in result.stdout + result.stderr


def test_the_sdk_writes_when_and_the_declarations() -> None:
    document = workflow(
        "etl",
        1,
        body=chain(
            task("extract", "step"),
            task("migrate", "step", when="params.mode == 'full'"),
            task("load", "step"),
        ),
        task_types={"step": {"image": "busybox:1.36"}},
        parameters=[{"name": "mode", "type": "string", "default": "incremental"}],
    )
    assert document["spec"]["tasks"][1]["when"] == "params.mode == 'full'"
    assert document["spec"]["parameters"] == [
        {"name": "mode", "type": "string", "default": "incremental"}
    ]
    assert expand(parse_definition(document["spec"]), {}).skipped == {"migrate"}
    with pytest.raises(InvalidDefinitionError):
        workflow(
            "etl",
            1,
            body=task("extract", "step", when="params.mode == 'full'"),
            task_types={"step": {"image": "busybox:1.36"}},
        )


def test_the_status_counts_condition_skips_apart_from_skips_after_a_failure() -> None:
    status = succeeded_status(TaskCounts(total=3, succeeded=2, skipped=1, condition_false=1))
    assert status["counts"]["skipped"] == 0
    assert status["counts"]["conditionSkipped"] == 1
    assert status["progress"] == "2/2"
    assert status["message"] == "all 2 tasks succeeded; 1 skipped (ConditionFalse)"
