"""Runs: creating one with its whole task graph in one transaction, and reading it back.

``create_run`` writes the run, one row per forward task (roots ``ready``, the rest
``waiting`` with ``pending_dependencies`` = their number of upstreams), one row per
compensator (``not_triggered``) and every dependency edge, in one transaction: a run's
graph becomes visible all at once or not at all. A run is identified by its Kubernetes
object (namespace, name, uid); creating it again returns the existing run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.states import CompensationState, RunPhase, TaskRole, TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import StoredDefinition
from flowforge.store.errors import RunNotFoundError
from flowforge.store.events import append_event
from flowforge.store.lease import Fence, check_fence
from flowforge.store.retry import in_transaction

_RUN_COLUMNS = (
    "id, namespace, name, uid, definition_id, parameters, phase, compensating, "
    "cancel_requested, created_at, finished_at, pruned_at"
)

ACTIVE_RUNS_QUERY = (
    "SELECT id FROM flowforge_run WHERE phase IN ('pending', 'running') AND id > %s "
    "ORDER BY id LIMIT %s"
)
FIND_RUN_QUERY = (
    f"SELECT {_RUN_COLUMNS} FROM flowforge_run WHERE namespace = %s AND name = %s AND uid = %s"
)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    id: int
    namespace: str
    name: str
    uid: str
    definition_id: int
    parameters: Mapping[str, Any]
    phase: RunPhase
    compensating: bool
    cancel_requested: bool
    created_at: datetime
    finished_at: datetime | None
    pruned_at: datetime | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> RunRecord:
        values = list(row)
        values[6] = RunPhase(values[6])
        return cls(*values)


@dataclasses.dataclass(frozen=True)
class CreatedRun:
    run: RunRecord
    created: bool  # False: this Kubernetes object's run already existed


async def create_run(
    pool: Pool,
    *,
    fence: Fence,
    namespace: str,
    name: str,
    uid: str,
    definition: StoredDefinition,
    parameters: Mapping[str, Any] | None = None,
) -> CreatedRun:
    async def decide(connection: Connection) -> CreatedRun:
        await check_fence(connection, fence)
        return await insert_run(
            connection,
            fence=fence,
            namespace=namespace,
            name=name,
            uid=uid,
            definition=definition,
            parameters=parameters,
        )

    return await in_transaction(pool, decide)


async def insert_run(
    connection: Connection,
    *,
    fence: Fence,
    namespace: str,
    name: str,
    uid: str,
    definition: StoredDefinition,
    parameters: Mapping[str, Any] | None = None,
) -> CreatedRun:
    """``create_run`` inside the caller's transaction, which has checked the fence."""
    spec = definition.spec
    order = {key: index for index, key in enumerate(spec.graph.topological_order())}
    forward = spec.forward_tasks
    compensators = spec.compensators

    keys: list[str] = []
    roles: list[str] = []
    states: list[str] = []
    compensates: list[str | None] = []
    max_attempts: list[int] = []
    timeouts: list[int | None] = []
    pending: list[int] = []
    topological: list[int] = []
    for task in forward:
        keys.append(task.key)
        roles.append(TaskRole.FORWARD)
        states.append(TaskState.WAITING if task.depends_on else TaskState.READY)
        compensates.append(None)
        max_attempts.append(task.retries + 1)
        timeouts.append(task.timeout_seconds)
        pending.append(len(task.depends_on))
        topological.append(order[task.key])
    for forward_key, compensator in compensators.items():
        keys.append(compensator.key)
        roles.append(TaskRole.COMPENSATION)
        states.append(CompensationState.NOT_TRIGGERED)
        compensates.append(forward_key)
        max_attempts.append(compensator.retries + 1)
        timeouts.append(compensator.timeout_seconds)
        pending.append(0)
        topological.append(order[forward_key])
    edge_tasks = [task.key for task in forward for _ in task.depends_on]
    edge_upstreams = [upstream for task in forward for upstream in task.depends_on]

    cursor = await connection.execute(
        "INSERT INTO flowforge_run (namespace, name, uid, definition_id, parameters, phase) "
        "VALUES (%s, %s, %s, %s, %s, %s) "
        "ON CONFLICT ON CONSTRAINT flowforge_run_identity DO NOTHING "
        f"RETURNING {_RUN_COLUMNS}",
        (
            namespace,
            name,
            uid,
            definition.id,
            Jsonb(dict(parameters or {})),
            RunPhase.RUNNING,
        ),
    )
    row = await cursor.fetchone()
    if row is None:
        return CreatedRun(
            run=await _find(connection, namespace=namespace, name=name, uid=uid),
            created=False,
        )
    run = RunRecord.from_row(row)
    await connection.execute(
        """
        INSERT INTO flowforge_task (run_id, task_key, role, state, compensates_key,
            max_attempts, timeout_seconds, pending_dependencies, topological_index)
        SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[],
            %s::int[], %s::int[], %s::int[], %s::int[])
        """,
        (
            run.id,
            keys,
            [str(role) for role in roles],
            [str(state) for state in states],
            compensates,
            max_attempts,
            timeouts,
            pending,
            topological,
        ),
    )
    if edge_tasks:
        await connection.execute(
            """
            INSERT INTO flowforge_task_dependency (run_id, upstream_id, task_id)
            SELECT %(run)s, upstream.id, task.id
            FROM unnest(%(tasks)s::text[], %(upstreams)s::text[]) AS edge(task, upstream)
            JOIN flowforge_task AS task
                ON task.run_id = %(run)s AND task.task_key = edge.task
            JOIN flowforge_task AS upstream
                ON upstream.run_id = %(run)s AND upstream.task_key = edge.upstream
            """,
            {"run": run.id, "tasks": edge_tasks, "upstreams": edge_upstreams},
        )
    await append_event(
        connection,
        run_id=run.id,
        kind="run.created",
        epoch=fence.epoch,
        detail={
            "definition": f"{spec.workflow} v{spec.version}",
            "fingerprint": definition.fingerprint,
            "forwardTasks": len(forward),
            "compensators": len(compensators),
        },
    )
    return CreatedRun(run=run, created=True)


async def _find(connection: Connection, *, namespace: str, name: str, uid: str) -> RunRecord:
    cursor = await connection.execute(FIND_RUN_QUERY, (namespace, name, uid))
    row = await cursor.fetchone()
    if row is None:
        raise RunNotFoundError(run=f"{namespace}/{name} (uid {uid})")
    return RunRecord.from_row(row)


async def find_run(pool: Pool, *, namespace: str, name: str, uid: str) -> RunRecord:
    async with pool.connection() as connection:
        return await _find(connection, namespace=namespace, name=name, uid=uid)


async def get_run(pool: Pool, run_id: int) -> RunRecord:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            f"SELECT {_RUN_COLUMNS} FROM flowforge_run WHERE id = %s", (run_id,)
        )
        row = await cursor.fetchone()
    if row is None:
        raise RunNotFoundError(run=f"#{run_id}")
    return RunRecord.from_row(row)


async def list_active_runs(pool: Pool, *, after_id: int = 0, limit: int = 500) -> list[int]:
    """Ids of runs that are not finished, in pages (index ``flowforge_run_active_idx``)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(ACTIVE_RUNS_QUERY, (after_id, limit))
        return [int(run_id) for (run_id,) in await cursor.fetchall()]
