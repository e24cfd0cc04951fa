"""``finally`` tasks in the store: once the outcome is decided (after the forward tasks, and
after the rollback has settled) they run in list order, one at a time, with their own
retries; each is told the decided outcome; a failing one changes nothing; the run takes its
phase once the last has run; a cancel then changes nothing, a gone object skips them."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.decision import Decision, Dispatch
from flowforge.domain.final_tasks import RollbackOutcome
from flowforge.domain.history import EventKind
from flowforge.domain.run_actions import Actor, RunAction, RunActionKind
from flowforge.domain.states import RunPhase, TaskRole, TaskState
from flowforge.store.actions import apply_action
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.final_tasks import decided_outcome, final_steps
from flowforge.store.lease import Fence
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import (
    failure,
    finish,
    kinds,
    record,
    roll_back,
    start_run,
    states,
)

pytestmark = pytest.mark.store

TASKS: list[dict[str, Any]] = [
    {"key": "build"},
    {"key": "deploy", "dependsOn": ["build"]},
    {"key": "unbuild", "compensateFor": "build"},
]
FINALS: list[dict[str, Any]] = [{"key": "notify", "retries": 1}, {"key": "release-lock"}]


def _finals(decision: Decision) -> list[Dispatch]:
    return [d for d in decision.create_jobs if d.role is TaskRole.FINALLY]


async def _run_finals(
    store: Pool, fence: Fence, run: RunRecord, decision: Decision, *, failing: str = ""
) -> list[tuple[str, int]]:
    """Run the finally tasks as the operator does (``failing`` fails every attempt); the
    (task, attempt) in the order they ran."""
    ran: list[tuple[str, int]] = []
    while steps := _finals(decision):
        assert len(steps) == 1, f"one finally task at a time, got {steps}"
        step = steps[0]
        ran.append((step.task_key, step.attempt))
        assert (await get_run(store, run.id)).phase is RunPhase.RUNNING  # not before they ran
        outcome = failure("notify failed") if step.task_key == failing else None
        decision = await record(
            store, fence, run, step.task_key, *([outcome] if outcome else []),
            attempt=step.attempt, role=TaskRole.FINALLY,
        )  # fmt: skip
    return ran


async def test_after_a_success_they_run_in_order_and_a_failing_one_leaves_the_phase(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, TASKS, final_tasks=FINALS)).run
    await finish(store, fence, run, "build")

    decided = await record(store, fence, run, "deploy")

    assert decided.phase is None and "Finalizing" in [n.reason for n in decided.notices]
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING
    assert await decided_outcome(store, run.id) == (RunPhase.SUCCEEDED, RollbackOutcome.NONE)
    ran = await _run_finals(store, fence, run, decided, failing="notify")
    # notify fails twice (retries: 1), release-lock still runs, the run Succeeded
    assert ran == [("notify", 1), ("notify", 2), ("release-lock", 1)]
    finished = await get_run(store, run.id)
    assert finished.phase is RunPhase.SUCCEEDED
    task_states = await states(store, run.id)
    assert (task_states["notify"], task_states["release-lock"]) == (
        TaskState.FAILED,
        TaskState.SUCCEEDED,
    )
    history = await kinds(store, run.id)
    assert history.index(EventKind.RUN_FINALIZING) < history.index(EventKind.FINALLY_STARTED)
    assert history[-1] == EventKind.RUN_SUCCEEDED
    assert history.count(EventKind.FINALLY_FAILED) == 1


async def test_one_that_succeeds_on_its_retry_keeps_no_error(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, [{"key": "build"}], final_tasks=FINALS)).run
    await finish(store, fence, run, "build")

    retried = await record(store, fence, run, "notify", failure("busy"), role=TaskRole.FINALLY)

    assert [(d.task_key, d.attempt) for d in _finals(retried)] == [("notify", 2)]
    assert (await final_steps(store, run.id))[0] == ("notify", TaskState.RUNNING, 2, "busy")
    await record(store, fence, run, "notify", attempt=2, role=TaskRole.FINALLY)
    # its success clears the error of the attempt before it (a compensator's keeps it)
    assert (await final_steps(store, run.id))[0] == ("notify", TaskState.SUCCEEDED, 2, "")


@pytest.mark.parametrize(
    ("undo_fails", "rollback"),
    [(False, RollbackOutcome.COMPLETED), (True, RollbackOutcome.HALTED)],
)
async def test_after_a_failure_they_run_once_the_rollback_has_settled(
    store: Pool, fence: Fence, undo_fails: bool, rollback: RollbackOutcome
) -> None:
    run = (await start_run(store, fence, TASKS, final_tasks=FINALS)).run
    await finish(store, fence, run, "build")
    failed = await record(store, fence, run, "deploy", failure())
    assert _finals(failed) == []  # the rollback first

    ran: list[str] = []
    decision = failed
    while steps := [d for d in decision.create_jobs if d.role is TaskRole.COMPENSATION]:
        ran.append(steps[0].task_key)
        outcome = failure("undo failed") if undo_fails else None
        decision = await record(
            store, fence, run, steps[0].task_key, *([outcome] if outcome else []),
            attempt=steps[0].attempt, role=TaskRole.COMPENSATION,
        )  # fmt: skip

    assert ran == ["unbuild"]
    assert await decided_outcome(store, run.id) == (RunPhase.FAILED, rollback)
    assert await _run_finals(store, fence, run, decision) == [("notify", 1), ("release-lock", 1)]
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED


async def test_a_cancel_while_they_run_changes_nothing_a_gone_object_skips_them(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, TASKS, final_tasks=FINALS)).run
    await finish(store, fence, run, "build")
    decided = await record(store, fence, run, "deploy")
    (notify,) = _finals(decided)

    await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel")

    assert (await states(store, run.id))["notify"] == TaskState.RUNNING
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING

    gone = await cancel_run(
        store, fence=fence, run_id=run.id, reason="the object is gone", rollback=False
    )

    assert [(j.task_key, j.role) for j in gone.stop_jobs] == [("notify", TaskRole.FINALLY)]
    task_states = await states(store, run.id)
    assert (task_states["notify"], task_states["release-lock"]) == (
        TaskState.SKIPPED,
        TaskState.SKIPPED,
    )
    # the decided outcome stands: it had succeeded before anyone cancelled
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED
    late = await record(store, fence, run, "notify", attempt=notify.attempt, role=TaskRole.FINALLY)
    assert late == Decision.lost()


async def _act(store: Pool, fence: Fence, run: RunRecord, kind: RunActionKind) -> Decision:
    done = await apply_action(
        store, fence=fence, run_id=run.id, uid=f"{kind}-{run.id}", name=kind.lower(),
        action=RunAction(run=run.name, action=kind), actor=Actor(username="bob"),
    )  # fmt: skip
    return done.decision


async def test_a_run_paused_when_its_outcome_is_decided_starts_them_at_its_resume(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, TASKS, final_tasks=FINALS)).run
    await finish(store, fence, run, "build")  # deploy runs
    await _act(store, fence, run, RunActionKind.PAUSE)

    decided = await record(store, fence, run, "deploy")

    # no finally task starts while paused (found by the model test: the first one did)
    assert _finals(decided) == []
    assert await decided_outcome(store, run.id) == (RunPhase.SUCCEEDED, RollbackOutcome.NONE)
    assert (await states(store, run.id))["notify"] == TaskState.WAITING
    resumed = await _act(store, fence, run, RunActionKind.RESUME)
    assert await _run_finals(store, fence, run, resumed) == [("notify", 1), ("release-lock", 1)]
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED


async def test_a_gone_object_finishes_a_run_whose_next_finally_task_had_not_started(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, TASKS[:2], final_tasks=FINALS)).run  # no compensator
    await finish(store, fence, run, "build")
    await record(store, fence, run, "deploy")
    await cancel_run(store, fence=fence, run_id=run.id, reason="spec.cancel")
    await _act(store, fence, run, RunActionKind.PAUSE)
    await record(store, fence, run, "notify", role=TaskRole.FINALLY)  # release-lock waits

    gone = await cancel_run(
        store, fence=fence, run_id=run.id, reason="the object is gone", rollback=False
    )

    # found by the run model test: the skip was reported lost and the run not settled
    assert gone.recorded and gone.phase is RunPhase.SUCCEEDED and gone.stop_jobs == ()
    assert (await states(store, run.id))["release-lock"] == TaskState.SKIPPED
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED


async def test_a_run_without_finally_finishes_at_once(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, TASKS)).run
    await finish(store, fence, run, "build")

    done = await record(store, fence, run, "deploy")

    assert done.phase is RunPhase.SUCCEEDED
    assert EventKind.RUN_FINALIZING not in await kinds(store, run.id)
    assert await roll_back(store, fence, run, done) == []
