"""Approval gates in the store (``flowforge.domain.approval``): their timeouts and failures.

A gate is a forward row with ``approval`` set. It is released like any task (the success
statement, ``outcomes.py``, or a tolerated forEach failure, ``items.py``) but becomes
``awaiting``, never ``ready`` or ``running`` (the table's CHECK constraints hold that), so no
dispatch ever picks it and no Job is ever made for it. Its timeout counts from its release
(``not_before``): :data:`GATE_DEADLINE`. The moves that end a wait:

- people pass it: the success statement from ``awaiting`` (``approvals.py``);
- a rejection, or the deadline passed (``expire_gates_locked``, run by every settle of a
  run whose definition has gates, so the wake-up at the deadline and the reconciler's pass
  both apply it; the engine's settles of other runs skip it, ``gates=False``): it fails
  for good (:func:`fail_gate_locked`), what waits downstream is skipped and the settle
  that follows starts the rollback;
- a cancel: it is cancelled with the run's other unresolved tasks (``stopping.py``).
"""

from __future__ import annotations

from datetime import datetime

from flowforge.domain import notices
from flowforge.domain.approval import GateReason
from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskState
from flowforge.store import queries
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_event, append_task_events
from flowforge.store.lease import Fence

# when an awaiting gate times out (NULL: it has no timeout); over a row of flowforge_task
GATE_DEADLINE = "not_before + make_interval(secs => timeout_seconds)"

OVERDUE_QUERY = f"""
SELECT id, task_key, timeout_seconds FROM flowforge_task
WHERE run_id = %s AND role = 'forward' AND state = '{TaskState.AWAITING}'
  AND {GATE_DEADLINE} <= now()
ORDER BY id
FOR NO KEY UPDATE
"""


async def fail_gate_locked(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    task_id: int,
    task_key: str,
    reason: GateReason,
    message: str,
) -> Decision:
    """Inside a transaction that holds the run's lock: the awaiting gate fails for good and
    what waits downstream of it is skipped (the caller settles the run: its rollback)."""
    cursor = await connection.execute(
        f"UPDATE flowforge_task SET state = '{TaskState.FAILED}', finished_at = now(), "
        "updated_at = now(), last_error = %s, last_attempt_started = false "
        f"WHERE id = %s AND state = '{TaskState.AWAITING}' RETURNING attempt",
        (f"{reason.value}: {message}"[:1000], task_id),
    )
    row = await cursor.fetchone()
    if row is None:
        return Decision.lost()
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.TASK_FAILED,
        epoch=fence.epoch,
        task_key=task_key,
        attempt=int(row[0]),
        detail={"reason": reason.value, "message": message},
    )
    skipped_cursor = await connection.execute(queries.SKIP_DOWNSTREAM_QUERY, {"task": task_id})
    skipped = tuple(sorted(str(key) for (key,) in await skipped_cursor.fetchall()))
    await append_task_events(
        connection, run_id=run_id, kind=EventKind.TASK_SKIPPED, epoch=fence.epoch, task_keys=skipped
    )
    notice = notices.gate_failed(
        gate=task_key, reason=reason.value, message=message, skipped=skipped
    )
    return Decision(recorded=True, notices=(notice,))


async def expire_gates_locked(connection: Connection, *, fence: Fence, run_id: int) -> Decision:
    """Inside a transaction that holds the run's lock: every awaiting gate of the run whose
    timeout has passed fails (``ApprovalTimedOut``); ``Decision.lost()`` when none has."""
    cursor = await connection.execute(OVERDUE_QUERY, (run_id,))
    decision = Decision.lost()
    for task_id, task_key, timeout in await cursor.fetchall():
        decision = decision.then(
            await fail_gate_locked(
                connection,
                fence=fence,
                run_id=run_id,
                task_id=int(task_id),
                task_key=str(task_key),
                reason=GateReason.TIMED_OUT,
                message=f"nobody decided within {timeout} s",
            )
        )
    return decision


async def awaiting_gates(pool: Pool, run_id: int) -> list[tuple[str, datetime]]:
    """The run's approval gates that wait for people, and since when, in key order."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT task_key, not_before FROM flowforge_task WHERE run_id = %s "
            f"AND role = 'forward' AND state = '{TaskState.AWAITING}' ORDER BY task_key",
            (run_id,),
        )
        return [(str(key), since) for key, since in await cursor.fetchall()]
