"""Approval gates in the store: a gate awaits people, never a Job; each approver counts once,
``required`` of them pass it and release its dependents; the creator is refused under
``forbidSelf``, a stranger always; a rejection or the timeout fails it and the run rolls
back; a cancel wins; a Job's outcome can never pass a gate."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import ActionResult, Actor, RunAction, RunActionKind
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.store.actions import apply_action
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.moves import settle_run
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import finish, kinds, record, roll_back, start_run, states

pytestmark = pytest.mark.store

APPROVAL: dict[str, Any] = {
    "approvers": {"users": ["alice", "bob", "carol"], "groups": ["release-managers"]},
    "required": 2,
    "forbidSelf": True,
}


def _tasks(**approval: Any) -> list[dict[str, Any]]:
    return [
        {"key": "build"},
        {"key": "approve-prod", "dependsOn": ["build"], "approval": APPROVAL | approval},
        {"key": "deploy", "dependsOn": ["approve-prod"]},
        {"key": "unbuild", "compensateFor": "build"},
    ]


async def _gated(store: Pool, fence: Fence, **approval: Any) -> tuple[RunRecord, Decision]:
    """A run whose build succeeded: its gate awaits (created by carol)."""
    run = (await start_run(store, fence, _tasks(**approval), requested_by="carol")).run
    return run, await finish(store, fence, run, "build")


async def _act(
    store: Pool,
    fence: Fence,
    run: RunRecord,
    who: str,
    kind: RunActionKind = RunActionKind.APPROVE,
    *,
    groups: tuple[str, ...] = (),
    reason: str = "",
) -> tuple[ActionResult, str, Decision]:
    action = RunAction(run=run.name, action=kind, task="approve-prod", reason=reason)
    uid = f"{who}-{kind}-{len(await kinds(store, run.id))}"
    done = await apply_action(
        store,
        fence=fence,
        run_id=run.id,
        uid=uid,
        name=uid,
        action=action,
        actor=Actor(username=who, groups=groups),
    )
    return done.result, done.message, done.decision


async def test_a_released_gate_awaits_people_and_makes_no_job(store: Pool, fence: Fence) -> None:
    run, released = await _gated(store, fence)

    assert released.create_jobs == ()
    assert [n.reason for n in released.notices] == ["AwaitingApproval"]
    assert (await states(store, run.id))["approve-prod"] == TaskState.AWAITING
    assert EventKind.TASK_AWAITING_APPROVAL in await kinds(store, run.id)
    assert (await dispatch_due(store, fence=fence, run_id=run.id)).create_jobs == ()
    # a Job's success (a forged Job named like the gate's attempt) never passes it
    assert await record(store, fence, run, "approve-prod") == Decision.lost()
    assert (await states(store, run.id))["approve-prod"] == TaskState.AWAITING


async def test_two_approvers_pass_the_gate_each_counting_once(store: Pool, fence: Fence) -> None:
    run, _ = await _gated(store, fence)

    first = await _act(store, fence, run, "alice")
    again = await _act(store, fence, run, "alice")
    own = await _act(store, fence, run, "carol")
    stranger = await _act(store, fence, run, "mallory", groups=("developers",))
    assert first[:2] == (
        ActionResult.ACCEPTED,
        "approval 1 of 2 for approve-prod (alice); waiting for 1 more",
    )
    assert first[2].create_jobs == ()
    assert again[:2] == (
        ActionResult.REFUSED,
        'alice has approved "approve-prod" already: each person counts once',
    )
    assert own[0] is ActionResult.REFUSED and "forbids approving one's own run" in own[1]
    assert stranger[:2] == (ActionResult.REFUSED, 'mallory is not an approver of "approve-prod"')
    assert (await states(store, run.id))["approve-prod"] == TaskState.AWAITING

    # a member of a listed group may approve
    result, message, passed = await _act(store, fence, run, "dave", groups=("release-managers",))

    assert (result, message) == (
        ActionResult.ACCEPTED,
        "approve-prod approved (alice, dave); the run goes on",
    )
    assert [(d.task_key, d.attempt) for d in passed.create_jobs] == [("deploy", 1)]
    assert "ApprovalGranted" in [n.reason for n in passed.notices]
    assert (await states(store, run.id))["approve-prod"] == TaskState.SUCCEEDED
    succeeded = [e for e in await run_history(store, run.id) if e.kind == EventKind.TASK_SUCCEEDED][
        -1
    ]
    assert (succeeded.task_key, succeeded.detail["approvedBy"]) == (
        "approve-prod",
        ["alice", "dave"],
    )
    # a decided gate takes no more decisions
    late = await _act(store, fence, run, "bob")
    assert late[:2] == (
        ActionResult.REFUSED,
        '"approve-prod" is not awaiting approval: it is succeeded',
    )
    await record(store, fence, run, "deploy")
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED


async def test_a_rejection_fails_the_gate_and_the_run_rolls_back(store: Pool, fence: Fence) -> None:
    run, _ = await _gated(store, fence)
    refused = await _act(store, fence, run, "mallory", RunActionKind.REJECT, reason="no")
    assert refused[0] is ActionResult.REFUSED

    result, message, decision = await _act(
        store, fence, run, "bob", RunActionKind.REJECT, reason="prod is frozen"
    )

    assert (result, message) == (
        ActionResult.ACCEPTED,
        "approve-prod rejected by bob: prod is frozen; the run rolls back",
    )
    assert {"Rejected", "ActionAccepted"} <= {n.reason for n in decision.notices}
    task_states = await states(store, run.id)
    assert (task_states["approve-prod"], task_states["deploy"]) == (
        TaskState.FAILED,
        TaskState.SKIPPED,
    )
    assert await roll_back(store, fence, run, decision) == ["unbuild"]
    finished = await get_run(store, run.id)
    assert finished.phase is RunPhase.FAILED
    assert (await states(store, run.id))["unbuild"] == CompensationState.SUCCEEDED


async def test_the_timeout_fails_the_gate_at_its_deadline(store: Pool, fence: Fence) -> None:
    run, released = await _gated(store, fence, timeoutSeconds=60)
    # the wake-up is set at the deadline (in seconds from the store's now), and a settle
    # before it changes nothing
    assert released.wake_in is not None and 50 < released.wake_in <= 60
    assert (await settle_run(store, fence=fence, run_id=run.id)).recorded is False
    again = (await dispatch_due(store, fence=fence, run_id=run.id)).wake_in
    assert again is not None and 50 < again <= released.wake_in

    async with store.connection() as connection:  # the deadline passes
        await connection.execute(
            "UPDATE flowforge_task SET not_before = not_before - interval '61 seconds' "
            "WHERE run_id = %s AND task_key = %s",
            (run.id, "approve-prod"),
        )
    decision = await settle_run(store, fence=fence, run_id=run.id)

    assert "ApprovalTimedOut" in [n.reason for n in decision.notices]
    assert (await states(store, run.id))["approve-prod"] == TaskState.FAILED
    assert await roll_back(store, fence, run, decision) == ["unbuild"]
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED
    late = await _act(store, fence, run, "alice")
    assert late[0] is ActionResult.REFUSED


async def test_a_cancel_wins_over_a_waiting_gate(store: Pool, fence: Fence) -> None:
    run, _ = await _gated(store, fence)

    decision = await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel")

    assert (await states(store, run.id))["approve-prod"] == TaskState.CANCELLED
    assert await roll_back(store, fence, run, decision) == ["unbuild"]
    assert (await get_run(store, run.id)).phase is RunPhase.CANCELLED


async def test_a_root_gate_awaits_from_the_start(store: Pool, fence: Fence) -> None:
    tasks = [
        {"key": "approve-prod", "approval": {"timeoutSeconds": 30}},
        {"key": "deploy", "dependsOn": ["approve-prod"]},
    ]
    run = (await start_run(store, fence, tasks)).run

    started = await dispatch_due(store, fence=fence, run_id=run.id)

    assert started.create_jobs == () and started.wake_in is not None
    assert await states(store, run.id) == {
        "approve-prod": TaskState.AWAITING,
        "deploy": TaskState.WAITING,
    }
    # no approvers listed: anyone the apiserver let through may approve
    result, _, passed = await _act(store, fence, run, "anyone")
    assert result is ActionResult.ACCEPTED
    assert [d.task_key for d in passed.create_jobs] == ["deploy"]
