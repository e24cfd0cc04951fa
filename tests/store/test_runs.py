"""Creating a run: its whole graph at once, idempotently per Kubernetes object; history is
append-only."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition
from flowforge.store.lease import Fence
from flowforge.store.queries import active_tasks, list_tasks
from flowforge.store.runs import create_run, find_run, get_run
from flowforge.store.sweep import sweep_page
from tests.store.conftest import DIAMOND, NAMESPACE, finish, kinds, start_run

pytestmark = pytest.mark.store

WITH_UNDO: list[dict[str, Any]] = [
    *DIAMOND,
    {"key": "undo-extract", "compensateFor": "extract"},
]


async def test_a_run_appears_with_roots_ready_and_the_rest_waiting(
    store: Pool, fence: Fence
) -> None:
    started = await start_run(store, fence, WITH_UNDO)

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
    assert {task.attempt for task in tasks.values()} == {1}
    assert started.run.phase is RunPhase.RUNNING
    assert [t.task_key for t in await active_tasks(store, started.run.id)] == ["extract"]
    assert [run.run_id for run in (await sweep_page(store, after_id=0, limit=10)).runs] == [
        started.run.id
    ]
    assert await kinds(store, started.run.id) == [EventKind.RUN_CREATED]


async def test_creating_the_same_run_again_returns_it(store: Pool, fence: Fence) -> None:
    started = await start_run(store, fence, WITH_UNDO)
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
    assert again.run == started.run
    assert len(await list_tasks(store, started.run.id)) == 5
    assert await kinds(store, started.run.id) == [EventKind.RUN_CREATED]
    found = await find_run(store, namespace=NAMESPACE, name=started.run.name, uid=started.run.uid)
    assert found == started.run


async def test_a_finished_run_leaves_the_active_list(store: Pool, fence: Fence) -> None:
    started = await start_run(store, fence, [{"key": "only"}])

    decision = await finish(store, fence, started.run, "only")

    assert decision.phase is RunPhase.SUCCEEDED
    run = await get_run(store, started.run.id)
    assert run.phase is RunPhase.SUCCEEDED and run.finished_at is not None
    assert (await sweep_page(store, after_id=0, limit=10)).runs == ()


async def test_history_is_append_only(store_dsn: str, store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, WITH_UNDO)).run.id
    async with await psycopg.AsyncConnection.connect(store_dsn) as connection:
        with pytest.raises(psycopg.errors.CheckViolation, match="append-only"):
            await connection.execute("UPDATE flowforge_event SET kind = 'run.forged'")
    assert await kinds(store, run_id) == [EventKind.RUN_CREATED]
