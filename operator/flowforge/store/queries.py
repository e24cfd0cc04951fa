"""Read-only queries: task rows, progress counts, outcomes, and the reconciler's work lists.

Each query is served by one index (asserted by ``tests/store/test_indexes.py``):

- ``run_progress`` / ``forward_counts``: ``flowforge_task_progress_idx (run_id, role,
  state)``, index-only.
- ``list_tasks``: ``flowforge_task_identity (run_id, task_key)``; ``active_tasks``:
  ``flowforge_task_progress_idx``.
- ``latest_outcomes``: ``flowforge_event_run_idx``; ``recorded_jobs`` /
  ``job_created_attempts`` / ``recorded_job_uid`` / ``recorded_job_age``:
  ``flowforge_event_job_created_idx``.
- ``find_run_id_by_uid``: ``flowforge_run_identity``; ``find_run_id_by_uid_anywhere``:
  ``flowforge_run_uid_idx``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from flowforge.domain.expansion import CONDITION_FALSE
from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.kueue import shown_state
from flowforge.domain.projection import TaskCounts
from flowforge.domain.states import (
    ACTIVE_TASK_STATES,
    CompensationState,
    TaskRole,
    TaskState,
    sql_list,
)
from flowforge.domain.undo import UndoOf
from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import RunNotFoundError

PROGRESS_QUERY = (
    "SELECT role, state, count(*) FROM flowforge_task WHERE run_id = %s GROUP BY role, state"
)
FORWARD_COUNTS_QUERY = (
    "SELECT state, count(*) FROM flowforge_task WHERE run_id = %s AND role = 'forward' "
    "GROUP BY state"
)

# a task row that is a forEach item failed within its task's tolerance: counted as
# tolerated, not failed (``TaskCounts.tolerated``), wherever task rows are counted
TOLERATED = "tolerated"
TOLERATED_FAILURE = f"role = 'forward' AND state = '{TaskState.FAILED}' AND tolerated"
# a forward task skipped at creation because its ``when`` was false (`domain/expansion.py`):
# a part of the skipped ones (``TaskCounts.condition_false``)
CONDITION_FALSE_TASK = (
    f"role = 'forward' AND state = '{TaskState.SKIPPED}' "
    f"AND starts_with(last_error, '{CONDITION_FALSE}:')"
)
# what retention keeps them as, apart from the other skipped tasks (``kept_states`` folds
# them back)
CONDITION_FALSE_KEPT = "conditionFalse"
# the state a task row is counted in when its run is pruned (reads every row it counts)
COUNTED_STATE = (
    f"CASE WHEN {TOLERATED_FAILURE} THEN '{TOLERATED}' "
    f"WHEN {CONDITION_FALSE_TASK} THEN '{CONDITION_FALSE_KEPT}' ELSE state END"
)


def kept_states(by_state: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Forward counts by state as retention kept them: (the counts with the condition-false
    tasks among the skipped, how many those are)."""
    states = dict(by_state)
    condition_false = states.pop(CONDITION_FALSE_KEPT, 0)
    if condition_false:
        states[TaskState.SKIPPED] = states.get(TaskState.SKIPPED, 0) + condition_false
    return states, condition_false


def tolerated_count(run: str) -> str:
    """SQL: how many tasks of the run ``run`` (a parameter, or an outer query's column) are
    tolerated failures; the progress index finds the failed ones, and only they are read."""
    return f"SELECT count(*) FROM flowforge_task WHERE run_id = {run} AND {TOLERATED_FAILURE}"


# read only when some failed
TOLERATED_COUNT_QUERY = tolerated_count("%s")


@dataclasses.dataclass(frozen=True)
class RunProgress:
    forward: TaskCounts
    compensation: Mapping[CompensationState, int]


def _progress_from_counts(counts: Mapping[tuple[str, str], int]) -> RunProgress:
    forward, condition_false = kept_states(
        {state: n for (role, state), n in counts.items() if role == TaskRole.FORWARD}
    )
    compensation = {
        CompensationState(state): n
        for (role, state), n in counts.items()
        if role == TaskRole.COMPENSATION
    }
    return RunProgress(
        forward=TaskCounts(total=sum(forward.values()), condition_false=condition_false, **forward),
        compensation=compensation,
    )


