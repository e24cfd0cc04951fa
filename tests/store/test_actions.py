"""A person's WorkflowRunAction on a halted rollback, in the store: RetryCompensator and
SkipCompensator let the rollback go on in its order, the run stays Failed, the history says
who and why; a refused action changes nothing; an action is processed once."""

from __future__ import annotations

import pytest

from flowforge.cli.run_report import load_report, report_text
from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import ActionResult, Actor, RunAction, RunActionKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole
from flowforge.store.actions import apply_action
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import find_run_by_name
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import NAMESPACE, failure, finish, record, roll_back, start_run

pytestmark = pytest.mark.store

CHAIN = [
    {"key": "provision"},
    {"key": "deploy", "dependsOn": ["provision"]},
    {"key": "verify", "dependsOn": ["deploy"]},
    {"key": "unprovision", "compensateFor": "provision"},
    {"key": "undeploy", "compensateFor": "deploy", "retries": 1},
]
ALICE = Actor(username="alice", groups=("ops", "system:authenticated"))


async def _halted(store: Pool, fence: Fence) -> RunRecord:
    """A run whose rollback halted at undeploy (unprovision not run)."""
    run = (await start_run(store, fence, CHAIN)).run
    await finish(store, fence, run, "provision")
    await record(store, fence, run, "deploy")
    failed = await record(store, fence, run, "verify", failure())
    assert await roll_back(store, fence, run, failed, failing="undeploy") == ["undeploy"] * 2
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED
    return run


async def _compensators(store: Pool, run_id: int) -> dict[str, tuple[str, int]]:
    return {
        t.task_key: (t.state, t.attempt)
        for t in await list_tasks(store, run_id)
        if t.role is TaskRole.COMPENSATION
    }


async def _act(
    store: Pool,
    fence: Fence,
    run: RunRecord,
    kind: RunActionKind,
    *,
    compensator: str = "undeploy",
    reason: str = "",
    uid: str = "uid-1",
) -> tuple[ActionResult, str, Decision, bool]:
    action = RunAction(run=run.name, action=kind, compensator=compensator, reason=reason)
    done = await apply_action(
        store,
        fence=fence,
        run_id=run.id,
        uid=uid,
        name=f"act-{uid}",
        action=action,
        actor=ALICE,
    )
    return done.result, done.message, done.decision, done.already


async def test_retry_runs_the_halted_compensator_again_then_the_rollback_goes_on(
    store: Pool, fence: Fence
) -> None:
    run = await _halted(store, fence)

    result, _, decision, _ = await _act(store, fence, run, RunActionKind.RETRY_COMPENSATOR)

    assert result is ActionResult.ACCEPTED
    assert [(d.task_key, d.attempt) for d in decision.create_jobs] == [("undeploy", 3)]
    assert [n.reason for n in decision.notices] == ["ActionAccepted"]
    assert (await _compensators(store, run.id)) == {
        "undeploy": (CompensationState.RUNNING, 3),
        "unprovision": (CompensationState.PENDING, 1),
    }
    row = await get_run(store, run.id)
    assert (row.phase, row.compensating) == (RunPhase.FAILED, False)
    # fresh attempts (retries: 1): attempt 3 fails and is retried as 4, then succeeds
    again = await record(
        store, fence, run, "undeploy", failure(), attempt=3, role=TaskRole.COMPENSATION
    )
    assert [(d.task_key, d.attempt) for d in again.create_jobs] == [("undeploy", 4)]
    ran = await roll_back(store, fence, run, again)
    assert ran == ["undeploy", "unprovision"]
    row = await get_run(store, run.id)
    assert (row.phase, row.compensating) == (RunPhase.FAILED, False)
    history = [(e.kind, e.task_key, dict(e.detail)) for e in await run_history(store, run.id)]
    assert history[-1][:2] == (EventKind.RUN_ROLLBACK_RECOVERED, None)
    assert history[-1][2]["completed"] is True
    accepted = [h for h in history if h[0] == EventKind.ACTION_ACCEPTED]
    assert [(h[1], h[2]["actor"]["username"], h[2]["action"]) for h in accepted] == [
        ("undeploy", "alice", "RetryCompensator")
    ]
    assert [k for k, _, _ in history].count(EventKind.RUN_FAILED) == 1


async def test_a_retried_item_compensator_gets_its_tasks_retries_again(
    store: Pool, fence: Fence
) -> None:
    """The compensator of a forEach item (``undeploy[eu]``) halted after its 2 attempts
    (retries: 1): a person's RetryCompensator gives it 2 fresh attempts, as its task has, not
    one (the model test found it: the lookup took the item's key for its task's)."""
    tasks = [
        {"key": "deploy", "forEach": {"items": ["eu"]}},
        {"key": "verify", "dependsOn": ["deploy"]},
        {"key": "undeploy", "compensateFor": "deploy", "retries": 1},
    ]
    run = (await start_run(store, fence, tasks, workflow="fanned-undo")).run
    await finish(store, fence, run, "deploy[eu]")
    failed = await finish(store, fence, run, "verify", failure())
    halted = await roll_back(store, fence, run, failed, failing="undeploy[eu]")
    assert halted == ["undeploy[eu]"] * 2

    result, _, decision, _ = await _act(
        store, fence, run, RunActionKind.RETRY_COMPENSATOR, compensator="undeploy[eu]"
    )

    assert result is ActionResult.ACCEPTED
    assert [(d.task_key, d.attempt) for d in decision.create_jobs] == [("undeploy[eu]", 3)]
    again = await record(
        store, fence, run, "undeploy[eu]", failure(), attempt=3, role=TaskRole.COMPENSATION
    )
    assert [(d.task_key, d.attempt) for d in again.create_jobs] == [("undeploy[eu]", 4)]


