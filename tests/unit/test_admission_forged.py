"""A forged review's refusal carries none of the data stored for the objects it names.

Mallory reaches the webhook (a cluster that accepts any client) and forges reviews that
name team-a's workflow, definition objects, runs and policy. Each is refused, saying what is
wrong with the object under review and naming the field; none repeats a stored version, a
stored object's name or fingerprint, another run's phase, workflow or parameters, or a
policy's allow-list (the policy object is named instead)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowforge.admission.access import decide_definition_access
from flowforge.admission.review import (
    AdmissionRequest,
    RetrySource,
    Verdict,
    decide_definition,
    decide_run,
)
from flowforge.domain.validation import parse_definition
from flowforge.kube.access_review import UserInfo
from tests.unit.admission_fakes import (
    NAMESPACE,
    FakeAuthorizer,
    InMemoryRegistry,
    Runs,
    checks,
    create,
    definition_spec,
    wrap,
)

MALLORY = UserInfo(username="mallory", uid="u-9", groups=(), extra=())
STORED_IMAGE = "registry.team-a.internal/payroll:7"
SECRET_OBJECT = "etl-payroll-quarterly"
SECRET_PARAMETER = ("iban", "GB29-NWBK-6016-1331-9268-19")
STORED_POLICY = {
    "metadata": {"name": "p"},
    "spec": {
        "registries": ["registry.team-a.internal"],
        "serviceAccounts": ["default", "payroll-bot"],
        "nodeSelector": {"pool": ["team-a-secret-pool"]},
    },
}


def team_a() -> InMemoryRegistry:
    stored = InMemoryRegistry()
    for version in (1, 2, 3):
        stored.publish(definition_spec(version=version, image=STORED_IMAGE))
    stored.persist(SECRET_OBJECT, definition_spec(version=4, image=STORED_IMAGE))
    return stored


RUNS = Runs(
    **{
        "nightly-42": RetrySource(
            phase="Running", workflow="payroll", parameters=dict([SECRET_PARAMETER])
        )
    }
)


def forged(kind: str, spec: dict[str, Any]) -> AdmissionRequest:
    return dataclasses.replace(create(wrap(kind, spec)), user=MALLORY.username)


def assert_tells_nothing_stored(verdict: Verdict, *, field: str) -> None:
    assert not verdict.allowed
    assert field in verdict.message, verdict.message
    stored_fingerprint = parse_definition(definition_spec(version=4, image=STORED_IMAGE))
    for stored in (
        "1, 2",
        "newest is",
        "published versions",
        SECRET_OBJECT,
        STORED_IMAGE,
        "registry.team-a.internal",
        stored_fingerprint.fingerprint[:12],
        "Running",
        "payroll",
        *SECRET_PARAMETER,
        "payroll-bot",
        "team-a-secret-pool",
    ):
        assert stored not in verdict.message, (stored, verdict.message)


async def test_forged_definition_reviews_learn_no_stored_version_object_or_content() -> None:
    registry = team_a()
    skipping = await decide_definition(
        forged("WorkflowDefinition", definition_spec(version=9)), registry
    )
    assert_tells_nothing_stored(skipping, field="spec.version")
    old_gap = await decide_definition(
        forged("WorkflowDefinition", definition_spec(version=1, image="evil.io/x")), registry
    )
    assert_tells_nothing_stored(old_gap, field="spec.version")
    held = await decide_definition(
        forged("WorkflowDefinition", definition_spec(version=4, image="evil.io/x")), registry
    )
    assert_tells_nothing_stored(held, field="spec.version")


async def test_forged_run_reviews_learn_no_stored_version_nor_another_runs_data() -> None:
    registry = team_a()
    unpublished = await decide_run(
        forged("WorkflowRun", {"workflow": "etl", "version": 7}), registry, runs=RUNS
    )
    assert_tells_nothing_stored(unpublished, field="spec.version")
    retry = {"workflow": "etl", "version": 1, "retryOf": "nightly-42"}
    for parameters in ({}, {"iban": "guess"}, {"date": "d"}):
        verdict = await decide_run(
            forged("WorkflowRun", {**retry, "parameters": parameters}), registry, runs=RUNS
        )
        assert_tells_nothing_stored(verdict, field="spec.retryOf")
    running_elsewhere = Runs(
        **{"nightly-42": dataclasses.replace(RUNS.runs[(NAMESPACE, "nightly-42")], phase="Failed")}
    )
    other_workflow = await decide_run(
        forged("WorkflowRun", {**retry, "parameters": {}}), registry, runs=running_elsewhere
    )
    assert_tells_nothing_stored(other_workflow, field="spec.retryOf")


async def test_a_forged_definition_learns_no_policy_allow_list() -> None:
    spec = definition_spec(image="evil.io/miner:1")
    spec["taskTypes"]["py"].update(serviceAccountName="miner", nodeSelector={"pool": "gpu"})
    verdict = await decide_definition_access(
        forged("WorkflowDefinition", spec),
        user=MALLORY,
        checks=checks(FakeAuthorizer(), policies=[STORED_POLICY]),
    )
    assert_tells_nothing_stored(verdict, field="spec.taskTypes.py.image")
    # the policy object is named, and the field of it that refuses, for an admin to read
    for field in ("image", "serviceAccountName", "nodeSelector.pool"):
        assert f"spec.taskTypes.py.{field}: " in verdict.message
    assert "policy team-a/p" in verdict.message
    assert "its spec.registries" in verdict.message
