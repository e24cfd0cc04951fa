"""WorkflowRunActions through the operator (the fake port, the real store): a halted
rollback recovered by a person, the action's status (actor, result, message), the run's
Events; a refused action and a replayed one change nothing."""

from __future__ import annotations

import json
import uuid
from typing import Any

from flowforge.domain.run_actions import ACTOR_ANNOTATION
from flowforge.domain.states import CompensationState, RunPhase
from flowforge.operator.actions import process_action
from flowforge.operator.runs import RunContext
from tests.engine.conftest import NAMESPACE, Harness, wait_until

CHAIN: list[dict[str, Any]] = [
    {"key": "provision"},
    {"key": "deploy", "dependsOn": ["provision"]},
    {"key": "unprovision", "compensateFor": "provision"},
    {"key": "undeploy", "compensateFor": "deploy"},
]


def _action(harness: Harness, run: str, spec: dict[str, Any], *, actor: bool = True) -> Any:
    name = f"act-{uuid.uuid4().hex[:6]}"
    annotations = (
        {ACTOR_ANNOTATION: json.dumps({"username": "alice", "groups": ["ops"]})} if actor else {}
    )
    body = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowRunAction",
        "metadata": {
            "namespace": NAMESPACE,
            "name": name,
            "uid": str(uuid.uuid4()),
            "annotations": annotations,
        },
        "spec": {"run": run, **spec},
    }
    harness.kube.actions[(NAMESPACE, name)] = body
    return body


async def _finish_compensator(harness: Harness, key: str, *, succeeded: bool) -> None:
    job = harness.kube.finish(harness.job_of(key), succeeded=succeeded, exit_code=None)
    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()


async def _halted(harness: Harness, name: str) -> RunContext:
    run = await harness.start(name, CHAIN)
    await harness.finish("provision")
    await harness.finish("deploy", succeeded=False)
    # the rollback has nothing to undo for deploy (it failed): unprovision fails, halts
    await _finish_compensator(harness, "unprovision", succeeded=False)
    assert (await harness.run(run)).phase is RunPhase.FAILED
    return run


async def test_skip_then_the_run_stays_failed_and_the_status_says_who_and_why(
    harness: Harness,
) -> None:
    run = await _halted(harness, "halted")
    body = _action(
        harness,
        "halted",
        {"action": "SkipCompensator", "compensator": "unprovision", "reason": "by hand"},
    )

    await process_action(harness.engine, body)

    status = harness.kube.actions[(NAMESPACE, body["metadata"]["name"])]["status"]
    assert status["result"] == "Accepted" and "by hand" in status["message"]
    assert status["actor"] == {"username": "alice", "groups": ["ops"]}
    assert (await harness.states(run))["unprovision"] == CompensationState.SKIPPED
    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert "ActionAccepted" in harness.kube.reasons()
    assert "RollbackCompleted" in harness.kube.reasons()

    def compensating() -> dict[str, Any]:
        conditions = (harness.kube.runs[(NAMESPACE, "halted")].get("status") or {}).get(
            "conditions"
        ) or []
        return next((c for c in conditions if c["type"] == "Compensating"), {})

    await wait_until(
        lambda: compensating().get("reason") == "RolledBackAfterAction",
        what="the run's conditions say a person finished the rollback",
    )
    assert "SkipCompensator of unprovision by alice: by hand" in compensating()["message"]
    # processed: its next watch event (its own status patch) changes nothing
    before = list(harness.kube.events)
    await process_action(
        harness.engine, harness.kube.actions[(NAMESPACE, body["metadata"]["name"])]
    )
    assert harness.kube.events == before


async def test_retry_creates_the_compensators_job_again_and_the_rollback_completes(
    harness: Harness,
) -> None:
    run = await _halted(harness, "retried")
    body = _action(harness, "retried", {"action": "RetryCompensator", "compensator": "unprovision"})

    await process_action(harness.engine, body)

    assert harness.roles_created()[-1] == ("compensation", "unprovision")
    assert "-c-unprovision-2-" in harness.kube.created[-1]
    job = harness.kube.finish(harness.kube.created[-1], succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    await harness.settle_background()
    assert (await harness.states(run))["unprovision"] == CompensationState.SUCCEEDED
    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert "RollbackCompleted" in harness.kube.reasons()


async def test_an_action_on_a_run_that_is_not_halted_is_refused(harness: Harness) -> None:
    run = await harness.start("busy", CHAIN)
    body = _action(harness, "busy", {"action": "RetryCompensator", "compensator": "undeploy"})

    await process_action(harness.engine, body)

    status = harness.kube.actions[(NAMESPACE, body["metadata"]["name"])]["status"]
    assert status["result"] == "Refused" and "not halted" in status["message"]
    assert (await harness.run(run)).phase is RunPhase.RUNNING
    assert "ActionRefused" in harness.kube.reasons()


async def test_an_action_without_a_recorded_actor_or_run_is_refused(harness: Harness) -> None:
    unsigned = _action(
        harness, "x", {"action": "RetryCompensator", "compensator": "u"}, actor=False
    )
    missing = _action(harness, "nowhere", {"action": "RetryCompensator", "compensator": "u"})

    await process_action(harness.engine, unsigned)
    await process_action(harness.engine, missing)

    statuses = [
        harness.kube.actions[(NAMESPACE, body["metadata"]["name"])]["status"]
        for body in (unsigned, missing)
    ]
    assert [s["result"] for s in statuses] == ["Refused", "Refused"]
    assert "no actor" in statuses[0]["message"] and "actor" not in statuses[0]
    assert 'no WorkflowRun "nowhere"' in statuses[1]["message"]


async def test_a_paused_run_creates_no_job_until_resumed_and_shows_it_is_paused(
    harness: Harness,
) -> None:
    run = await harness.start("held", CHAIN)
    await process_action(harness.engine, _action(harness, "held", {"action": "Pause"}))
    created = len(harness.kube.created)

    await harness.finish("provision")  # running when paused: it finishes, deploy waits

    assert len(harness.kube.created) == created
    await wait_until(
        lambda: any(
            condition["type"] == "Paused" and condition["status"] == "True"
            for condition in (harness.kube.runs[(NAMESPACE, "held")].get("status") or {}).get(
                "conditions", []
            )
        ),
        what="the run's status says it is paused",
    )
    shown = harness.kube.runs[(NAMESPACE, "held")]["status"]
    reasons = {condition["type"]: condition["reason"] for condition in shown["conditions"]}
    assert reasons["Reconciling"] == "Paused"
    assert shown["message"].startswith("paused:")

    resume = _action(harness, "held", {"action": "Resume"})
    await process_action(harness.engine, resume)

    status = harness.kube.actions[(NAMESPACE, resume["metadata"]["name"])]["status"]
    assert status["result"] == "Accepted"
    assert len(harness.kube.created) == created + 1
    assert harness.job_of("deploy")
    assert (await harness.run(run)).paused_at is None
