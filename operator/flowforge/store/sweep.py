"""The reconciler's work lists: what a pass must look at, in a few queries however many runs.

A pass asks the store two things, each in pages of runs, never once per run:

- ``listed_runs``: for a page of WorkflowRun objects the apiserver listed, which of them the
  store holds, with their phase and whether a cancel was recorded (``flowforge_run_identity``);
- ``sweep_page``: for a page of active runs (``flowforge_run_active_idx``), their identity
  (so an object that is gone is noticed), and only the rows that may need a repair: running
  attempts with the uid of the Job recorded for them (``flowforge_event_job_created_idx``),
  released tasks whose time has come (not a queued run's: its namespace's queue is served
  once a pass, ``dispatch.py::serve_queue``), and runs that may settle (no forward task unresolved,
  no compensator running; or an approval gate whose timeout passed). A run in none of
  these costs one index probe and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from flowforge.domain.history import EventKind
from flowforge.domain.states import (
    ACTIVE_RUN_PHASES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskRole,
    TaskState,
    sql_list,
)
from flowforge.store.connection import Pool
from flowforge.store.gates import GATE_DEADLINE

LISTED_RUNS_QUERY = """
SELECT run.namespace, run.uid, run.id, run.phase, run.cancel_requested,
       EXISTS (SELECT 1 FROM flowforge_task AS task
               WHERE task.run_id = run.id AND task.role = 'compensation')
FROM unnest(%s::text[], %s::text[], %s::text[]) AS listed (namespace, name, uid)
JOIN flowforge_run AS run
  ON run.namespace = listed.namespace AND run.name = listed.name AND run.uid = listed.uid
"""

SWEEP_QUERY = f"""
WITH page AS (
    SELECT id, namespace, name, uid, phase FROM flowforge_run
    WHERE phase IN {sql_list(ACTIVE_RUN_PHASES)} AND id > %(after)s ORDER BY id LIMIT %(limit)s
)
SELECT 'run' AS what, page.id, page.namespace, page.name, page.uid,
       NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
       NULL::timestamptz, false, NULL::text
FROM page
UNION ALL
SELECT 'task', task.run_id, NULL, NULL, NULL, task.task_key, task.role, task.state,
       task.attempt, task.timeout_seconds, task.not_before, job.uid IS NOT NULL, job.uid
FROM page
JOIN flowforge_task AS task ON task.run_id = page.id
 AND task.state IN ('{TaskState.READY}', '{TaskState.RUNNING}')
 AND (task.state = '{TaskState.RUNNING}'
      OR (task.role = '{TaskRole.FORWARD}' AND task.not_before <= now()
          -- a queued run's roots wait for the queue, served once per namespace
          AND page.phase = '{RunPhase.RUNNING}'))
LEFT JOIN LATERAL (
    SELECT coalesce(event.detail->>'uid', '') AS uid FROM flowforge_event AS event
    WHERE event.run_id = task.run_id AND event.kind = '{EventKind.TASK_JOB_CREATED}'
      AND event.task_key = task.task_key AND event.attempt = task.attempt
    ORDER BY event.detail->>'uid' IS NULL, event.id DESC
    LIMIT 1
) AS job ON task.state = '{TaskState.RUNNING}'
UNION ALL
SELECT 'settle', page.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, false, NULL
FROM page
WHERE (NOT EXISTS (
    SELECT 1 FROM flowforge_task WHERE run_id = page.id AND role = '{TaskRole.FORWARD}'
      AND state IN {sql_list(UNRESOLVED_TASK_STATES)}
) AND NOT EXISTS (
    SELECT 1 FROM flowforge_task WHERE run_id = page.id AND role = '{TaskRole.COMPENSATION}'
      AND state = '{CompensationState.RUNNING}'
-- an approval gate whose timeout passed (a wake-up lost with a restart): the settle fails it
)) OR EXISTS (
    SELECT 1 FROM flowforge_task WHERE run_id = page.id AND role = '{TaskRole.FORWARD}'
      AND state = '{TaskState.AWAITING}' AND {GATE_DEADLINE} <= now()
)
"""


@dataclasses.dataclass(frozen=True)
class ListedRun:
    """What the store holds about a listed WorkflowRun object."""

    run_id: int
    phase: RunPhase
    cancel_requested: bool
    # its deletion waits for a rollback (FlowForge's finalizer holds it): it has compensators
    compensators: bool = False


@dataclasses.dataclass(frozen=True)
class ActiveRun:
    run_id: int
    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class SweptTask:
    """A row that may need a repair: a running attempt (``job_recorded``: its Job was
    created, ``job_uid`` the uid recorded, None when recorded before uids were) or a
    released task that is due."""

    run_id: int
    task_key: str
    role: TaskRole
    state: str
    attempt: int
    timeout_seconds: int | None
    not_before: datetime
    job_recorded: bool
    job_uid: str | None


@dataclasses.dataclass(frozen=True)
class SweepPage:
    runs: tuple[ActiveRun, ...]  # every active run of the page, in id order
    tasks: tuple[SweptTask, ...]
    settle: frozenset[int]  # runs that may settle (finish, or take their rollback's next step)

    @property
    def last_id(self) -> int | None:
        return self.runs[-1].run_id if self.runs else None


async def listed_runs(
    pool: Pool, objects: Sequence[tuple[str, str, str]]
) -> dict[tuple[str, str], ListedRun]:
    """(namespace, uid) -> the store's run, for the listed (namespace, name, uid) objects the
    store holds; one query."""
    if not objects:
        return {}
    namespaces, names, uids = (list(column) for column in zip(*objects, strict=True))
    async with pool.connection() as connection:
        cursor = await connection.execute(LISTED_RUNS_QUERY, (namespaces, names, uids))
        rows = await cursor.fetchall()
    return {
        (str(namespace), str(uid)): ListedRun(
            run_id=int(run_id),
            phase=RunPhase(phase),
            cancel_requested=bool(cancel),
            compensators=bool(compensators),
        )
        for namespace, uid, run_id, phase, cancel, compensators in rows
    }


async def sweep_page(pool: Pool, *, after_id: int, limit: int) -> SweepPage:
    """The active runs after ``after_id`` (at most ``limit``) and their rows to look at."""
    async with pool.connection() as connection:
        cursor = await connection.execute(SWEEP_QUERY, {"after": after_id, "limit": limit})
        rows = await cursor.fetchall()
    runs: list[ActiveRun] = []
    tasks: list[SweptTask] = []
    settle: set[int] = set()
    for (
        what,
        run_id,
        namespace,
        name,
        uid,
        key,
        role,
        state,
        attempt,
        timeout,
        due,
        made,
        job,
    ) in rows:
        if what == "run":
            runs.append(ActiveRun(int(run_id), str(namespace), str(name), str(uid)))
        elif what == "settle":
            settle.add(int(run_id))
        else:
            tasks.append(
                SweptTask(
                    run_id=int(run_id),
                    task_key=str(key),
                    role=TaskRole(role),
                    state=str(state),
                    attempt=int(attempt),
                    timeout_seconds=timeout,
                    not_before=due,
                    job_recorded=bool(made),
                    job_uid=job or None,
                )
            )
    runs.sort(key=lambda run: run.run_id)
    return SweepPage(runs=tuple(runs), tasks=tuple(tasks), settle=frozenset(settle))
