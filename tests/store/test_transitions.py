"""Runs and forward-task moves: atomic creation, compare-and-set, release, skip, retry."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition
from flowforge.store.errors import StaleEpochError, TransitionConflictError
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.pool import open_pool
from flowforge.store.queries import get_task, list_dispatchable_tasks, list_tasks, run_progress
from flowforge.store.runs import create_run, get_run
from flowforge.store.transitions import (
    OutcomeResult,
    SuccessResult,
    cancel_run,
    mark_running,
    record_outcome,
    record_success,
)
from tests.store.conftest import NAMESPACE, start_run

pytestmark = pytest.mark.store

DIAMOND: list[dict[str, Any]] = [
    {"key": "extract"},
    {"key": "clean", "dependsOn": ["extract"]},
    {"key": "enrich", "dependsOn": ["extract"]},
    {"key": "load", "dependsOn": ["clean", "enrich"]},
    {"key": "undo-extract", "compensateFor": "extract"},
]


async def _succeed(pool: Pool, fence: Fence, run_id: int, key: str) -> OutcomeResult:
    await mark_running(pool, fence=fence, run_id=run_id, task_key=key, attempt=1)
    return await record_outcome(
        pool, fence=fence, run_id=run_id, task_key=key, attempt=1, succeeded=True
    )


async def _states(pool: Pool, run_id: int) -> dict[str, str]:
    return {task.task_key: task.state for task in await list_tasks(pool, run_id)}


async def test_a_run_appears_with_roots_ready_and_the_rest_waiting(
    store: Pool, fence: Fence
) -> None:
    started = await start_run(store, fence, DIAMOND)

    tasks = {task.task_key: task for task in await list_tasks(store, started.run.id)}
    assert {key: task.state for key, task in tasks.items()} == {
        "extract": TaskState.READY,
        "clean": TaskState.WAITING,
        "enrich": TaskState.WAITING,
        "load": TaskState.WAITING,
        "undo-extract": CompensationState.NOT_TRIGGERED,
    }
    assert tasks["load"].pending_dependencies == 2
    assert tasks["undo-extract"].compensates_key == "extract"
    assert started.run.phase is RunPhase.RUNNING
    dispatchable = await list_dispatchable_tasks(store)
    assert [(t.run_id, t.task_key) for t in dispatchable] == [(started.run.id, "extract")]


async def test_creating_the_same_run_again_returns_it(store: Pool, fence: Fence) -> None:
    started = await start_run(store, fence, DIAMOND)
    stored = await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)

    again = await create_run(
        store,
        fence=fence,
        namespace=NAMESPACE,
        name=started.run.name,
        uid=started.run.uid,
        definition=stored,
    )

    assert not again.created
    assert again.run.id == started.run.id
    assert len(await list_tasks(store, started.run.id)) == 5


async def test_a_run_whose_tasks_all_succeed_finishes_succeeded(store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id

    first = await _succeed(store, fence, run_id, "extract")
    await _succeed(store, fence, run_id, "clean")
    await _succeed(store, fence, run_id, "enrich")
    last = await _succeed(store, fence, run_id, "load")

    assert first.released == ("clean", "enrich")
    assert last.settled is not None and last.settled.phase is RunPhase.SUCCEEDED
    run = await get_run(store, run_id)
    assert run.phase is RunPhase.SUCCEEDED and run.finished_at is not None
    progress = await run_progress(store, run_id)
    assert (progress.forward.total, progress.forward.succeeded) == (4, 4)
    assert progress.compensation == {CompensationState.NOT_TRIGGERED: 1}
    kinds = [event.kind for event in await run_history(store, run_id)]
    assert kinds[0] == "run.created" and kinds[-1] == "run.succeeded"
    assert kinds.count("task.released") == 3


async def test_a_task_with_fifty_upstreams_finishing_together_is_released_once(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    upstreams = [{"key": f"part-{n:02d}"} for n in range(50)]
    sink = {"key": "merge", "dependsOn": [task["key"] for task in upstreams]}
    run_id = (await start_run(store, fence, [*upstreams, sink])).run.id
    for task in upstreams:
        await mark_running(store, fence=fence, run_id=run_id, task_key=task["key"], attempt=1)

    wide = await open_pool(store_dsn, min_size=50, max_size=50)
    try:
        results = await asyncio.gather(
            *(
                record_outcome(
                    wide,
                    fence=fence,
                    run_id=run_id,
                    task_key=task["key"],
                    attempt=1,
                    succeeded=True,
                )
                for task in upstreams
            )
        )
    finally:
        await wide.close()

    assert sum(result.released == ("merge",) for result in results) == 1
    assert [r.released for r in results if r.released] == [("merge",)]
    merge = await get_task(store, run_id=run_id, task_key="merge")
    assert merge is not None
    assert (merge.state, merge.pending_dependencies) == (TaskState.READY, 0)
    released = [e for e in await run_history(store, run_id) if e.kind == "task.released"]
    assert [e.task_key for e in released] == ["merge"]
    assert (await get_run(store, run_id)).phase is RunPhase.RUNNING


async def test_the_last_two_tasks_finishing_together_settle_the_run_once(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, [{"key": f"t{n}"} for n in range(8)])).run.id
    for n in range(8):
        await mark_running(store, fence=fence, run_id=run_id, task_key=f"t{n}", attempt=1)

    wide = await open_pool(store_dsn, min_size=8, max_size=8)
    try:
        await asyncio.gather(
            *(
                record_outcome(
                    wide,
                    fence=fence,
                    run_id=run_id,
                    task_key=f"t{n}",
                    attempt=1,
                    succeeded=True,
                )
                for n in range(8)
            )
        )
    finally:
        await wide.close()

    assert (await get_run(store, run_id)).phase is RunPhase.SUCCEEDED
    kinds = [event.kind for event in await run_history(store, run_id)]
    assert kinds.count("run.succeeded") == 1


async def test_moves_are_compare_and_set_on_state_and_attempt(store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id

    with pytest.raises(TransitionConflictError, match="expected ready"):
        await mark_running(store, fence=fence, run_id=run_id, task_key="clean", attempt=1)
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)
    with pytest.raises(TransitionConflictError, match=r"found running \(attempt 1\)"):
        await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)
    with pytest.raises(TransitionConflictError):
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key="extract", attempt=2, succeeded=True
        )
    await record_outcome(
        store, fence=fence, run_id=run_id, task_key="extract", attempt=1, succeeded=True
    )
    with pytest.raises(TransitionConflictError, match="found succeeded"):
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key="extract", attempt=1, succeeded=False
        )
    assert (await _states(store, run_id))["extract"] == TaskState.SUCCEEDED


async def test_a_final_failure_skips_everything_downstream_and_nothing_else(
    store: Pool, fence: Fence
) -> None:
    tasks: list[dict[str, Any]] = [
        {"key": "a"},
        {"key": "b", "dependsOn": ["a"]},
        {"key": "c", "dependsOn": ["b"]},
        {"key": "d", "dependsOn": ["a", "e"]},
        {"key": "e"},
        {"key": "f", "dependsOn": ["e"]},
    ]
    run_id = (await start_run(store, fence, tasks)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="a", attempt=1)

    result = await record_outcome(
        store,
        fence=fence,
        run_id=run_id,
        task_key="a",
        attempt=1,
        succeeded=False,
        error="exit code 3",
    )

    assert result.state is TaskState.FAILED
    assert result.skipped == ("b", "c", "d")
    assert await _states(store, run_id) == {
        "a": "failed",
        "b": "skipped",
        "c": "skipped",
        "d": "skipped",
        "e": "ready",
        "f": "waiting",
    }
    await _succeed(store, fence, run_id, "e")
    assert (await _states(store, run_id))["f"] == "ready"
    last = await _succeed(store, fence, run_id, "f")
    assert last.settled is not None and last.settled.phase is RunPhase.FAILED


async def test_a_failure_with_attempts_left_schedules_the_next_attempt(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, [{"key": "flaky", "retries": 1}])).run.id
    later = datetime.now(UTC) + timedelta(hours=1)
    await mark_running(store, fence=fence, run_id=run_id, task_key="flaky", attempt=1)

    retry = await record_outcome(
        store,
        fence=fence,
        run_id=run_id,
        task_key="flaky",
        attempt=1,
        succeeded=False,
        retry_not_before=later,
    )

    assert (retry.state, retry.attempt) == (TaskState.READY, 2)
    assert await list_dispatchable_tasks(store) == []  # not due for an hour
    await mark_running(store, fence=fence, run_id=run_id, task_key="flaky", attempt=2)
    final = await record_outcome(
        store,
        fence=fence,
        run_id=run_id,
        task_key="flaky",
        attempt=2,
        succeeded=False,
        retry_not_before=later,
    )
    assert (final.state, final.attempt) == (TaskState.FAILED, 2)
    assert final.settled is not None and final.settled.phase is RunPhase.FAILED


async def test_cancelling_a_run_cancels_unfinished_tasks_and_finishes_it(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)

    cancelled = await cancel_run(store, fence=fence, run_id=run_id)

    assert cancelled.cancelled == ("clean", "enrich", "extract", "load")
    assert cancelled.stopped_running == ("extract",)
    assert cancelled.settled.phase is RunPhase.CANCELLED
    with pytest.raises(TransitionConflictError):
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key="extract", attempt=1, succeeded=True
        )
    again = await cancel_run(store, fence=fence, run_id=run_id)
    assert again.cancelled == () and again.settled.phase is RunPhase.CANCELLED


async def test_history_is_append_only(store_dsn: str, store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    async with await psycopg.AsyncConnection.connect(store_dsn) as connection:
        with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
            await connection.execute("UPDATE flowforge_event SET kind = 'run.forged'")
    assert [e.kind for e in await run_history(store, run_id)] == ["run.created"]


async def test_a_dispatching_success_moves_what_it_releases_on_to_running_in_one_commit(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)

    result = await record_success(
        store,
        fence=fence,
        run_id=run_id,
        task_key="extract",
        attempt=1,
        detail={"exitCode": 0},
        dispatch=True,
    )

    assert result.recorded and result.released == ("clean", "enrich")
    assert [(d.task_key, d.attempt) for d in result.dispatched] == [("clean", 1), ("enrich", 1)]
    states = await _states(store, run_id)
    assert (states["clean"], states["enrich"], states["load"]) == ("running", "running", "waiting")
    history = [(e.kind, e.task_key) for e in await run_history(store, run_id)]
    assert history[-5:] == [
        ("task.succeeded", "extract"),
        ("task.released", "clean"),
        ("task.released", "enrich"),
        ("task.dispatched", "clean"),
        ("task.dispatched", "enrich"),
    ]
    succeeded = [e for e in await run_history(store, run_id) if e.kind == "task.succeeded"]
    assert succeeded[0].detail == {"exitCode": 0}


async def test_a_replayed_success_records_nothing_and_releases_nothing(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)
    await record_success(
        store, fence=fence, run_id=run_id, task_key="extract", attempt=1, dispatch=True
    )
    before = len(await run_history(store, run_id))

    again = await record_success(
        store, fence=fence, run_id=run_id, task_key="extract", attempt=1, dispatch=True
    )

    assert again == SuccessResult(recorded=False)
    assert len(await run_history(store, run_id)) == before
    load = await get_task(store, run_id=run_id, task_key="load")
    assert load is not None and load.pending_dependencies == 2


async def test_a_success_in_a_cancelling_run_releases_but_dispatches_nothing(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_run SET cancel_requested = true WHERE id = %s", (run_id,)
        )

    result = await record_success(
        store, fence=fence, run_id=run_id, task_key="extract", attempt=1, dispatch=True
    )

    assert result.released == ("clean", "enrich") and result.dispatched == ()
    states = await _states(store, run_id)
    assert (states["clean"], states["enrich"]) == ("ready", "ready")


async def test_a_dispatching_success_with_a_stale_epoch_changes_nothing(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, DIAMOND)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="extract", attempt=1)
    stale = Fence(lease=fence.lease, epoch=fence.epoch - 1)

    with pytest.raises(StaleEpochError):
        await record_success(
            store, fence=stale, run_id=run_id, task_key="extract", attempt=1, dispatch=True
        )

    assert (await _states(store, run_id))["extract"] == "running"
