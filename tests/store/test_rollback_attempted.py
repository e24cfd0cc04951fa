"""``compensateOn: Attempted`` in the store: a task whose last attempt failed after its
container started is undone, first; one whose Pod never started is not."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.cli.run_report import load_report
from flowforge.domain.execution import AttemptOutcome, OutcomeReason
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole
from flowforge.domain.undo import UndoOf
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks, rollback_steps
from flowforge.store.reuse import find_run_by_name
from flowforge.store.settle import undo_reason
from tests.store.conftest import NAMESPACE, failure, finish, roll_back, start_run

pytestmark = pytest.mark.store

# charge fails half-way; reserve succeeded before it; notify runs beside them
PAYMENT: list[dict[str, Any]] = [
    {"key": "reserve"},
    {"key": "charge", "dependsOn": ["reserve"]},
    {"key": "notify"},
    {"key": "unreserve", "compensateFor": "reserve"},
    {"key": "refund", "compensateFor": "charge", "compensateOn": "Attempted"},
    {"key": "unnotify", "compensateFor": "notify"},
]
NEVER_STARTED = AttemptOutcome(
    succeeded=False,
    reason=OutcomeReason.IMAGE_PULL_BACK_OFF,
    message="the Pod did not start within 60 s: Back-off pulling image",
)


async def _compensators(store: Pool, run_id: int) -> dict[str, str]:
    return {
        t.task_key: t.state
        for t in await list_tasks(store, run_id)
        if t.role is TaskRole.COMPENSATION
    }


async def test_a_task_that_failed_after_its_container_started_is_undone_first(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, PAYMENT)).run
    await finish(store, fence, run, "notify")
    await finish(store, fence, run, "reserve")

    failed = await finish(store, fence, run, "charge", failure("exit code 1: card charged"))

    assert [(d.task_key, d.role) for d in failed.create_jobs] == [("refund", TaskRole.COMPENSATION)]
    assert await undo_reason(store, run_id=run.id, task_key="refund") is UndoOf.ATTEMPTED
    assert await undo_reason(store, run_id=run.id, task_key="unreserve") is UndoOf.SUCCEEDED
    steps = await rollback_steps(store, run.id)
    assert [(s.task_key, s.undo_of) for s in steps] == [
        ("refund", UndoOf.ATTEMPTED),
        ("unreserve", UndoOf.SUCCEEDED),
        ("unnotify", UndoOf.SUCCEEDED),
    ]
    compensating = [
        e for e in await run_history(store, run.id) if e.kind == EventKind.RUN_COMPENSATING
    ]
    assert [dict(e.detail) for e in compensating] == [
        {"order": ["refund", "unreserve", "unnotify"]}
    ]

    ran = await roll_back(store, fence, run, failed)

    assert ran == ["refund", "unreserve", "unnotify"]
    assert set((await _compensators(store, run.id)).values()) == {CompensationState.SUCCEEDED}
    named = await find_run_by_name(store, namespace=NAMESPACE, name=run.name)
    assert named is not None
    report = await load_report(store, named)  # `flowforge describe run`
    assert [step.row.task_key for step in report.compensation] == ran


async def test_a_task_whose_pod_never_started_is_not_undone(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, PAYMENT)).run
    await finish(store, fence, run, "notify")
    await finish(store, fence, run, "reserve")

    failed = await finish(store, fence, run, "charge", NEVER_STARTED)
    ran = await roll_back(store, fence, run, failed)

    assert ran == ["unreserve", "unnotify"]
    assert (await _compensators(store, run.id))["refund"] == CompensationState.SKIPPED


async def test_only_the_last_attempt_counts(store: Pool, fence: Fence) -> None:
    tasks = [
        {"key": "charge", "retries": 1},
        {"key": "refund", "compensateFor": "charge", "compensateOn": "Attempted"},
    ]
    run = (await start_run(store, fence, tasks)).run
    await finish(store, fence, run, "charge", failure())  # ran, then a retry

    failed = await finish(store, fence, run, "charge", NEVER_STARTED)

    assert failed.phase is RunPhase.FAILED and failed.create_jobs == ()
    assert (await _compensators(store, run.id))["refund"] == CompensationState.NOT_TRIGGERED


async def test_an_attempted_task_alone_is_undone_and_the_run_finishes_failed(
    store: Pool, fence: Fence
) -> None:
    tasks = [
        {"key": "charge"},
        {"key": "refund", "compensateFor": "charge", "compensateOn": "Attempted"},
    ]
    run = (await start_run(store, fence, tasks)).run

    failed = await finish(store, fence, run, "charge", failure())
    ran = await roll_back(store, fence, run, failed)

    assert ran == ["refund"]
    history = [(e.kind, e.task_key) for e in await run_history(store, run.id)]
    assert history[-1] == (EventKind.RUN_FAILED, None)


async def test_without_compensate_on_a_failed_task_is_never_undone(
    store: Pool, fence: Fence
) -> None:
    tasks = [{"key": "charge"}, {"key": "refund", "compensateFor": "charge"}]
    run = (await start_run(store, fence, tasks)).run

    failed = await finish(store, fence, run, "charge", failure())

    assert failed.phase is RunPhase.FAILED and failed.create_jobs == ()
    assert EventKind.RUN_COMPENSATING not in [e.kind for e in await run_history(store, run.id)]