# skipped forward tasks whose ``when`` was false at creation (`domain/expansion.py`)
CONDITION_FALSE_COUNT_QUERY = (
    f"SELECT count(*) FROM flowforge_task WHERE run_id = %s AND {CONDITION_FALSE_TASK}"
)


async def _with_condition_false(
    connection: Connection, run_id: int, counts: TaskCounts
) -> TaskCounts:
    """``counts`` with its condition-skipped tasks counted (only a run with skips asks)."""
    if not counts.skipped:
        return counts
    cursor = await connection.execute(CONDITION_FALSE_COUNT_QUERY, (run_id,))
    row = await cursor.fetchone()
    return dataclasses.replace(counts, condition_false=int(row[0]) if row else 0)


async def _with_tolerated(connection: Connection, run_id: int, counts: TaskCounts) -> TaskCounts:
    """``counts`` with the forEach items that failed within their tolerance moved out of
    ``failed`` into ``tolerated`` (only a run with failures asks)."""
    if not counts.failed:
        return counts
    cursor = await connection.execute(TOLERATED_COUNT_QUERY, (run_id,))
    row = await cursor.fetchone()
    tolerated = int(row[0]) if row else 0
    return dataclasses.replace(counts, failed=counts.failed - tolerated, tolerated=tolerated)


async def run_progress(pool: Pool, run_id: int) -> RunProgress:
    """Counts by state for one run, from one index-only query (or the counts kept at
    retention, once the task rows are gone)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(PROGRESS_QUERY, (run_id,))
        rows = await cursor.fetchall()
        if not rows:
            kept = await connection.execute(
                "SELECT final_counts FROM flowforge_run WHERE id = %s", (run_id,)
            )
            kept_row = await kept.fetchone()
            if kept_row is None:
                raise RunNotFoundError(run=f"#{run_id}")
            return progress_from_kept_counts(kept_row[0])
        progress = _progress_from_counts(
            {(str(role), str(state)): int(n) for role, state, n in rows}
        )
        forward = await _with_condition_false(connection, run_id, progress.forward)
        progress = dataclasses.replace(
            progress, forward=await _with_tolerated(connection, run_id, forward)
        )
        if not progress.forward.running:
            return progress
        admitting = await connection.execute(ADMITTING_COUNT_QUERY, (run_id,))
        admitting_row = await admitting.fetchone()
    return dataclasses.replace(
        progress,
        forward=progress.forward.with_admitting(int(admitting_row[0]) if admitting_row else 0),
    )


def progress_from_kept_counts(document: Mapping[str, Mapping[str, int]] | None) -> RunProgress:
    counts = {
        (role, state): int(n)
        for role, by_state in (document or {}).items()
        for state, n in by_state.items()
    }
    return _progress_from_counts(counts)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    run_id: int
    task_key: str
    role: TaskRole
    state: str
    compensates_key: str | None
    attempt: int
    max_attempts: int
    timeout_seconds: int | None
    pending_dependencies: int
    not_before: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    # Kueue: the task's Jobs queue through Kueue, and its current attempt's Job is admitted
    admission_required: bool = False
    admitted: bool = False

    @property
    def shown_state(self) -> str:
        """The state people see: ``admitting`` while a Kueue attempt is not admitted."""
        return str(
            shown_state(
                self.state, admission_required=self.admission_required, admitted=self.admitted
            )
        )

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> TaskRecord:
        values = list(row)
        values[2] = TaskRole(values[2])
        return cls(*values)


_TASK_COLUMNS = (
    "run_id, task_key, role, state, compensates_key, attempt, max_attempts, timeout_seconds, "
    "pending_dependencies, not_before, started_at, finished_at, last_error, "
    "admission_required, admitted_attempt IS NOT DISTINCT FROM attempt"
)


async def list_tasks(pool: Pool, run_id: int) -> list[TaskRecord]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            f"SELECT {_TASK_COLUMNS} FROM flowforge_task WHERE run_id = %s "
            "ORDER BY role DESC, topological_index, task_key",
            (run_id,),
        )
        return [TaskRecord.from_row(row) for row in await cursor.fetchall()]


async def list_forward_tasks(pool: Pool, run_id: int) -> list[TaskRecord]:
    """A run's forward tasks in topological order (the status's per-task summary)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            f"SELECT {_TASK_COLUMNS} FROM flowforge_task WHERE run_id = %s AND role = 'forward' "
            "ORDER BY topological_index, task_key",
            (run_id,),
        )
        return [TaskRecord.from_row(row) for row in await cursor.fetchall()]


