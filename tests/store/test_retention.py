"""Retention removes only finished runs older than the cutoff, and reports what it removed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks, run_progress
from flowforge.store.retention import PruneReport, prune
from flowforge.store.runs import get_run
from flowforge.store.transitions import mark_running, record_outcome
from tests.store.conftest import start_run

pytestmark = pytest.mark.store

TASKS: list[dict[str, Any]] = [
    {"key": "a"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "undo-a", "compensateFor": "a"},
]


async def _finished_run(store: Pool, fence: Fence, workflow: str) -> int:
    run_id = (await start_run(store, fence, TASKS, workflow=workflow)).run.id
    for key in ("a", "b"):
        await mark_running(store, fence=fence, run_id=run_id, task_key=key, attempt=1)
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key=key, attempt=1, succeeded=True
        )
    return run_id


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
