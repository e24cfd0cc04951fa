"""Admission against what is published and what is only persisted: immutability across both,
the next-integer rule for new versions, runs of a definition applied with them, and the caps
on a run's parameters."""

from __future__ import annotations

import pytest

from flowforge.admission.review import (
    CODE_CONFLICT,
    CODE_INVALID,
    JsonPatchOperation,
    decide_definition,
    decide_run,
    decide_run_mutation,
)
from flowforge.domain.caps import MAX_PARAMETER_VALUE_LENGTH, MAX_PARAMETERS
from flowforge.domain.validation import parse_definition
from tests.unit.admission_fakes import InMemoryRegistry, create, definition_spec, wrap


@pytest.fixture
def registry() -> InMemoryRegistry:
    return InMemoryRegistry()


async def test_a_version_skip_is_refused_naming_the_field_not_the_stored_versions(
    registry: InMemoryRegistry,
) -> None:
    for version in (1, 2, 3):
        registry.publish(definition_spec(version=version))
    for dry_run in (False, True):
        skip = create(
            wrap("WorkflowDefinition", definition_spec(version=2**31 - 1)), dry_run=dry_run
        )
        verdict = await decide_definition(skip, registry)
        assert not verdict.allowed
        assert verdict.code == CODE_INVALID
        assert verdict.message.startswith("spec.version: version 2147483647 skips versions")
        # what is wrong, not which versions are stored (nor the next one, which says it)
        assert verdict.message == (
            "spec.version: version 2147483647 skips versions; a new version must be the next "
            "integer after the newest (`kubectl get workflowdefinitions` lists them)"
        )
    assert (
        await decide_definition(
            create(wrap("WorkflowDefinition", definition_spec(version=4))), registry
        )
    ).allowed
    assert sorted(registry.published) == [("team-a", "etl", v) for v in (1, 2, 3)]


async def test_a_new_workflow_starts_at_version_1(registry: InMemoryRegistry) -> None:
    verdict = await decide_definition(
        create(wrap("WorkflowDefinition", definition_spec(version=5))), registry
    )
    assert not verdict.allowed
    assert "has no version yet" in verdict.message
    assert "publish version 1" in verdict.message


async def test_an_old_version_never_published_is_refused(registry: InMemoryRegistry) -> None:
    registry.publish(definition_spec(version=1))
    registry.publish(definition_spec(version=3))
    verdict = await decide_definition(
        create(wrap("WorkflowDefinition", definition_spec(version=2))), registry
    )
    assert not verdict.allowed
    assert "version 2 was never published and is not the next one" in verdict.message
    assert "3" not in verdict.message


async def test_persisted_but_unpublished_versions_count(registry: InMemoryRegistry) -> None:
    """One `kubectl apply` of v1, v2 and v3: none is published yet when v2 and v3 arrive."""
    registry.persist("etl-v1", definition_spec(version=1))
    registry.persist("etl-v2", definition_spec(version=2))
    verdict = await decide_definition(
        create(wrap("WorkflowDefinition", definition_spec(version=3))), registry
    )
    assert verdict.allowed, verdict.message


async def test_other_content_for_a_persisted_version_is_refused(
    registry: InMemoryRegistry,
) -> None:
    registry.persist("etl-v1", definition_spec(version=1))
    same = wrap("WorkflowDefinition", definition_spec(version=1), name="etl-copy")
    assert (await decide_definition(create(same), registry)).allowed
    other = wrap("WorkflowDefinition", definition_spec(version=1, image="attacker/img"))
    verdict = await decide_definition(create(other), registry)
    assert not verdict.allowed
    assert verdict.code == CODE_CONFLICT
    assert "already held by another WorkflowDefinition object" in verdict.message
    # neither the other object's name nor its content's fingerprint is repeated
    held = parse_definition(definition_spec(version=1)).fingerprint
    assert "etl-v1" not in verdict.message and held[:12] not in verdict.message
    assert "publish a new version" in verdict.message


async def test_a_run_applied_with_its_definition_is_pinned_and_admitted(
    registry: InMemoryRegistry,
) -> None:
    registry.publish(definition_spec(version=1))
    registry.persist("etl-v2", definition_spec(version=2))
    run = create(wrap("WorkflowRun", {"workflow": "etl"}))
    mutation = await decide_run_mutation(run, registry)
    assert mutation.patch == (JsonPatchOperation(op="add", path="/spec/version", value=2),)
    pinned = create(wrap("WorkflowRun", {"workflow": "etl", "version": 2}))
    assert (await decide_run(pinned, registry)).allowed


async def test_objects_of_another_namespace_are_not_seen(registry: InMemoryRegistry) -> None:
    registry.persist("etl-v1", definition_spec(version=1), namespace="team-b")
    verdict = await decide_run(
        create(wrap("WorkflowRun", {"workflow": "etl", "version": 1})), registry
    )
    assert not verdict.allowed
    assert "has no published version in namespace 'team-a'" in verdict.message


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ({"a-b": "1", "a_b": "2"}, "spec.parameters[a_b]", "FLOWFORGE_PARAM_A_B"),
        ({"Date": "1", "date": "2"}, "spec.parameters[date]", "FLOWFORGE_PARAM_DATE"),
        ({"--": "1"}, "spec.parameters[--]", "at least one letter or digit"),
        ({f"p{i}": "x" for i in range(MAX_PARAMETERS + 1)}, "spec.parameters", "at most 64"),
        ({"big": "x" * (MAX_PARAMETER_VALUE_LENGTH + 1)}, "spec.parameters[big]", "at most 4096"),
        ({f"p{i}": "x" * 4000 for i in range(5)}, "spec.parameters", "total"),
    ],
    ids=["dash-underscore", "case", "no-letters", "count", "value", "total"],
)
async def test_parameters_over_the_caps_are_refused_with_the_field(
    registry: InMemoryRegistry, parameters: dict[str, str], path: str, words: str
) -> None:
    registry.publish(definition_spec(version=1))
    run = create(wrap("WorkflowRun", {"workflow": "etl", "version": 1, "parameters": parameters}))
    verdict = await decide_run(run, registry)
    assert not verdict.allowed
    assert verdict.code == CODE_INVALID
    line = next(line for line in verdict.message.splitlines() if line.startswith(path))
    assert words in line, verdict.message
