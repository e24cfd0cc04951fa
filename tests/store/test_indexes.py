"""Each documented query is served by its index (EXPLAIN after ANALYZE).

The tables here hold a few hundred rows, where a sequential scan is genuinely cheaper and
the planner rightly picks it. ``enable_seqscan = off`` makes a sequential scan a last
resort, so the plan shows whether the query *can* use the index (its columns, order and
partial-index predicate match); without a matching index PostgreSQL would still fall back
to a sequential scan, and the assertion would fail.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from flowforge.store.connection import Pool
from flowforge.store.definitions import LOAD_NEWEST_QUERY, LOAD_QUERY
from flowforge.store.events import HISTORY_QUERY
from flowforge.store.lease import Fence
from flowforge.store.queries import (
    DISPATCHABLE_QUERY,
    GET_TASK_QUERY,
    PROGRESS_QUERY,
    RUNNING_QUERY,
)
from flowforge.store.retention import PRUNABLE_QUERY
from flowforge.store.runs import ACTIVE_RUNS_QUERY, FIND_RUN_QUERY
from flowforge.store.settle import UNRESOLVED_QUERY
from flowforge.store.transitions import (
    RECORD_SUCCESS_QUERY,
    SKIP_DOWNSTREAM_QUERY,
    mark_running,
    record_outcome,
)
from tests.store.conftest import NAMESPACE, start_run

pytestmark = pytest.mark.store


def _index_names(plan: Any) -> Iterator[str]:
    if isinstance(plan, dict):
        if "Index Name" in plan:
            yield str(plan["Index Name"])
        for value in plan.values():
            yield from _index_names(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _index_names(item)


@pytest.fixture
async def populated(store: Pool, fence: Fence) -> tuple[int, int]:
    """Twelve runs of a 12-task graph, some of them finished; returns (run id, task id)."""
    tasks: list[dict[str, Any]] = [{"key": "root"}]
    tasks += [{"key": f"mid-{n}", "dependsOn": ["root"]} for n in range(10)]
    tasks += [{"key": "sink", "dependsOn": [f"mid-{n}" for n in range(10)]}]
    run_id = 0
    for n in range(12):
        run_id = (await start_run(store, fence, tasks, workflow=f"wf-{n}")).run.id
        await mark_running(store, fence=fence, run_id=run_id, task_key="root", attempt=1)
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key="root", attempt=1, succeeded=n % 2 == 0
        )
    async with store.connection() as connection:
        await connection.execute("ANALYZE")
        cursor = await connection.execute(
            "SELECT id FROM flowforge_task WHERE run_id = %s AND task_key = 'root'", (run_id,)
        )
        row = await cursor.fetchone()
    assert row is not None
    return run_id, int(row[0])


async def _plan_indexes(
    store: Pool, query: str, params: tuple[Any, ...] | dict[str, Any]
) -> set[str]:
    async with store.connection() as connection:
        await connection.execute("SET enable_seqscan = off")
        cursor = await connection.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params)
        row = await cursor.fetchone()
        await connection.rollback()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return set(_index_names(plan))


Params = Callable[[int, int], tuple[Any, ...] | dict[str, Any]]
CASES: dict[str, tuple[str, Params, str]] = {
    "load_definition": (
        LOAD_QUERY,
        lambda r, t: (NAMESPACE, "wf-3", 1),
        "flowforge_definition_identity",
    ),
    "newest_version": (
        LOAD_NEWEST_QUERY,
        lambda r, t: (NAMESPACE, "wf-3"),
        "flowforge_definition_identity",
    ),
    "find_run": (
        FIND_RUN_QUERY,
        lambda r, t: (NAMESPACE, "wf-3-run", "x"),
        "flowforge_run_identity",
    ),
    "list_active_runs": (ACTIVE_RUNS_QUERY, lambda r, t: (0, 100), "flowforge_run_active_idx"),
    "prune": (PRUNABLE_QUERY, lambda r, t: (timedelta(days=30), 100), "flowforge_run_prunable_idx"),
    "run_progress": (PROGRESS_QUERY, lambda r, t: (r,), "flowforge_task_progress_idx"),
    "settle_probe": (UNRESOLVED_QUERY, lambda r, t: {"run": r}, "flowforge_task_progress_idx"),
    "get_task": (GET_TASK_QUERY, lambda r, t: (r, "sink"), "flowforge_task_identity"),
    "dispatchable": (DISPATCHABLE_QUERY, lambda r, t: (100,), "flowforge_task_active_idx"),
    "running": (RUNNING_QUERY, lambda r, t: (100,), "flowforge_task_active_idx"),
    "record_success_and_release": (
        RECORD_SUCCESS_QUERY,
        lambda r, t: {
            "lease": "operator",
            "epoch": 1,
            "run": r,
            "key": "root",
            "attempt": 1,
            "detail": "{}",
            "dispatch": True,
        },
        "flowforge_task_dependency_pkey",
    ),
    "skip_downstream": (
        SKIP_DOWNSTREAM_QUERY,
        lambda r, t: {"task": t},
        "flowforge_task_dependency_pkey",
    ),
    "run_history": (HISTORY_QUERY, lambda r, t: (r, 0), "flowforge_event_run_idx"),
}


async def test_recording_a_success_finds_its_task_row_by_index(
    store: Pool, populated: tuple[int, int]
) -> None:
    """The task row is found by (run_id, task_key) or by (run_id, role, state): the planner
    may pick either, both are selective; what must not happen is a scan of the run."""
    run_id, _ = populated
    params = {
        "lease": "operator",
        "epoch": 1,
        "run": run_id,
        "key": "root",
        "attempt": 1,
        "detail": "{}",
        "dispatch": True,
    }

    used = await _plan_indexes(store, RECORD_SUCCESS_QUERY, params)

    assert used & {"flowforge_task_identity", "flowforge_task_progress_idx"}
    assert "flowforge_lease_pkey" in used


@pytest.mark.parametrize("name", sorted(CASES))
async def test_the_query_uses_its_index(name: str, store: Pool, populated: tuple[int, int]) -> None:
    query, params, index = CASES[name]
    run_id, task_id = populated

    used = await _plan_indexes(store, query, params(run_id, task_id))

    assert index in used, f"{name} should use {index}, plan uses {sorted(used)}"


async def test_progress_counts_are_an_index_only_scan(
    store_dsn: str, populated: tuple[int, int]
) -> None:
    run_id, _ = populated
    async with await psycopg.AsyncConnection.connect(store_dsn, autocommit=True) as connection:
        await connection.execute("VACUUM (ANALYZE) flowforge_task")  # sets the visibility map
        await connection.execute("SET enable_seqscan = off")
        cursor = await connection.execute(
            ("EXPLAIN (FORMAT JSON) " + PROGRESS_QUERY).encode(), (run_id,)
        )
        row = await cursor.fetchone()
    assert row is not None
    assert '"Index Only Scan"' in json.dumps(row[0])
