"""Admission decisions, without kopf or HTTP, against an in-memory definition registry.

The registry here is read-only for admission, as the real one is: published definitions (what
the operator published) and persisted objects (what the apiserver holds) are set up by the
tests themselves. The real path (PostgreSQL and the apiserver) is exercised through the
apiserver in tests/cluster/test_webhooks.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flowforge.admission.review import (
    CODE_CONFLICT,
    CODE_FORBIDDEN,
    CODE_INVALID,
    CODE_NOT_FOUND,
    MAX_LISTED_ERRORS,
    AdmissionRequest,
    JsonPatchOperation,
    decide_definition,
    decide_run,
    decide_run_mutation,
    describe_errors,
)
from flowforge.domain.errors import DefinitionSchemaError
from tests.unit.admission_fakes import (
    NAMESPACE,
    InMemoryRegistry,
    create,
    definition_spec,
    update,
    wrap,
)


@pytest.fixture
def registry() -> InMemoryRegistry:
    return InMemoryRegistry()


# --- WorkflowDefinition CREATE ------------------------------------------------------------------


async def test_valid_definition_is_admitted_and_nothing_is_written(
    registry: InMemoryRegistry,
) -> None:
    verdict = await decide_definition(
        create(wrap("WorkflowDefinition", definition_spec())), registry
    )
    assert verdict.allowed
    assert registry.published == {}


async def test_dry_run_admits_without_publishing(registry: InMemoryRegistry) -> None:
    obj = wrap("WorkflowDefinition", definition_spec())
    verdict = await decide_definition(create(obj, dry_run=True), registry)
    assert verdict.allowed
    assert registry.published == {}


INVALID_SPECS: list[tuple[str, Any, str]] = [
    ("missing spec", None, "spec"),
    ("tasks not a list", {**definition_spec(), "tasks": "nope"}, "spec.tasks"),
    (
        "duplicate key",
        {**definition_spec(), "tasks": [{"key": "a", "type": "py"}, {"key": "a", "type": "py"}]},
        "spec.tasks[1].key",
    ),
    (
        "unknown task type",
        {**definition_spec(), "tasks": [{"key": "a", "type": "go"}]},
        "spec.tasks[0].type",
    ),
    (
        "unknown dependency",
        {**definition_spec(), "tasks": [{"key": "a", "type": "py", "dependsOn": ["zz"]}]},
        "spec.tasks[0].dependsOn[0]",
    ),
    (
        "cycle",
        {
            **definition_spec(),
            "tasks": [
                {"key": "a", "type": "py", "dependsOn": ["b"]},
                {"key": "b", "type": "py", "dependsOn": ["a"]},
            ],
        },
        "spec.tasks",
    ),
    (
        "compensator of a missing task",
        {
            **definition_spec(),
            "tasks": [{"key": "a", "type": "py"}, {"key": "u", "type": "py", "compensateFor": "z"}],
        },
        "spec.tasks[1].compensateFor",
    ),
]


@pytest.mark.parametrize(("case", "spec", "path"), INVALID_SPECS, ids=[c[0] for c in INVALID_SPECS])
async def test_invalid_definition_is_denied_with_its_field_path(
    registry: InMemoryRegistry, case: str, spec: Any, path: str
) -> None:
    for dry_run in (False, True):
        verdict = await decide_definition(
            create(wrap("WorkflowDefinition", spec), dry_run=dry_run), registry
        )
        assert not verdict.allowed, case
        assert verdict.code == CODE_INVALID
        assert f"\n{path}" in verdict.message or verdict.message.startswith(path), verdict.message
    assert registry.published == {}


async def test_denial_lists_every_error_one_per_line(registry: InMemoryRegistry) -> None:
    spec = {
        **definition_spec(),
        "tasks": [
            {"key": "a", "type": "go"},
            {"key": "b", "type": "py", "dependsOn": ["nope"]},
        ],
    }
    verdict = await decide_definition(create(wrap("WorkflowDefinition", spec)), registry)
    lines = verdict.message.splitlines()
    assert lines[0] == "invalid WorkflowDefinition (2 errors):"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "spec.tasks[0].type",
        "spec.tasks[1].dependsOn[0]",
    ]


async def test_a_flood_of_errors_is_capped(registry: InMemoryRegistry) -> None:
    tasks = [{"key": f"t{i}", "type": "missing"} for i in range(MAX_LISTED_ERRORS + 25)]
    spec = {**definition_spec(), "tasks": tasks}
    verdict = await decide_definition(create(wrap("WorkflowDefinition", spec)), registry)
    lines = verdict.message.splitlines()
    assert len(lines) == 1 + MAX_LISTED_ERRORS + 1
    assert lines[-1] == "... and 25 more errors"


async def test_identical_content_is_admitted_again(registry: InMemoryRegistry) -> None:
    obj = wrap("WorkflowDefinition", definition_spec())
    registry.publish(obj["spec"])
    assert (await decide_definition(create(obj), registry)).allowed
    reordered = copy.deepcopy(obj)
    reordered["spec"]["tasks"].reverse()
    reordered["metadata"]["name"] = "another-name"
    assert (await decide_definition(create(reordered), registry)).allowed
    assert (await decide_definition(create(reordered, dry_run=True), registry)).allowed
    assert len(registry.published) == 1


async def test_changed_content_under_a_published_version_is_denied(
    registry: InMemoryRegistry,
) -> None:
    registry.publish(definition_spec())
    changed = wrap("WorkflowDefinition", definition_spec(image="python:3.13-slim"))
    for dry_run in (False, True):
        verdict = await decide_definition(create(changed, dry_run=dry_run), registry)
        assert not verdict.allowed
        assert verdict.code == CODE_CONFLICT
        assert "version 1" in verdict.message
        assert "publish a new version" in verdict.message
    new_version = wrap("WorkflowDefinition", definition_spec(version=2, image="python:3.13-slim"))
    assert (await decide_definition(create(new_version), registry)).allowed


async def test_same_version_in_another_namespace_is_independent(
    registry: InMemoryRegistry,
) -> None:
    registry.publish(definition_spec())
    other = AdmissionRequest(
        operation="CREATE",
        namespace="team-b",
        new_object=wrap("WorkflowDefinition", definition_spec(image="other")),
        old_object=None,
        dry_run=False,
    )
    assert (await decide_definition(other, registry)).allowed


# --- WorkflowDefinition UPDATE / DELETE ---------------------------------------------------------


async def test_metadata_changes_are_allowed(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowDefinition", definition_spec())
    new = wrap("WorkflowDefinition", definition_spec(), labels={"team": "data"})
    assert (await decide_definition(update(old, new), registry)).allowed


async def test_reordering_tasks_is_not_a_change(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowDefinition", definition_spec())
    new = copy.deepcopy(old)
    new["spec"]["tasks"].reverse()
    assert (await decide_definition(update(old, new), registry)).allowed


async def test_spec_changes_are_denied(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowDefinition", definition_spec())
    new = wrap("WorkflowDefinition", definition_spec(image="python:3.13-slim"))
    verdict = await decide_definition(update(old, new), registry)
    assert not verdict.allowed
    assert verdict.code == CODE_FORBIDDEN
    assert "version 1" in verdict.message
    assert "publish a new version" in verdict.message


async def test_an_invalid_update_reports_its_errors(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowDefinition", definition_spec())
    new = wrap("WorkflowDefinition", {**definition_spec(), "tasks": []})
    verdict = await decide_definition(update(old, new), registry)
    assert not verdict.allowed
    assert "spec.tasks" in verdict.message


async def test_delete_is_allowed(registry: InMemoryRegistry) -> None:
    request = AdmissionRequest(
        operation="DELETE",
        namespace=NAMESPACE,
        new_object=None,
        old_object=wrap("WorkflowDefinition", definition_spec()),
        dry_run=False,
    )
    assert (await decide_definition(request, registry)).allowed


# --- WorkflowRun --------------------------------------------------------------------------------


async def publish_versions(registry: InMemoryRegistry, *versions: int) -> None:
    for version in versions:
        registry.publish(definition_spec(version=version))


async def test_run_without_version_gets_the_newest_pinned(registry: InMemoryRegistry) -> None:
    await publish_versions(registry, 1, 3, 2)
    run = wrap("WorkflowRun", {"workflow": "etl", "parameters": {"date": "2026-11-30"}})
    verdict = await decide_run_mutation(create(run), registry)
    assert verdict.allowed
    assert verdict.patch == (JsonPatchOperation(op="add", path="/spec/version", value=3),)


async def test_run_with_version_is_not_mutated(registry: InMemoryRegistry) -> None:
    await publish_versions(registry, 1, 2)
    verdict = await decide_run_mutation(
        create(wrap("WorkflowRun", {"workflow": "etl", "version": 1})), registry
    )
    assert verdict.allowed
    assert verdict.patch == ()


@pytest.mark.parametrize(
    "spec", [None, "etl", {"workflow": 7}, {"workflow": "unknown"}, {}], ids=repr
)
async def test_mutation_leaves_unresolvable_runs_to_validation(
    registry: InMemoryRegistry, spec: Any
) -> None:
    verdict = await decide_run_mutation(create(wrap("WorkflowRun", spec)), registry)
    assert verdict.allowed
    assert verdict.patch == ()


async def test_run_of_a_published_version_is_admitted(registry: InMemoryRegistry) -> None:
    await publish_versions(registry, 1, 2)
    run = wrap("WorkflowRun", {"workflow": "etl", "version": 2})
    assert (await decide_run(create(run), registry)).allowed


async def test_run_of_an_unpublished_version_names_the_field_not_the_published_ones(
    registry: InMemoryRegistry,
) -> None:
    await publish_versions(registry, 2, 1)
    verdict = await decide_run(
        create(wrap("WorkflowRun", {"workflow": "etl", "version": 7})), registry
    )
    assert not verdict.allowed
    assert verdict.code == CODE_NOT_FOUND
    assert "version 7 is not published" in verdict.message
    assert verdict.message.startswith("spec.version: ")
    # what is stored is not repeated to whoever asks
    assert "published versions" not in verdict.message and "1, 2" not in verdict.message


async def test_run_of_an_unknown_workflow_is_denied(registry: InMemoryRegistry) -> None:
    verdict = await decide_run(
        create(wrap("WorkflowRun", {"workflow": "nothing", "version": 1})), registry
    )
    assert not verdict.allowed
    assert "'nothing' has no published version" in verdict.message


async def test_run_without_version_reaching_validation_is_denied(
    registry: InMemoryRegistry,
) -> None:
    await publish_versions(registry, 1)
    verdict = await decide_run(create(wrap("WorkflowRun", {"workflow": "etl"})), registry)
    assert not verdict.allowed
    assert verdict.message.startswith("spec.version")


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (None, "spec"),
        ({"version": 1}, "spec.workflow"),
        ({"workflow": "etl", "version": "1"}, "spec.version"),
        ({"workflow": "etl", "version": 0}, "spec.version"),
        ({"workflow": "etl", "version": True}, "spec.version"),
        # a value's type is judged against its definition (test_parameters.py); its size here
        ({"workflow": "etl", "parameters": {"a": ["x" * 5000]}}, "spec.parameters[a]"),
        ({"workflow": "etl", "cancel": "yes"}, "spec.cancel"),
        ({"workflow": "etl", "extra": 1}, "spec.extra"),
    ],
    ids=repr,
)
async def test_malformed_run_is_denied_with_its_path(
    registry: InMemoryRegistry, spec: Any, path: str
) -> None:
    verdict = await decide_run(create(wrap("WorkflowRun", spec)), registry)
    assert not verdict.allowed
    assert verdict.code == CODE_INVALID
    assert f"\n{path}:" in verdict.message


async def test_only_cancel_may_change_on_a_run(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "parameters": {"a": "1"}})
    cancelled = copy.deepcopy(old)
    cancelled["spec"]["cancel"] = True
    assert (await decide_run(update(old, cancelled), registry)).allowed

    relabelled = wrap("WorkflowRun", old["spec"], labels={"x": "y"})
    assert (await decide_run(update(old, relabelled), registry)).allowed

    repinned = copy.deepcopy(old)
    repinned["spec"]["version"] = 2
    repinned["spec"]["parameters"] = {"a": "2"}
    verdict = await decide_run(update(old, repinned), registry)
    assert not verdict.allowed
    assert verdict.message.startswith("spec.parameters, spec.version: cannot change")


async def test_a_cancelled_run_cannot_be_resumed(registry: InMemoryRegistry) -> None:
    old = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "cancel": True})
    resumed = wrap("WorkflowRun", {"workflow": "etl", "version": 1, "cancel": False})
    verdict = await decide_run(update(old, resumed), registry)
    assert not verdict.allowed
    assert "cannot be resumed" in verdict.message


def test_an_error_reported_twice_is_listed_once() -> None:
    twice = [DefinitionSchemaError("missing required field", path="spec")] * 2
    assert (
        describe_errors(twice)
        == "invalid WorkflowDefinition (1 error):\nspec: missing required field"
    )