ACTIVE_TASKS_QUERY = (
    f"SELECT {_TASK_COLUMNS} FROM flowforge_task "
    f"WHERE run_id = %s AND state IN {sql_list(ACTIVE_TASK_STATES)}"
)


async def active_tasks(pool: Pool, run_id: int) -> list[TaskRecord]:
    """Rows the reconciler looks at: released, running, or compensators awaiting their turn."""
    async with pool.connection() as connection:
        cursor = await connection.execute(ACTIVE_TASKS_QUERY, (run_id,))
        return [TaskRecord.from_row(row) for row in await cursor.fetchall()]


# attempts that ended in success (forward tasks and compensators alike: both call it
# "succeeded"), whose Jobs may still be finishing: a success read from the Pod is recorded
# about a second before the Job controller marks the Job complete
SUCCEEDED_ATTEMPTS_QUERY = (
    "SELECT task_key, attempt FROM flowforge_task WHERE run_id = %s AND state = 'succeeded'"
)


async def succeeded_attempts(pool: Pool, run_id: int) -> set[tuple[str, int]]:
    """(task, attempt) of the run's attempts that succeeded."""
    async with pool.connection() as connection:
        cursor = await connection.execute(SUCCEEDED_ATTEMPTS_QUERY, (run_id,))
        return {(str(key), int(attempt)) for key, attempt in await cursor.fetchall()}


async def forward_counts_locked(connection: Connection, run_id: int) -> TaskCounts:
    """Forward task counts by state, on the caller's connection (inside its transaction)."""
    cursor = await connection.execute(FORWARD_COUNTS_QUERY, (run_id,))
    by_state = {str(state): int(count) for state, count in await cursor.fetchall()}
    counts = TaskCounts(
        total=sum(by_state.values()), **{state.value: by_state.get(state, 0) for state in TaskState}
    )
    return await _with_tolerated(connection, run_id, counts)


async def forward_counts(pool: Pool, run_id: int, *, kueue: bool = True) -> TaskCounts:
    """Forward task counts by state, the running ones that wait for Kueue's admission
    counted as admitting (``kueue``: whether any of the run's tasks may)."""
    async with pool.connection() as connection:
        counts = await _with_condition_false(
            connection, run_id, await forward_counts_locked(connection, run_id)
        )
        if not counts.running or not kueue:
            return counts
        cursor = await connection.execute(ADMITTING_COUNT_QUERY, (run_id,))
        row = await cursor.fetchone()
    return counts.with_admitting(int(row[0]) if row else 0)


# running forward tasks whose current attempt Kueue has not admitted (progress index, then
# the running rows only)
ADMITTING_COUNT_QUERY = (
    "SELECT count(*) FROM flowforge_task WHERE run_id = %s AND role = 'forward' "
    f"AND state = '{TaskState.RUNNING}' AND admission_required "
    "AND admitted_attempt IS DISTINCT FROM attempt"
)


LATEST_OUTCOMES_QUERY = (
    "SELECT DISTINCT ON (task_key) task_key, detail FROM flowforge_event "
    "WHERE run_id = %s AND task_key = ANY(%s) AND kind IN "
    f"{sql_list(OUTCOME_KINDS)} ORDER BY task_key, id DESC"
)


