"""Runs: creating one with its whole task graph in one transaction, and reading it back.

``create_run`` writes the run, one row per forward task (roots ``ready``, the rest
``waiting`` with ``pending_dependencies`` = their number of upstreams; for a retry, the
reused tasks ``succeeded``; a task whose ``when`` is false ``skipped`` with reason
``ConditionFalse``, its dependents waiting for its upstreams instead: the run's shape is
``domain/expansion.py::expand`` of its definition and parameters), one row per
compensator (``not_triggered``) and every dependency edge, in one transaction: a run's graph
becomes visible all at once or not at all. A run is identified by its Kubernetes
object (namespace, name, uid); creating it again returns the existing run. A run over a
limit of its namespace or workflow is created ``Queued`` (``queue.py``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.expansion import (
    CONDITION_FALSE,
    Expansion,
    condition_false_message,
    expand,
)
from flowforge.domain.for_each import NO_ITEMS_MESSAGE, split_instance
from flowforge.domain.history import EventKind
from flowforge.domain.kueue import queued_task_keys
from flowforge.domain.queue import concurrency_key, forbidden_message, run_parallelism
from flowforge.domain.states import (
    RunPhase,
    TaskState,
)
from flowforge.domain.undo import undoes_attempted
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import StoredDefinition
from flowforge.store.duplicates import mark_duplicate_locked, original_locked
from flowforge.store.errors import ConcurrencyForbiddenError, RunNotFoundError
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence, check_fence
from flowforge.store.queue import admit_locked, lock_namespace, running_count
from flowforge.store.reuse import reused_for
from flowforge.store.run_rows import instance_rows, task_rows
from flowforge.store.settle import settle_locked
from flowforge.store.transaction import in_transaction

_RUN_COLUMNS = (
    "id, namespace, name, uid, definition_id, parameters, phase, compensating, "
    "cancel_requested, created_at, finished_at, pruned_at, recovering, duplicate_of, "
    "paused_at, deferred_cancel, final_phase, rollback_outcome"
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
    # a person recovered its halted rollback, which runs again (flowforge.store.actions)
    recovering: bool = False
    # the earlier run with the same spec.idempotencyKey whose result this one shows
    duplicate_of: int | None = None
    # since when a person has paused it (None: not paused), and a cancel that waits for
    # its resume (the reason; flowforge.store.pausing)
    paused_at: datetime | None = None
    deferred_cancel: str | None = None
    # once its outcome is decided and it has finally tasks (flowforge.store.final_tasks)
    final_phase: str | None = None
    rollback_outcome: str | None = None

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
    retry_of: str | None = None,
    requested_by: str | None = None,
    priority: int = 0,
    max_parallel_tasks: int | None = None,
    submitted_at: datetime | None = None,
    idempotency_key: str | None = None,
    namespace_uid: str | None = None,
) -> CreatedRun:
    """Create the run of a WorkflowRun object with its whole graph, in one transaction;
    ``requested_by`` is who created it (an approval gate's ``forbidSelf``); for a retry
    (``retry_of`` names the old run) the reusable tasks of the old run start succeeded
    (``reuse.py``). Creating it again returns the existing run. The run starts ``Running`` when the
    limits of its namespace and its workflow leave room and no queued run is ahead of it
    (``queue.py``), else ``Queued`` with its ``priority`` (first come first served within one:
    ``submitted_at``, the object's creation, else now); ``max_parallel_tasks`` is the run's own
    (lowering the definition's). A run with an ``idempotency_key`` that an earlier run of the
    namespace has is that run's duplicate and never executes (``duplicates.py``). ``namespace_uid``:
    the uid of the namespace the object is in (migration 15: readers show the run only while the
    namespace of that name has this uid). A ``Forbid`` workflow's run whose key is full is
    refused (``ConcurrencyForbiddenError``), nothing written."""
    spec = definition.spec
    # the run's shape (UserError when the parameters do not fit: admission refuses those)
    expansion = expand(spec, parameters or {})
    values = dict(expansion.parameters)
    key = concurrency_key(spec, values)

    async def decide(connection: Connection) -> CreatedRun:
        await check_fence(connection, fence)
        await lock_namespace(connection, namespace)
        original = None
        if idempotency_key is not None and not retry_of:
            original = await original_locked(connection, namespace=namespace, key=idempotency_key)
        cursor = await connection.execute(
            "INSERT INTO flowforge_run (namespace, name, uid, definition_id, parameters, phase, "
            "priority, max_parallel_tasks, concurrency_key, max_runs, concurrency_policy, "
            "submitted_at, idempotency_key, namespace_uid, requested_by) VALUES (%s, %s, %s, %s, "
            "%s, %s, %s, %s, %s, %s, %s, coalesce(%s, now()), %s, %s, %s) "
            "ON CONFLICT ON CONSTRAINT flowforge_run_identity DO NOTHING "
            f"RETURNING {_RUN_COLUMNS}",
            (
                namespace,
                name,
                uid,
                definition.id,
                Jsonb(values),
                RunPhase.QUEUED,
                priority,
                run_parallelism(spec, max_parallel_tasks),
                key,
                None if spec.concurrency is None else spec.concurrency.max_runs,
                None if spec.concurrency is None else spec.concurrency.policy,
                submitted_at,
                idempotency_key,
                namespace_uid,
                requested_by,
            ),
        )
        row = await cursor.fetchone()
        if row is None:
            existing = await _find(connection, namespace=namespace, name=name, uid=uid)
            return CreatedRun(run=existing, created=False)
        run = RunRecord.from_row(row)
        if original is not None:  # it never executes: no task rows
            await mark_duplicate_locked(connection, fence=fence, run_id=run.id, original=original)
            return CreatedRun(
                run=await _find(connection, namespace=namespace, name=name, uid=uid),
                created=True,
            )
        if key is not None:  # admission counted without the namespace's lock: count again
            others = await running_count(connection, namespace=namespace, key=key, but=run.id)
            refused = forbidden_message(spec, values, running=others)
            if refused is not None:
                raise ConcurrencyForbiddenError(refused)  # the run's row is rolled back
        reused: frozenset[str] = frozenset()
        if retry_of:
            reused = await reused_for(
                connection,
                fence=fence,
                run_id=run.id,
                definition=definition,
                retry_of=retry_of,
                requested_by=requested_by,
                namespace_uid=namespace_uid,
            )
        await _insert_graph(
            connection,
            fence=fence,
            run_id=run.id,
            definition=definition,
            expansion=expansion,
            reused=reused,
            retry_of=retry_of,
        )
        admission = await admit_locked(connection, fence=fence, namespace=namespace, only=run.id)
        if run.id in admission.admitted:
            run = dataclasses.replace(run, phase=RunPhase.RUNNING)
        if reused:
            # a retry with everything reused has no outcome left to settle it
            settled = await settle_locked(connection, fence=fence, run_id=run.id)
            if settled.finished:
                run = await _find(connection, namespace=namespace, name=name, uid=uid)
        return CreatedRun(run=run, created=True)

    return await in_transaction(pool, decide)


def _rows_of(tasks: list[str], keys: list[str], expansion: Expansion) -> list[str]:
    """The run's rows (``keys``) of the definition's ``tasks``: a forEach task's (and its
    compensator's) are its items'."""
    if not expansion.instances or not tasks:
        return tasks
    wanted = set(tasks)
    return [key for key in keys if split_instance(key)[0] in wanted]


async def _insert_graph(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    definition: StoredDefinition,
    expansion: Expansion,
    reused: frozenset[str],
    retry_of: str | None,
) -> None:
    spec = definition.spec
    # each row: key, role, state, compensated key, attempts, timeout, pending, position,
    # gate (`run_rows.task_rows`), then a forEach item's group, item key, item, and its group's
    # limits (NULLs elsewhere). The rows travel as one JSON document: json.dumps writes it far
    # faster than psycopg quotes text arrays element by element, where a 200-item fan-out
    # spent most of its creation time
    by_key = {row[0]: row[1:] for row in instance_rows(spec, expansion)}
    none = (None,) * 5
    rows = [[*row, *by_key.get(row[0], none)] for row in task_rows(spec, expansion, reused)]
    keys = [row[0] for row in rows]
    # the run counts its rows in the same statement (``holdings.py`` sums them); the rows'
    # ids come back, so the edges below are written by id with no join: a join of the new
    # rows by key was planned from statistics that knew nothing of them (a 10,000-task run
    # took minutes once the table had been analysed small)
    cursor = await connection.execute(
        """
        WITH inserted AS (
        INSERT INTO flowforge_task (run_id, namespace, task_key, role, state, compensates_key,
            max_attempts, timeout_seconds, pending_dependencies, topological_index,
            started_at, finished_at, item_group, item_key, item, group_max_parallel,
            group_tolerated, approval)
        SELECT %s, (SELECT namespace FROM flowforge_run WHERE id = %s), row ->> 0, row ->> 1,
               row ->> 2, row ->> 3, (row ->> 4)::int, (row ->> 5)::int, (row ->> 6)::int,
               (row ->> 7)::int,
               CASE WHEN row ->> 2 = %s THEN now() END,
               CASE WHEN row ->> 2 IN (%s, %s) THEN now() END,
               row ->> 9, row ->> 10, (row ->> 11)::jsonb, (row ->> 12)::int,
               (row ->> 13)::int, (row ->> 8)::bool
        FROM jsonb_array_elements(%s::jsonb) AS rows(row)
        RETURNING id, task_key
        ), counted AS (
        UPDATE flowforge_run SET task_rows = (SELECT count(*) FROM inserted) WHERE id = %s
        )
        SELECT json_object_agg(task_key, id)::text FROM inserted
        """,
        (
            run_id,
            run_id,
            TaskState.SUCCEEDED,
            TaskState.SUCCEEDED,
            TaskState.SKIPPED,
            json.dumps(rows),
            run_id,
        ),
    )
    found = await cursor.fetchone()
    ids: dict[str, int] = json.loads(found[0]) if found and found[0] else {}
    queued = _rows_of(queued_task_keys(spec), keys, expansion)
    if queued:  # their Jobs wait for Kueue's admission (admitting until admitted)
        await connection.execute(
            "UPDATE flowforge_task SET admission_required = true "
            "WHERE run_id = %s AND task_key = ANY(%s)",
            (run_id, queued),
        )
    skipped = sorted(expansion.skipped | expansion.empty)
    if skipped:  # recorded with the reason people see (`domain/expansion.py`)
        await connection.execute(
            "UPDATE flowforge_task AS task SET last_error = skip.message "
            "FROM unnest(%s::text[], %s::text[]) AS skip(key, message) "
            "WHERE task.run_id = %s AND task.task_key = skip.key",
            (
                skipped,
                [
                    condition_false_message(str(spec.task(key).when))
                    if key in expansion.skipped
                    else NO_ITEMS_MESSAGE
                    for key in skipped
                ],
                run_id,
            ),
        )
    attempted = _rows_of(undoes_attempted(spec), keys, expansion)
    if attempted:  # compensateOn: Attempted (flowforge.domain.undo)
        await connection.execute(
            "UPDATE flowforge_task SET compensate_attempted = true "
            "WHERE run_id = %s AND task_key = ANY(%s)",
            (run_id, attempted),
        )
    edges = [
        (ids[upstream], ids[key])
        for key, upstreams in expansion.dependencies.items()
        for upstream in upstreams
    ]
    if edges:
        await connection.execute(
            "INSERT INTO flowforge_task_dependency (run_id, upstream_id, task_id) "
            "SELECT %s, (edge ->> 0)::bigint, (edge ->> 1)::bigint "
            "FROM jsonb_array_elements(%s::jsonb) AS edges(edge)",
            (run_id, json.dumps(edges)),
        )
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_CREATED,
        epoch=fence.epoch,
        detail={
            "definition": f"{spec.workflow} v{spec.version}",
            "fingerprint": definition.fingerprint,
            "forwardTasks": len(spec.forward_tasks),
            "compensators": len(spec.compensators),
        }
        | ({"conditionSkipped": len(expansion.skipped)} if expansion.skipped else {})
        | ({"items": len(expansion.instances)} if expansion.instances else {}),
    )
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_SKIPPED,
        epoch=fence.epoch,
        task_keys=sorted(expansion.skipped),
        detail={"reason": CONDITION_FALSE},
    )
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_AWAITING_APPROVAL,
        epoch=fence.epoch,
        task_keys=[row[0] for row in rows if row[2] == TaskState.AWAITING],
    )
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_REUSED,
        epoch=fence.epoch,
        task_keys=sorted(reused),
        detail={"retryOf": retry_of},
    )


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
