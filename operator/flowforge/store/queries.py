"""Read-only queries: progress counts, task rows, and the reconciler's work lists.

Each query is served by one index (asserted by ``tests/store/test_indexes.py``):

- ``run_progress``: ``flowforge_task_progress_idx (run_id, role, state)``, index-only.
- ``list_dispatchable_tasks`` / ``list_running_tasks``: ``flowforge_task_active_idx``
  (partial, only rows that still need the operator).
- ``get_task``: ``flowforge_task_identity (run_id, task_key)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from flowforge.domain.projection import TaskCounts
from flowforge.domain.states import CompensationState, TaskRole
from flowforge.store.connection import Pool
from flowforge.store.errors import RunNotFoundError

PROGRESS_QUERY = (
    "SELECT role, state, count(*) FROM flowforge_task WHERE run_id = %s GROUP BY role, state"
)
DISPATCHABLE_QUERY = (
    "SELECT run_id, task_key, attempt, not_before FROM flowforge_task "
    "WHERE state = 'ready' AND not_before <= now() ORDER BY not_before LIMIT %s"
)
RUNNING_QUERY = (
    "SELECT run_id, task_key, role, attempt, started_at FROM flowforge_task "
    "WHERE state = 'running' ORDER BY not_before LIMIT %s"
)


@dataclasses.dataclass(frozen=True)
class RunProgress:
    forward: TaskCounts
    compensation: Mapping[CompensationState, int]


def _progress_from_counts(counts: Mapping[tuple[str, str], int]) -> RunProgress:
    forward = {state: n for (role, state), n in counts.items() if role == TaskRole.FORWARD}
    compensation = {
        CompensationState(state): n
        for (role, state), n in counts.items()
        if role == TaskRole.COMPENSATION
    }
    return RunProgress(
        forward=TaskCounts(total=sum(forward.values()), **forward),
        compensation=compensation,
    )


async def run_progress(pool: Pool, run_id: int) -> RunProgress:
    """Counts by state for one run, from one index-only query (or the counts kept at
    retention, once the task rows are gone)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(PROGRESS_QUERY, (run_id,))
        rows = await cursor.fetchall()
        if not rows:
            kept = await connection.execute(
                "SELECT final_counts FROM flowforge_run WHERE id = %s", (run_id,)
            )
            kept_row = await kept.fetchone()
            if kept_row is None:
                raise RunNotFoundError(run=f"#{run_id}")
            return progress_from_kept_counts(kept_row[0])
    return _progress_from_counts({(str(role), str(state)): int(n) for role, state, n in rows})


def progress_from_kept_counts(document: Mapping[str, Mapping[str, int]] | None) -> RunProgress:
    counts = {
        (role, state): int(n)
        for role, by_state in (document or {}).items()
        for state, n in by_state.items()
    }
    return _progress_from_counts(counts)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    run_id: int
    task_key: str
    role: TaskRole
    state: str
    compensates_key: str | None
    attempt: int
    max_attempts: int
    timeout_seconds: int | None
    pending_dependencies: int
    not_before: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> TaskRecord:
        values = list(row)
        values[2] = TaskRole(values[2])
        return cls(*values)


_TASK_COLUMNS = (
    "run_id, task_key, role, state, compensates_key, attempt, max_attempts, timeout_seconds, "
    "pending_dependencies, not_before, started_at, finished_at, last_error"
)

GET_TASK_QUERY = f"SELECT {_TASK_COLUMNS} FROM flowforge_task WHERE run_id = %s AND task_key = %s"


async def get_task(pool: Pool, *, run_id: int, task_key: str) -> TaskRecord | None:
    async with pool.connection() as connection:
        cursor = await connection.execute(GET_TASK_QUERY, (run_id, task_key))
        row = await cursor.fetchone()
    return None if row is None else TaskRecord.from_row(row)


async def list_tasks(pool: Pool, run_id: int) -> list[TaskRecord]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            f"SELECT {_TASK_COLUMNS} FROM flowforge_task WHERE run_id = %s "
            "ORDER BY role DESC, topological_index, task_key",
            (run_id,),
        )
        return [TaskRecord.from_row(row) for row in await cursor.fetchall()]


@dataclasses.dataclass(frozen=True)
class DispatchableTask:
    run_id: int
    task_key: str
    attempt: int
    not_before: datetime


async def list_dispatchable_tasks(pool: Pool, *, limit: int = 100) -> list[DispatchableTask]:
    """Released forward tasks that are due (their Job may not exist yet), oldest first."""
    async with pool.connection() as connection:
        cursor = await connection.execute(DISPATCHABLE_QUERY, (limit,))
        return [DispatchableTask(*row) for row in await cursor.fetchall()]


@dataclasses.dataclass(frozen=True)
class RunningTask:
    run_id: int
    task_key: str
    role: TaskRole
    attempt: int
    started_at: datetime | None


async def list_running_tasks(pool: Pool, *, limit: int = 500) -> list[RunningTask]:
    """Running tasks and compensators: the reconciler checks their Jobs still exist."""
    async with pool.connection() as connection:
        cursor = await connection.execute(RUNNING_QUERY, (limit,))
        return [
            RunningTask(run_id, key, TaskRole(role), attempt, started)
            for run_id, key, role, attempt, started in await cursor.fetchall()
        ]