async def test_skip_marks_it_skipped_by_a_person_and_the_rollback_goes_on(
    store: Pool, fence: Fence
) -> None:
    run = await _halted(store, fence)

    result, message, decision, _ = await _act(
        store, fence, run, RunActionKind.SKIP_COMPENSATOR, reason="undone by hand, OPS-1234"
    )

    assert result is ActionResult.ACCEPTED and "OPS-1234" in message
    assert [d.task_key for d in decision.create_jobs] == ["unprovision"]
    assert await roll_back(store, fence, run, decision) == ["unprovision"]
    assert (await _compensators(store, run.id)) == {
        "undeploy": (CompensationState.SKIPPED, 2),
        "unprovision": (CompensationState.SUCCEEDED, 1),
    }
    history = await run_history(store, run.id)
    skipped = [
        dict(e.detail)
        for e in history
        if e.kind == EventKind.COMPENSATION_SKIPPED and e.task_key == "undeploy"
    ]
    assert skipped == [{"reason": "undone by hand, OPS-1234", "byPerson": True}]
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED
    assert history[-1].kind == EventKind.RUN_ROLLBACK_RECOVERED


async def test_an_action_is_processed_once(store: Pool, fence: Fence) -> None:
    run = await _halted(store, fence)
    await _act(store, fence, run, RunActionKind.SKIP_COMPENSATOR, reason="by hand")
    before = await run_history(store, run.id)

    result, _, decision, already = await _act(
        store, fence, run, RunActionKind.SKIP_COMPENSATOR, reason="by hand"
    )

    assert (result, already, decision.recorded) == (ActionResult.ACCEPTED, True, False)
    assert await run_history(store, run.id) == before


@pytest.mark.parametrize(
    ("state", "compensator", "refusal"),
    [
        ("running", "undeploy", "not halted"),
        ("succeeded", "undeploy", "not halted"),
        ("halted", "unprovision", 'halted at "undeploy", not at "unprovision"'),
        ("halted", "nope", 'no compensator "nope"'),
    ],
)
async def test_an_action_whose_preconditions_fail_is_refused_and_changes_nothing(
    store: Pool, fence: Fence, state: str, compensator: str, refusal: str
) -> None:
    if state == "halted":
        run = await _halted(store, fence)
    else:
        run = (await start_run(store, fence, CHAIN)).run
        if state == "succeeded":
            await finish(store, fence, run, "provision")
            await record(store, fence, run, "deploy")
            await record(store, fence, run, "verify")
    rows = await _compensators(store, run.id)
    phase = (await get_run(store, run.id)).phase

    result, message, decision, _ = await _act(
        store, fence, run, RunActionKind.RETRY_COMPENSATOR, compensator=compensator
    )

    assert result is ActionResult.REFUSED and refusal in message
    assert decision.create_jobs == () and [n.reason for n in decision.notices] == ["ActionRefused"]
    assert await _compensators(store, run.id) == rows
    assert (await get_run(store, run.id)).phase is phase
    kinds = [e.kind for e in await run_history(store, run.id)]
    assert kinds[-1] == EventKind.ACTION_REFUSED


async def test_an_approval_of_a_gate_the_run_does_not_have_is_refused(
    store: Pool, fence: Fence
) -> None:
    run = await _halted(store, fence)
    action = RunAction(run=run.name, action=RunActionKind.APPROVE, task="deploy")

    done = await apply_action(
        store, fence=fence, run_id=run.id, uid="uid-9", name="a", action=action, actor=ALICE
    )

    assert done.result is ActionResult.REFUSED
    assert done.message == 'the run has no approval gate "deploy"'


async def test_describe_shows_who_acted_and_why(store: Pool, fence: Fence) -> None:
    run = await _halted(store, fence)
    await _act(store, fence, run, RunActionKind.SKIP_COMPENSATOR, reason="undone by hand")

    named = await find_run_by_name(store, namespace=NAMESPACE, name=run.name)
    assert named is not None
    report = await load_report(store, named)

    (action,) = report.to_dict()["actions"]
    assert {k: action[k] for k in ("action", "target", "actor", "result", "reason")} == {
        "action": "SkipCompensator",
        "target": "undeploy",
        "actor": "alice",
        "result": "Accepted",
        "reason": "undone by hand",
    }
    text = report_text(report)
    assert "Actions (people's decisions, oldest first):" in text
    line = next(line for line in text.splitlines() if line.startswith("SkipCompensator"))
    assert line.split()[:4] == ["SkipCompensator", "undeploy", "alice", "Accepted"]
    assert "undone by hand" in line