async def latest_outcomes(
    pool: Pool, run_id: int, task_keys: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """The detail of each task's latest recorded outcome (exit code, reason, message)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(LATEST_OUTCOMES_QUERY, (run_id, list(task_keys)))
        return {str(key): dict(detail) for key, detail in await cursor.fetchall()}


# the newest uid recorded for each attempt whose Job was created (None: created before uids
# were recorded)
RECORDED_JOBS_QUERY = (
    "SELECT DISTINCT ON (task_key, attempt) task_key, attempt, detail->>'uid' "
    f"FROM flowforge_event WHERE run_id = %s AND kind = '{EventKind.TASK_JOB_CREATED}' "
    "ORDER BY task_key, attempt, detail->>'uid' IS NULL, id DESC"
)
RECORDED_JOB_UID_QUERY = (
    "SELECT detail->>'uid' FROM flowforge_event "
    f"WHERE run_id = %s AND kind = '{EventKind.TASK_JOB_CREATED}' AND task_key = %s "
    "AND attempt = %s AND detail ? 'uid' ORDER BY id DESC LIMIT 1"
)

RECORDED_JOB_AGE_QUERY = (
    "SELECT extract(epoch FROM clock_timestamp() - min(recorded_at))::float8 "
    f"FROM flowforge_event WHERE run_id = %s AND kind = '{EventKind.TASK_JOB_CREATED}' "
    "AND task_key = %s AND attempt = %s AND detail->>'uid' = %s"
)


async def recorded_jobs(pool: Pool, run_id: int) -> dict[tuple[str, int], str | None]:
    """(task, attempt) -> the uid of its Job, for every attempt whose Job was created (the
    uid is None for a Job recorded before uids were): tells "vanished" from "never
    created", and the run's own Jobs from copies."""
    async with pool.connection() as connection:
        cursor = await connection.execute(RECORDED_JOBS_QUERY, (run_id,))
        return {
            (str(key), int(attempt)): None if uid is None else str(uid)
            for key, attempt, uid in await cursor.fetchall()
        }


async def job_created_attempts(pool: Pool, run_id: int) -> set[tuple[str, int]]:
    """(task, attempt) pairs whose Job was created: tells "vanished" from "never created"."""
    return set(await recorded_jobs(pool, run_id))


async def recorded_job_uid(pool: Pool, *, run_id: int, task_key: str, attempt: int) -> str | None:
    """The uid of the Job created for the attempt (None: none recorded, or recorded before
    uids were)."""
    async with pool.connection() as connection:
        return await recorded_job_uid_on(
            connection, run_id=run_id, task_key=task_key, attempt=attempt
        )


async def recorded_job_uid_on(
    connection: Connection, *, run_id: int, task_key: str, attempt: int
) -> str | None:
    """As ``recorded_job_uid``, on the caller's connection (the read API's scoped reader)."""
    cursor = await connection.execute(RECORDED_JOB_UID_QUERY, (run_id, task_key, attempt))
    row = await cursor.fetchone()
    return None if row is None else str(row[0])


async def recorded_job_age(
    pool: Pool, *, run_id: int, task_key: str, attempt: int, uid: str
) -> float | None:
    """Seconds since the Job with ``uid`` was first recorded as the attempt's, on the store's
    clock (exact, where a creationTimestamp has whole seconds); None: never recorded."""
    async with pool.connection() as connection:
        cursor = await connection.execute(RECORDED_JOB_AGE_QUERY, (run_id, task_key, attempt, uid))
        row = await cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


async def find_run_id_by_uid(pool: Pool, *, namespace: str, uid: str) -> int | None:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT id FROM flowforge_run WHERE namespace = %s AND uid = %s", (namespace, uid)
        )
        row = await cursor.fetchone()
    return None if row is None else int(row[0])


RUN_BY_UID_QUERY = "SELECT id FROM flowforge_run WHERE uid = %s ORDER BY id LIMIT 1"


async def find_run_id_by_uid_anywhere(pool: Pool, uid: str) -> int | None:
    """The run of the object with this uid, whatever its namespace (uids are unique in a
    cluster): the run a Job in another namespace claims to belong to."""
    async with pool.connection() as connection:
        cursor = await connection.execute(RUN_BY_UID_QUERY, (uid,))
        row = await cursor.fetchone()
    return None if row is None else int(row[0])


async def runs_by_phase(pool: Pool) -> dict[str, int]:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT phase, count(*) FROM flowforge_run GROUP BY phase"
        )
        return {str(phase): int(count) for phase, count in await cursor.fetchall()}


