"""Cancelling a run: nothing new starts, and what succeeded is rolled back.

``cancel_run`` records the request, cancels every unresolved forward task (running
attempts end ``cancelled``, recorded before their Jobs are deleted) under id-ordered row
locks, and settles the run, which triggers the compensators of what succeeded. When the
WorkflowRun object itself is gone (``rollback=False``) no Job of the run can exist any
more (the garbage collector removes every Job it owns), so the compensators (and ``finally``
tasks) that have not finished are skipped too and the run finishes ``Cancelled`` at once.
A run a person paused keeps the cancel for its resume (``pausing.py``), unless its object
is gone.
"""

from __future__ import annotations

from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.states import (
    TERMINAL_COMPENSATION_STATES,
    TERMINAL_RUN_PHASES,
    CompensationState,
    RunPhase,
    sql_list,
)
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_task_events
from flowforge.store.final_tasks import skip_finals_locked
from flowforge.store.lease import Fence
from flowforge.store.moves import locked_move
from flowforge.store.pausing import defer_cancel_locked
from flowforge.store.stopping import request_cancel

ABANDON_QUERY = f"""
UPDATE flowforge_task SET state = '{CompensationState.SKIPPED}', finished_at = now(),
    updated_at = now(), last_error = %(reason)s
WHERE run_id = %(run)s AND role = 'compensation'
  AND state NOT IN {sql_list(TERMINAL_COMPENSATION_STATES)}
RETURNING task_key
"""


async def cancel_run(
    pool: Pool, *, fence: Fence, run_id: int, reason: str, rollback: bool = True
) -> Decision:
    """Stop the run (see the module); ``Decision.lost()`` when it is over already or was
    cancelled before (and, with ``rollback=False``, has nothing left to skip)."""

    async def move(connection: Connection, namespace: str) -> Decision:
        cursor = await connection.execute(
            "SELECT phase, cancel_requested FROM flowforge_run WHERE id = %s FOR NO KEY UPDATE",
            (run_id,),
        )
        row = await cursor.fetchone()
        if row is None or RunPhase(row[0]) in TERMINAL_RUN_PHASES:
            return Decision.lost()
        decision = Decision.lost()
        if rollback and not row[1]:  # a paused run keeps the cancel for its resume
            deferred = await defer_cancel_locked(
                connection, fence=fence, run_id=run_id, reason=reason
            )
            if deferred is not None:
                return deferred
        if not row[1]:
            decision = await request_cancel(connection, fence=fence, run_id=run_id, reason=reason)
        if not rollback:
            decision = decision.then(
                await _abandon(connection, fence=fence, run_id=run_id, reason=reason)
            )
        return decision

    # the cancelled tasks' slots are free for the namespace's other runs
    return await locked_move(pool, fence=fence, run_id=run_id, move=move, settle=True, fill=True)


async def _abandon(connection: Connection, *, fence: Fence, run_id: int, reason: str) -> Decision:
    cursor = await connection.execute(ABANDON_QUERY, {"run": run_id, "reason": reason[:1000]})
    skipped = sorted(str(key) for (key,) in await cursor.fetchall())
    await append_task_events(
        connection,
        run_id=run_id,
        kind=EventKind.COMPENSATION_SKIPPED,
        epoch=fence.epoch,
        task_keys=skipped,
    )
    # its finally tasks too: their Jobs went with the object (the run then settles, even
    # when none of them was running)
    finals = await skip_finals_locked(connection, fence=fence, run_id=run_id, reason=reason)
    return Decision(recorded=bool(skipped)).then(finals)
