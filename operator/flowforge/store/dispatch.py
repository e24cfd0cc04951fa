"""Dispatching: released forward tasks whose time has come move to running.

A task is released (``waiting -> ready``, or straight to ``running`` on the success hot
path in ``outcomes.py``) on proof that every upstream succeeded; a retry is ``ready``
until its backoff is over. ``dispatch_due`` moves every due one of a run to running in one
statement, however many there are (a 10,000-task fan-out's roots) and its limits allow
(``queue.py``), and returns what their Jobs need; for a queued run it serves the queue.
Creating the Jobs is the caller's, after the commit; ``record_jobs_created`` then notes, in
one statement for all the Jobs of a decision, that a Job exists for each attempt, and its
uid, which is how the reconciler tells "never created" (create it) from "vanished" (a lost
attempt), and how the operator tells its own Job from a copy with the same labels (only
the recorded uid counts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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
    limits allow (none while the run is queued, cancelling or over); ``wake_in``: the
    seconds until the next one's backoff is over. A queued run (just created, or seen again after a
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


@dataclasses.dataclass(frozen=True)
class JobCreated:
    """A Job that exists for a running attempt: its name and uid (``created`` False: it
    existed already, and the caller checked that it is the run's)."""

    task_key: str
    attempt: int
    job: str
    uid: str
    created: bool


# one ``task.job_created`` event per Job, in the order given, under the fence; and which of
# the attempts a cancel moved on meanwhile (by their place in the arrays, from 1)
JOBS_CREATED_QUERY = f"""
WITH {FENCE_CTE}, job AS (
    SELECT * FROM unnest(%(keys)s::text[], %(attempts)s::integer[], %(details)s::jsonb[])
        WITH ORDINALITY AS job (task_key, attempt, detail, place)
), recorded AS (
    INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, (SELECT namespace FROM flowforge_run WHERE id = %(run)s),
           job.task_key, job.attempt, '{EventKind.TASK_JOB_CREATED}', fence.epoch, job.detail
    FROM fence, job WHERE fence.epoch = %(epoch)s
    ORDER BY job.place
)
SELECT (SELECT epoch FROM fence),
       ARRAY(SELECT job.place FROM job JOIN flowforge_task AS task
             ON task.run_id = %(run)s AND task.task_key = job.task_key
             WHERE task.state = '{TaskState.CANCELLED}' AND task.attempt = job.attempt)
"""


async def record_jobs_created(
    pool: Pool, *, fence: Fence, run_id: int, jobs: Sequence[JobCreated]
) -> frozenset[tuple[str, int]]:
    """Note that the Jobs of the run's attempts exist, and their uids: one fenced statement,
    one round trip, however many Jobs one decision created. Returns the attempts (task,
    attempt) that were cancelled meanwhile: a cancel that committed between the dispatch
    and the Jobs' creation found no Job to delete, so the caller deletes the ones it made."""

    async def decide(connection: Connection) -> frozenset[tuple[str, int]]:
        cursor = await connection.execute(
            JOBS_CREATED_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "keys": [job.task_key for job in jobs],
                "attempts": [job.attempt for job in jobs],
                "details": [
                    Jsonb({"job": job.job, "created": job.created, "uid": job.uid}) for job in jobs
                ],
            },
        )
        current, cancelled = await cursor.fetchone() or (None, ())
        refuse_stale(fence, current)
        return frozenset((jobs[place - 1].task_key, jobs[place - 1].attempt) for place in cancelled)

    return await in_transaction(pool, decide, single_statement=True)
