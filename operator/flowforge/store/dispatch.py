"""Dispatching: released forward tasks whose time has come move to running.

A task is released (``waiting -> ready``, or straight to ``running`` on the success hot
path in ``outcomes.py``) on proof that every upstream succeeded; a retry is ``ready``
until its backoff is over. ``dispatch_due`` moves every due one of a run to running in one
statement, however many there are (a 10,000-task fan-out's roots) and its limits allow
(``queue.py``), and returns what their Jobs need; for a queued run it serves the queue.
Creating the Jobs is the caller's, after the commit; ``record_job_created`` then notes that
a Job exists for an attempt, and its uid, which is how the reconciler tells "never created"
(create it) from "vanished" (a lost attempt), and how the operator tells its own Job from a
copy with the same labels (only the recorded uid counts).
"""

from __future__ import annotations

import dataclasses

from psycopg.types.json import Jsonb

from flowforge.domain import notices
from flowforge.domain.decision import Decision, RunDecision
from flowforge.domain.history import EventKind
from flowforge.domain.states import RunPhase, TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.lease import FENCE_CTE, Fence, check_fence, refuse_stale
from flowforge.store.moves import locked_move
from flowforge.store.queue import (
    dispatch_locked,
    lock_namespace,
    serve_locked,
)
from flowforge.store.settle import settle_locked
from flowforge.store.transaction import in_transaction


async def dispatch_due_locked(connection: Connection, *, fence: Fence, run_id: int) -> Decision:
    """Inside a transaction that passed the fence check and holds the namespace's lock
    (locks the run row): its due ready tasks, within its limits (``queue.py``)."""
    return await dispatch_locked(connection, fence=fence, run_id=run_id)


async def dispatch_due(pool: Pool, *, fence: Fence, run_id: int) -> Decision:
    """Move every released task of the run whose time has come to running, as many as its
    limits allow (none while the run is queued, cancelling or over); ``wake_at`` is when
    the next one's backoff is over. A queued run (just created, or seen again after a
    restart) is looked at for admission first: the namespace's queue is served (this run,
    if its turn has come, and any other whose turn it is; the places of the others are
    re-projected), and a ``Replace`` run whose key is full cancels the oldest running run
    of it."""

    async def move(connection: Connection, namespace: str) -> Decision:
        cursor = await connection.execute(
            "SELECT phase = %s FROM flowforge_run WHERE id = %s", (RunPhase.QUEUED, run_id)
        )
        row = await cursor.fetchone()
        if row is None or not row[0]:
            started = await dispatch_locked(connection, fence=fence, run_id=run_id)
            if started.recorded:
                return started
            # nothing to start: a run whose every task was skipped at creation (``when``
            # false) has nothing left to wait for, and finishes here
            return await settle_locked(connection, fence=fence, run_id=run_id)
        admission, others = await serve_locked(
            connection,
            fence=fence,
            namespace=namespace,
            settle=settle_locked,
            changed=True,
            skip=run_id,
        )
        own = Decision(recorded=True)
        for other in others:  # a duplicate whose original has finished: it took its phase
            if other.run_id == run_id:
                own = other.decision
        others = tuple(other for other in others if other.run_id != run_id)
        if run_id in admission.admitted:
            started = await dispatch_locked(connection, fence=fence, run_id=run_id)
            own = dataclasses.replace(
                started, recorded=True, notices=(*started.notices, notices.run_admitted())
            )
        return own.also(others)

    return await locked_move(pool, fence=fence, run_id=run_id, move=move)


async def serve_queue(pool: Pool, *, fence: Fence, namespace: str) -> tuple[RunDecision, ...]:
    """One pass over the namespace's queue (the reconciler's backstop, once a pass, however
    many runs wait): what may start starts, a Replace run's victims are cancelled."""

    async def decide(connection: Connection) -> tuple[RunDecision, ...]:
        await check_fence(connection, fence)
        await lock_namespace(connection, namespace)
        _, decisions = await serve_locked(
            connection, fence=fence, namespace=namespace, settle=settle_locked
        )
        return decisions

    return await in_transaction(pool, decide)


JOB_CREATED_QUERY = f"""
WITH {FENCE_CTE}, recorded AS (
    INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, (SELECT namespace FROM flowforge_run WHERE id = %(run)s),
           %(key)s, %(attempt)s, '{EventKind.TASK_JOB_CREATED}', epoch, %(detail)s
    FROM fence WHERE epoch = %(epoch)s
)
SELECT (SELECT epoch FROM fence),
       (SELECT state = '{TaskState.CANCELLED}' AND attempt = %(attempt)s
        FROM flowforge_task WHERE run_id = %(run)s AND task_key = %(key)s)
"""


async def record_job_created(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    task_key: str,
    attempt: int,
    job: str,
    uid: str,
    created: bool,
) -> bool:
    """Note that the Job of an attempt exists, and its uid (``created`` False: it already
    existed, and the caller checked that it is the run's).
    One fenced statement, one round trip. Returns whether the attempt was cancelled meanwhile: a
    cancel that committed between the dispatch and the Job's creation found no Job to
    delete, so the caller deletes the one it just made."""

    async def decide(connection: Connection) -> bool:
        cursor = await connection.execute(
            JOB_CREATED_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": task_key,
                "attempt": attempt,
                "detail": Jsonb({"job": job, "created": created, "uid": uid}),
            },
        )
        row = await cursor.fetchone()
        refuse_stale(fence, None if row is None else row[0])
        return bool(row is not None and row[1])

    return await in_transaction(pool, decide, single_statement=True)
