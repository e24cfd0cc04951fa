"""Retention removes only finished runs older than the cutoff, and reports what it removed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flowforge.domain.states import CompensationState, RunPhase
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks, run_progress
from flowforge.store.retention import PruneReport, prune
from flowforge.store.runs import get_run
from tests.store.conftest import failure, finish, start_run

pytestmark = pytest.mark.store

TASKS: list[dict[str, Any]] = [
    {"key": "a"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "undo-a", "compensateFor": "a"},
]


async def _finished_run(store: Pool, fence: Fence, workflow: str) -> int:
    run = (await start_run(store, fence, TASKS, workflow=workflow)).run
    await finish(store, fence, run, "a")
    assert (await finish(store, fence, run, "b")).phase is RunPhase.SUCCEEDED
    return run.id


async def _age(store: Pool, run_id: int, days: int) -> None:
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_run SET created_at = created_at - %(age)s, "
            "finished_at = finished_at - %(age)s WHERE id = %(run)s",
            {"age": timedelta(days=days), "run": run_id},
        )


async def test_prune_removes_only_finished_runs_older_than_the_cutoff(
    store: Pool, fence: Fence
) -> None:
    old = await _finished_run(store, fence, "old")
    recent = await _finished_run(store, fence, "recent")
    unfinished = (await start_run(store, fence, TASKS, workflow="unfinished")).run.id
    await _age(store, old, 40)
    await _age(store, recent, 1)
    await _age(store, unfinished, 400)
    old_events = len(await run_history(store, old))

    report = await prune(store, older_than=timedelta(days=30))

    assert report == PruneReport(runs=1, tasks=3, dependencies=1, events=old_events)
    assert "pruned 1 finished runs: removed 3 task rows" in report.describe()
    assert await list_tasks(store, old) == []
    assert await run_history(store, old) == []
    assert len(await list_tasks(store, recent)) == 3
    assert len(await list_tasks(store, unfinished)) == 3
    assert len(await run_history(store, unfinished)) == 1
    pruned = await get_run(store, old)
    assert pruned.pruned_at is not None
    kept = await run_progress(store, old)
    assert (kept.forward.total, kept.forward.succeeded) == (2, 2)
    assert await prune(store, older_than=timedelta(days=30)) == PruneReport()


async def test_failed_and_cancelled_runs_are_pruned_in_batches_a_rollback_is_not(
    store: Pool, fence: Fence
) -> None:
    failed = (await start_run(store, fence, TASKS, workflow="failed")).run
    await finish(store, fence, failed, "a", failure())
    cancelled = (await start_run(store, fence, TASKS, workflow="cancelled")).run
    await cancel_run(store, fence=fence, run_id=cancelled.id, reason="test")
    rolling_back = (await start_run(store, fence, TASKS, workflow="rolling-back")).run
    await finish(store, fence, rolling_back, "a")
    assert (await finish(store, fence, rolling_back, "b", failure())).create_jobs  # undo-a runs
    for run_id in (failed.id, cancelled.id, rolling_back.id):
        await _age(store, run_id, 40)

    report = await prune(store, older_than=timedelta(days=30), batch_size=1)

    assert report.runs == 2 and report.tasks == 6
    assert {(await get_run(store, r.id)).pruned_at is not None for r in (failed, cancelled)} == {
        True
    }
    assert (await get_run(store, rolling_back.id)).pruned_at is None
    assert len(await list_tasks(store, rolling_back.id)) == 3
    kept = await run_progress(store, cancelled.id)
    assert (kept.forward.total, kept.forward.cancelled) == (2, 2)
    assert kept.compensation == {CompensationState.NOT_TRIGGERED: 1}
    assert (await get_run(store, failed.id)).phase is RunPhase.FAILED