async def oldest_queued_wait(pool: Pool) -> float:
    """Seconds the longest-waiting queued run has waited since it was submitted (0: none)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT coalesce(extract(epoch FROM now() - min(submitted_at)), 0) "
            "FROM flowforge_run WHERE phase = 'Queued'"
        )
        row = await cursor.fetchone()
        return float(row[0]) if row is not None else 0.0


@dataclasses.dataclass(frozen=True)
class RollbackStep:
    """A compensator of a triggered rollback (its forward task succeeded, or was attempted:
    ``undo_of``, ``flowforge.domain.undo``)."""

    task_key: str
    compensates_key: str
    state: CompensationState
    attempt: int
    max_attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    undo_of: UndoOf = UndoOf.SUCCEEDED


# the rule of ``flowforge.domain.undo.undo_of`` for a failed task, over a compensator row
# ``compensator`` and its forward task's row ``forward``: undone as attempted
UNDONE_AS_ATTEMPTED = (
    f"(forward.state = '{TaskState.FAILED}' AND forward.last_attempt_started "
    "AND compensator.compensate_attempted)"
)

ROLLBACK_STEPS_QUERY = f"""
SELECT compensator.task_key, compensator.compensates_key, compensator.state,
       compensator.attempt, compensator.max_attempts, compensator.started_at,
       compensator.finished_at, compensator.last_error, {UNDONE_AS_ATTEMPTED}
FROM flowforge_task AS compensator
JOIN flowforge_task AS forward
  ON forward.run_id = compensator.run_id AND forward.task_key = compensator.compensates_key
WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
  AND compensator.state <> '{CompensationState.NOT_TRIGGERED}'
  AND (forward.state = '{TaskState.SUCCEEDED}' OR {UNDONE_AS_ATTEMPTED})
ORDER BY {UNDONE_AS_ATTEMPTED} DESC, compensator.topological_index,
         forward.finished_at DESC, compensator.task_key
"""


async def rollback_steps(pool: Pool, run_id: int) -> list[RollbackStep]:
    """The compensators of the run's rollback, in the order it runs them (empty until a
    rollback is triggered). Compensators of tasks that never succeeded are not steps."""
    async with pool.connection() as connection:
        cursor = await connection.execute(ROLLBACK_STEPS_QUERY, {"run": run_id})
        rows = await cursor.fetchall()
    return [
        RollbackStep(
            task_key=str(key),
            compensates_key=str(compensates),
            state=CompensationState(state),
            attempt=int(attempt),
            max_attempts=int(max_attempts),
            started_at=started,
            finished_at=finished,
            last_error=error,
            undo_of=UndoOf.ATTEMPTED if attempted else UndoOf.SUCCEEDED,
        )
        for key, compensates, state, attempt, max_attempts, started, finished, error, attempted in (
            rows
        )
    ]


async def rollback_started_at(pool: Pool, run_id: int) -> datetime | None:
    """When the run's rollback was triggered (None: it never was)."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT min(recorded_at) FROM flowforge_event WHERE run_id = %s AND kind = %s",
            (run_id, EventKind.RUN_COMPENSATING),
        )
        row = await cursor.fetchone()
    return None if row is None else row[0]


# a forward task failed for good: everything downstream of it that still waits is skipped,
# under row locks taken in id order
SKIP_DOWNSTREAM_QUERY = f"""
WITH RECURSIVE downstream (id) AS (
    SELECT task_id FROM flowforge_task_dependency WHERE upstream_id = %(task)s
    UNION
    SELECT edge.task_id FROM flowforge_task_dependency AS edge
    JOIN downstream ON edge.upstream_id = downstream.id
), locked AS (
    SELECT task.id FROM flowforge_task AS task
    WHERE task.id IN (SELECT id FROM downstream) AND task.state = '{TaskState.WAITING}'
    ORDER BY task.id
    FOR NO KEY UPDATE OF task
)
UPDATE flowforge_task AS task
SET state = '{TaskState.SKIPPED}', finished_at = now(), updated_at = now(),
    last_error = 'an upstream task failed'
FROM locked
WHERE task.id = locked.id AND task.state = '{TaskState.WAITING}'
RETURNING task.task_key
"""
