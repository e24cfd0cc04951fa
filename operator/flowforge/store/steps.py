"""Ending an attempt of a one-at-a-time task: a rollback's compensator (``outcomes.py``) or a
``finally`` task (``final_tasks.py``), under the run's lock.

The attempt succeeded, failed with attempts left (the next one is scheduled after the
backoff: attempt + 1, ``not_before``), or failed for good; one statement records it and
one event says so. The next of them starts at the settle that follows.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from flowforge.domain.decision import JobRef
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, TaskRole, TaskState
from flowforge.store.attempts import seconds_until
from flowforge.store.connection import Connection
from flowforge.store.events import append_event
from flowforge.store.lease import Fence

# ``keep``: a success keeps the last error of the attempts before it
END_STEP_QUERY = f"""
UPDATE flowforge_task SET state = %(state)s, updated_at = now(),
    attempt = CASE WHEN %(retry)s THEN attempt + 1 ELSE attempt END,
    not_before = CASE WHEN %(retry)s THEN now() + %(delay)s ELSE not_before END,
    finished_at = CASE WHEN %(retry)s THEN NULL ELSE now() END,
    last_error = coalesce(%(error)s, CASE WHEN %(keep)s THEN last_error END)
WHERE id = %(id)s RETURNING {seconds_until("not_before")}
"""


@dataclasses.dataclass(frozen=True)
class Ends:
    """Where an attempt's end moves a task of one role, and the event of each move."""

    succeeded: tuple[str, EventKind]
    retried: tuple[str, EventKind]
    failed: tuple[str, EventKind]


ENDS = {
    TaskRole.COMPENSATION: Ends(
        succeeded=(CompensationState.SUCCEEDED, EventKind.COMPENSATION_SUCCEEDED),
        retried=(CompensationState.PENDING, EventKind.COMPENSATION_ATTEMPT_FAILED),
        failed=(CompensationState.FAILED, EventKind.COMPENSATION_FAILED),
    ),
    TaskRole.FINALLY: Ends(
        succeeded=(TaskState.SUCCEEDED, EventKind.FINALLY_SUCCEEDED),
        retried=(TaskState.READY, EventKind.FINALLY_ATTEMPT_FAILED),
        failed=(TaskState.FAILED, EventKind.FINALLY_FAILED),
    ),
}


@dataclasses.dataclass(frozen=True)
class Ended:
    state: str  # the task's state now
    wake_in: float | None  # a retry: seconds until its backoff is over (``seconds_until``)


async def end_step_locked(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    task_id: int,
    job: JobRef,
    succeeded: bool,
    delay: timedelta | None,
    error: str,
    keep_error: bool,
    detail: dict[str, object],
) -> Ended:
    """Record that the attempt ``job`` of the task row ``task_id`` ended: ``succeeded``, or
    failed with ``error``, to be retried after ``delay`` when that is not None. A success
    clears the task's last error, or keeps it (``keep_error``)."""
    ends = ENDS[job.role]
    retry = delay is not None and not succeeded
    state, kind = ends.succeeded if succeeded else ends.retried if retry else ends.failed
    cursor = await connection.execute(
        END_STEP_QUERY,
        {
            "state": state,
            "retry": retry,
            "delay": delay,
            "error": None if succeeded else error[:1000],
            "keep": keep_error,
            "id": task_id,
        },
    )
    row = await cursor.fetchone()
    await append_event(
        connection,
        run_id=run_id,
        kind=kind,
        epoch=fence.epoch,
        task_key=job.task_key,
        attempt=job.attempt,
        detail=detail,
    )
    return Ended(state=state, wake_in=row[0] if row is not None and retry else None)
