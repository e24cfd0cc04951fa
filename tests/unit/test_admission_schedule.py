"""Admission of a WorkflowSchedule (`admission/schedule.py`): refusals name the
field, and the author meets the checks a run's author would."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowforge.admission.schedule import decide_schedule, decide_schedule_mutation
from flowforge.domain.validation import parse_definition
from tests.unit.admission_fakes import (
    ALICE,
    JOBS,
    POLICY,
    FakeAuthorizer,
    InMemoryRegistry,
    checks,
    create,
    definition_spec,
    wrap,
)


def schedule(**fields: Any) -> dict[str, Any]:
    return wrap("WorkflowSchedule", {"workflow": "etl", "schedule": "@every 30s", **fields})


def registry() -> InMemoryRegistry:
    found = InMemoryRegistry()
    found.publish(definition_spec())
    return found


async def decide(obj: dict[str, Any], *, granted: FakeAuthorizer | None = None) -> Any:
    stored = parse_definition(definition_spec())
    access = checks(granted or FakeAuthorizer(JOBS), policies=[POLICY], stored=stored)
    return await decide_schedule(create(obj), definitions=registry(), user=ALICE, checks=access)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"schedule": "61 * * * *"}, "spec.schedule: '61 * * * *' is not a valid cron expression"),
        ({"schedule": "0 0 * *"}, "spec.schedule: '0 0 * *' is not a 5-field cron expression"),
        ({"schedule": "@every 5s"}, "spec.schedule: interval 5s is under the minimum of 10s"),
        ({"timeZone": "Europe/Atlantis"}, "spec.timeZone: unknown time zone 'Europe/Atlantis'"),
        ({"overlapPolicy": "Forbid"}, "spec.overlapPolicy:"),
        ({"catchup": {"mode": "Some"}}, "spec.catchup.mode:"),
    ],
)
async def test_a_bad_spec_is_refused_naming_the_field(
    fields: dict[str, Any], expected: str
) -> None:
    verdict = await decide(schedule(**fields))
    assert not verdict.allowed and verdict.code == 422
    assert expected in verdict.message


async def test_a_good_schedule_is_allowed_and_its_author_checked_as_a_runs() -> None:
    assert (await decide(schedule(timeZone="America/Los_Angeles", schedule="0 2 * * *"))).allowed
    refused = await decide(schedule(), granted=FakeAuthorizer())
    assert not refused.allowed
    assert "alice may not run workflow 'etl' version 1" in refused.message


async def test_the_workflow_and_version_must_exist() -> None:
    missing = await decide(schedule(workflow="nope"))
    assert not missing.allowed and "spec.workflow: workflow 'nope' has no published" in (
        missing.message
    )
    unknown = await decide(schedule(version=7))
    assert not unknown.allowed and "spec.version: workflow 'etl' version 7" in unknown.message


async def test_parameters_are_checked_against_the_definition() -> None:
    spec = definition_spec()
    spec["concurrency"] = {"maxRuns": 1, "key": ["region"]}
    stored = parse_definition(spec)
    access = checks(FakeAuthorizer(JOBS), policies=[POLICY], stored=stored)
    verdict = await decide_schedule(
        create(schedule(parameters={"mode": "x"})),
        definitions=registry(),
        user=ALICE,
        checks=access,
    )
    assert not verdict.allowed
    assert "spec.parameters.region: required" in verdict.message


async def test_a_name_too_long_for_the_run_names_is_refused() -> None:
    verdict = await decide(
        wrap("WorkflowSchedule", {"workflow": "etl", "schedule": "@every 30s"}, name="n" * 60)
    )
    assert not verdict.allowed and "metadata.name: must be at most 48" in verdict.message


async def test_the_author_is_recorded_and_cannot_be_claimed() -> None:
    request = dataclasses.replace(create(schedule()), user="alice")
    (operation,) = decide_schedule_mutation(request).patch
    assert operation.path == "/metadata/annotations/flowforge.io~1requested-by"
    assert operation.value == "alice"
    forged = schedule()
    forged["metadata"]["annotations"] = {"flowforge.io/requested-by": "root"}
    stored = parse_definition(definition_spec())
    verdict = await decide_schedule(
        dataclasses.replace(create(forged), user="alice"),
        definitions=registry(),
        user=ALICE,
        checks=checks(FakeAuthorizer(JOBS), policies=[POLICY], stored=stored),
    )
    assert not verdict.allowed
    assert "metadata.annotations[flowforge.io/requested-by]: is set by FlowForge" in (
        verdict.message
    )


async def test_parameters_are_checked_against_the_typed_declarations_as_a_runs() -> None:
    spec = definition_spec()
    spec["parameters"] = [{"name": "batchSize", "type": "integer", "minimum": 1, "default": 500}]
    definitions = InMemoryRegistry()
    definitions.publish(spec)
    access = checks(FakeAuthorizer(JOBS), policies=[POLICY], stored=parse_definition(spec))

    async def verdict_for(parameters: dict[str, Any]) -> Any:
        return await decide_schedule(
            create(schedule(parameters=parameters)),
            definitions=definitions,
            user=ALICE,
            checks=access,
        )

    mistyped = await verdict_for({"batchSize": "many"})
    assert not mistyped.allowed and "spec.parameters.batchSize:" in mistyped.message
    misspelled = await verdict_for({"batchSiez": 3})
    assert not misspelled.allowed
    assert "spec.parameters.batchSiez: unknown parameter" in misspelled.message
    assert (await verdict_for({"batchSize": 20})).allowed
    assert (await verdict_for({})).allowed  # the default fills it
