"""Retrying a finished run: a new run that reuses the work of the old one that still stands.

``flowforge retry OLD`` creates a new WorkflowRun annotated ``flowforge.io/retry-of: OLD``.
When the operator creates the new run's rows (``create_run_reusing``), every forward task
of OLD that is *reusable* starts ``succeeded`` (event ``task.reused``) instead of running
again, and the other tasks wait only for their upstreams that are not reused; all of it in
the transaction that creates the run, so no task is ever dispatched that a reuse would
have covered.

A task of OLD is reusable when it succeeded, its work was not undone (it has no compensator,
or its compensator was never triggered or was skipped because the rollback halted), and
every one of its upstreams is reusable: a task that ran on top of work that was undone is
run again after that work is redone. Reuse only applies when the new run uses the same
definition (namespace, workflow, version) as OLD; otherwise everything runs.

Runs are addressed by (namespace, name) here, as users name them; when a name was used by
several WorkflowRun objects over time, the newest run wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.states import RunPhase
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import StoredDefinition
from flowforge.store.events import append_event
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction
from flowforge.store.runs import CreatedRun, create_run, insert_run
from flowforge.store.settle import settle_locked

RETRY_OF_ANNOTATION = "flowforge.io/retry-of"

FIND_BY_NAME_QUERY = """
SELECT run.id, run.namespace, run.name, run.uid, run.phase, run.compensating,
       run.cancel_requested, run.parameters, run.created_at, run.finished_at, run.pruned_at,
       definition.id, definition.workflow, definition.version
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
WHERE run.namespace = %s AND run.name = %s
ORDER BY run.id DESC LIMIT 1
"""

LIST_QUERY = """
SELECT run.id, run.namespace, run.name, run.uid, run.phase, run.compensating,
       run.cancel_requested, run.parameters, run.created_at, run.finished_at, run.pruned_at,
       definition.id, definition.workflow, definition.version
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
WHERE run.namespace = %s
ORDER BY run.id DESC LIMIT %s
"""

REUSABLE_QUERY = """
WITH RECURSIVE candidate AS (
    SELECT forward.id, forward.task_key FROM flowforge_task AS forward
    WHERE forward.run_id = %(run)s AND forward.role = 'forward'
      AND forward.state = 'succeeded'
      AND NOT EXISTS (
          SELECT 1 FROM flowforge_task AS compensator
          WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
            AND compensator.compensates_key = forward.task_key
            AND compensator.state NOT IN ('not_triggered', 'skipped'))
), tainted (id) AS (
    SELECT task.id FROM flowforge_task AS task
    WHERE task.run_id = %(run)s AND task.role = 'forward'
      AND task.id NOT IN (SELECT id FROM candidate)
    UNION
    SELECT edge.task_id FROM flowforge_task_dependency AS edge
    JOIN tainted ON edge.upstream_id = tainted.id
)
SELECT task_key FROM candidate WHERE id NOT IN (SELECT id FROM tainted) ORDER BY task_key
"""

MARK_REUSED_QUERY = """
UPDATE flowforge_task
SET state = 'succeeded', pending_dependencies = 0, finished_at = now(), updated_at = now()
WHERE run_id = %s AND role = 'forward' AND task_key = ANY(%s)
  AND state IN ('waiting', 'ready')
RETURNING task_key
"""

# Every task that is not reused waits only for its upstreams that are not reused.
RECOUNT_QUERY = """
WITH counts AS (
    SELECT task.id, count(upstream.id) FILTER (WHERE upstream.state <> 'succeeded') AS pending
    FROM flowforge_task AS task
    LEFT JOIN flowforge_task_dependency AS edge ON edge.task_id = task.id
    LEFT JOIN flowforge_task AS upstream ON upstream.id = edge.upstream_id
    WHERE task.run_id = %s AND task.role = 'forward' AND task.state = 'waiting'
    GROUP BY task.id
)
UPDATE flowforge_task AS task
SET pending_dependencies = counts.pending,
    state = CASE WHEN counts.pending = 0 THEN 'ready' ELSE 'waiting' END,
    not_before = now(), updated_at = now()
