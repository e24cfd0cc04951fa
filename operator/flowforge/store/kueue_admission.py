"""Kueue's admission of an attempt's Job, recorded: admitted (Kueue unsuspended it) or
evicted (suspended again, so admitting once more). Neither ends the attempt: an eviction is
not a failure, and the same Job is admitted again later.

One fenced statement each (``ADMISSION_QUERY``): a compare-and-set on the running attempt
of a task that queues through Kueue, and its history event. A replayed Job event finds the
move made already and returns ``Decision.lost()``.
"""

from __future__ import annotations

from datetime import datetime

from psycopg.types.json import Jsonb

from flowforge.domain import notices
from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.lease import FENCE_CTE, Fence, refuse_stale
from flowforge.store.transaction import in_transaction

ADMISSION_QUERY = f"""
WITH {FENCE_CTE}, moved AS (
    UPDATE flowforge_task
    SET admitted_attempt = CASE WHEN %(admitted)s THEN attempt END,
        admitted_at = CASE WHEN %(admitted)s THEN %(at)s::timestamptz END,
        updated_at = now()
    WHERE run_id = %(run)s AND task_key = %(key)s AND role = %(role)s
      AND state = '{TaskState.RUNNING}' AND attempt = %(attempt)s AND admission_required
      AND (admitted_attempt IS NOT DISTINCT FROM attempt) = NOT %(admitted)s
      AND (SELECT epoch FROM fence) = %(epoch)s
    RETURNING id
), recorded AS (
    INSERT INTO flowforge_event (run_id, namespace, task_key, attempt, kind, epoch, detail)
    SELECT %(run)s, (SELECT namespace FROM flowforge_run WHERE id = %(run)s),
           %(key)s, %(attempt)s, %(kind)s, %(epoch)s, %(detail)s::jsonb FROM moved
)
SELECT (SELECT epoch FROM fence), (SELECT count(*) FROM moved)
"""


async def record_admission(
    pool: Pool,
    *,
    fence: Fence,
    run_id: int,
    job: JobRef,
    job_name: str,
    admitted: bool,
    at: datetime | None,
) -> Decision:
    """Kueue admitted (``admitted``) or evicted the Job ``job_name`` of the attempt ``job``."""

    async def decide(connection: Connection) -> Decision:
        cursor = await connection.execute(
            ADMISSION_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run_id,
                "key": job.task_key,
                "role": job.role.value,
                "attempt": job.attempt,
                "admitted": admitted,
                "at": at,
                "kind": EventKind.TASK_ADMITTED if admitted else EventKind.TASK_EVICTED,
                "detail": Jsonb({"job": job_name, "at": at.isoformat() if at else None}),
            },
        )
        row = await cursor.fetchone()
        refuse_stale(fence, None if row is None else row[0])
        if not row or not row[1]:
            return Decision.lost()
        notice = (notices.task_admitted if admitted else notices.task_evicted)(
            task_key=job.task_key, attempt=job.attempt, job=job_name
        )
        return Decision(recorded=True, notices=(notice,))

    return await in_transaction(pool, decide, single_statement=True)
