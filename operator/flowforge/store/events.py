"""The append-only history of runs and tasks (a trigger refuses updates)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.history import EventKind
from flowforge.store.connection import Connection, Pool

# an event row carries its run's namespace (row-level security reads it; migration 8)
RUN_NAMESPACE = "(SELECT namespace FROM flowforge_run WHERE id = %s)"

HISTORY_QUERY = (
    "SELECT id, run_id, kind, task_key, attempt, epoch, detail, recorded_at "
    "FROM flowforge_event WHERE run_id = %s AND id > %s ORDER BY id"
)


@dataclasses.dataclass(frozen=True)
class Event:
    id: int
    run_id: int
    kind: str
    task_key: str | None
    attempt: int | None
    epoch: int | None
    detail: Mapping[str, Any]
    recorded_at: datetime


async def append_event(
    connection: Connection,
    *,
    run_id: int,
    kind: EventKind,
    epoch: int | None,
    task_key: str | None = None,
    attempt: int | None = None,
    detail: Mapping[str, Any] | None = None,
) -> None:
    await connection.execute(
        "INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, detail) "
        f"VALUES (%s, {RUN_NAMESPACE}, %s, %s, %s, %s, %s)",
        (run_id, run_id, task_key, attempt, kind, epoch, Jsonb(dict(detail or {}))),
    )


async def append_task_events(
    connection: Connection,
    *,
    run_id: int,
    kind: EventKind,
    epoch: int | None,
    task_keys: Sequence[str],
    detail: Mapping[str, Any] | None = None,
) -> None:
    """One event of ``kind`` per task, in one statement (a release or skip of many tasks)."""
    if not task_keys:
        return
    await connection.execute(
        "INSERT INTO flowforge_event (run_id, namespace, task_key, kind, epoch, detail) "
        f"SELECT %s, {RUN_NAMESPACE}, task_key, %s, %s, %s FROM unnest(%s::text[]) AS task_key",
        (run_id, run_id, kind, epoch, Jsonb(dict(detail or {})), list(task_keys)),
    )


async def run_history(pool: Pool, run_id: int, *, after_id: int = 0) -> list[Event]:
    """A run's events in the order they were recorded (index ``flowforge_event_run_idx``)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(HISTORY_QUERY, (run_id, after_id))
        return [Event(*row) for row in await cursor.fetchall()]