FROM counts
WHERE task.id = counts.id AND task.pending_dependencies <> counts.pending
RETURNING task.task_key, task.state
"""

REUSED_EVENTS_QUERY = """
INSERT INTO flowforge_event (run_id, task_key, kind, epoch, detail)
SELECT %s, task_key, 'task.reused', %s, %s FROM unnest(%s::text[]) AS task_key
"""


@dataclasses.dataclass(frozen=True)
class NamedRun:
    """A run found by its name, with the identity of its definition."""

    id: int
    namespace: str
    name: str
    uid: str
    phase: RunPhase
    compensating: bool
    cancel_requested: bool
    parameters: Mapping[str, Any]
    created_at: datetime
    finished_at: datetime | None
    pruned_at: datetime | None
    definition_id: int
    workflow: str
    version: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> NamedRun:
        values = list(row)
        values[4] = RunPhase(values[4])
        return cls(*values)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


async def find_run_by_name(pool: Pool, *, namespace: str, name: str) -> NamedRun | None:
    """The newest run called ``name`` in ``namespace`` (index ``flowforge_run_identity``)."""
    async with pool.connection() as connection:
        return await _find_by_name(connection, namespace=namespace, name=name)


async def _find_by_name(connection: Connection, *, namespace: str, name: str) -> NamedRun | None:
    cursor = await connection.execute(FIND_BY_NAME_QUERY, (namespace, name))
    row = await cursor.fetchone()
    return None if row is None else NamedRun.from_row(row)


async def list_runs_by_namespace(pool: Pool, *, namespace: str, limit: int = 100) -> list[NamedRun]:
    """The newest ``limit`` runs of a namespace, newest first."""
    async with pool.connection() as connection:
        cursor = await connection.execute(LIST_QUERY, (namespace, limit))
        return [NamedRun.from_row(row) for row in await cursor.fetchall()]


async def _reusable(connection: Connection, run_id: int) -> frozenset[str]:
    cursor = await connection.execute(REUSABLE_QUERY, {"run": run_id})
    return frozenset(str(key) for (key,) in await cursor.fetchall())


async def reusable_tasks(pool: Pool, *, namespace: str, run_name: str) -> frozenset[str]:
    """Forward tasks of the run ``run_name`` that a retry would not run again (see above);
    empty when there is no such run."""
    async with pool.connection() as connection:
        run = await _find_by_name(connection, namespace=namespace, name=run_name)
        if run is None:
            return frozenset()
        return await _reusable(connection, run.id)


@dataclasses.dataclass(frozen=True)
class ReuseResult:
    reused: tuple[str, ...]
    released: tuple[str, ...]  # tasks that became ready because their upstreams were reused


async def mark_reused(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    task_keys: Collection[str],
    retry_of: str,
) -> ReuseResult:
    """Inside the transaction that created run ``run_id`` (not dispatched yet): its tasks
    ``task_keys`` become succeeded by reuse, and the rest wait for what is left."""
    if not task_keys:
        return ReuseResult(reused=(), released=())
    cursor = await connection.execute(MARK_REUSED_QUERY, (run_id, sorted(task_keys)))
    reused = tuple(sorted(str(key) for (key,) in await cursor.fetchall()))
    recount = await connection.execute(RECOUNT_QUERY, (run_id,))
    released = tuple(
        sorted(str(key) for key, state in await recount.fetchall() if state == "ready")
    )
    await connection.execute(
        REUSED_EVENTS_QUERY, (run_id, fence.epoch, Jsonb({"retryOf": retry_of}), list(reused))
    )
    await append_event(
        connection,
        run_id=run_id,
        kind="run.retry_of",
        epoch=fence.epoch,
        detail={"retryOf": retry_of, "reused": list(reused), "released": list(released)},
    )
    return ReuseResult(reused=reused, released=released)


async def create_run_reusing(
    pool: Pool,
    *,
    fence: Fence,
    namespace: str,
    name: str,
    uid: str,
    definition: StoredDefinition,
    parameters: Mapping[str, Any] | None = None,
    retry_of: str | None = None,
) -> CreatedRun:
    """``create_run``; for a retry (``retry_of`` names the old run), the reusable tasks of
    the old run start succeeded, in the same transaction."""
    if not retry_of:
        return await create_run(
            pool,
            fence=fence,
            namespace=namespace,
            name=name,
            uid=uid,
            definition=definition,
            parameters=parameters,
        )
    source_name = retry_of

    async def decide(connection: Connection) -> CreatedRun:
        await check_fence(connection, fence)
        created = await insert_run(
            connection,
            fence=fence,
            namespace=namespace,
            name=name,
            uid=uid,
            definition=definition,
            parameters=parameters,
        )
        if not created.created:
            return created
        source = await _find_by_name(connection, namespace=namespace, name=source_name)
        if source is None or source.id == created.run.id:
            return created
        if source.definition_id != definition.id:
            await append_event(
                connection,
                run_id=created.run.id,
                kind="run.retry_of",
                epoch=fence.epoch,
                detail={
                    "retryOf": source_name,
                    "reused": [],
                    "note": "another definition version: nothing reused",
                },
            )
            return created
        reusable = await _reusable(connection, source.id)
        await mark_reused(
            connection, fence=fence, run_id=created.run.id, task_keys=reusable, retry_of=source_name
        )
        # a retry with everything reused has no outcome left to settle it
        settled = await settle_locked(connection, fence=fence, run_id=created.run.id)
        if settled.finished:
            refreshed = await connection.execute(
                "SELECT phase, finished_at FROM flowforge_run WHERE id = %s", (created.run.id,)
            )
            row = await refreshed.fetchone()
            assert row is not None
            run = dataclasses.replace(created.run, phase=RunPhase(row[0]), finished_at=row[1])
            return CreatedRun(run=run, created=True)
        return created

    return await in_transaction(pool, decide)
