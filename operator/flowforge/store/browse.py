"""Reads of the read API (``flowforge server``) and the CLI's admin mode, on one connection.

Every function takes the connection of a transaction opened by ``scoped_reader``, which
first narrows a ``flowforge_server`` login to the namespaces the user may read
(``roles.scope_namespaces``; row-level security does the rest, see ``roles.py``). For an
administrator's DSN (the owner, or a superuser) the scope changes nothing.

Queries and their indexes: runs by (namespace, name) ``flowforge_run_identity``; the run
list walks the primary key backwards (newest first, the cursor is the last id seen); task
counts, a run's task states and its compensators ``flowforge_task_progress_idx`` (each
compensator's task by ``flowforge_task_identity``); a run's events and its change marker
``flowforge_event_run_idx``. Row-level security compares each row's ``namespace`` column
(migration 8), so none of these looks a run up per row.

A namespace deleted and re-created under its name is another namespace: runs and
definitions carry the uid of the namespace they were written in (migration 15), and the
reader shows those of a namespace only while it has that uid (``scoped_reader``'s
``namespace_uids``, the uids the caller read from the apiserver just before); the rest of a
run's rows are reached only through a run shown.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from flowforge.domain.expansion import CREATION_SKIP_REASONS, creation_skip_reason
from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.states import RunPhase, TaskState, sql_list
from flowforge.domain.undo import UndoOf
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import Event
from flowforge.store.queries import TOLERATED, kept_states, tolerated_count
from flowforge.store.roles import scope_namespaces

MAX_EVENTS = 500
MAX_DEFINITION_ROWS = 2000


# the uid each namespace of a reader's transaction has now: {"name": "uid"} (a JSON object)
NAMESPACE_UIDS_SETTING = "flowforge.namespace_uids"


def current_row(alias: str) -> str:
    """SQL: the row of ``alias`` belongs to its namespace as it is now. A row written with
    the uid of a namespace since deleted (its name now another namespace's, or nobody's) is
    not; a row without a uid (migration 15) is. Without the setting (not a scoped reader)
    no row with a uid is."""
    return (
        f"({alias}.namespace_uid IS NULL OR {alias}.namespace_uid = "
        f"(nullif(current_setting('{NAMESPACE_UIDS_SETTING}', true), '')::jsonb "
        f"->> {alias}.namespace))"
    )


@asynccontextmanager
async def scoped_reader(
    pool: Pool, namespaces: Sequence[str], *, namespace_uids: Mapping[str, str]
) -> AsyncIterator[Connection]:
    """A read-only transaction that sees only ``namespaces`` (for a server login), and of
    them only the runs and definitions written while each had the uid ``namespace_uids``
    names (a namespace missing there exists no more: none of its rows with a uid)."""
    async with pool.connection() as connection, connection.transaction():
        await connection.execute("SET TRANSACTION READ ONLY")
        await scope_namespaces(connection, namespaces)
        await connection.execute(
            "SELECT set_config(%s, %s, true)",
            (NAMESPACE_UIDS_SETTING, json.dumps(dict(namespace_uids))),
        )
        yield connection


@dataclasses.dataclass(frozen=True)
class RunRow:
    """One run as the API lists it: its identity, definition, phase and task counts."""

    id: int
    namespace: str
    name: str
    uid: str
    workflow: str
    version: int
    definition_id: int
    phase: RunPhase
    compensating: bool
    cancel_requested: bool
    parameters: Mapping[str, Any]
    created_at: datetime
    finished_at: datetime | None
    pruned_at: datetime | None
    # forward tasks by state (the tolerated failures of forEach items apart from the
    # failed, ``TaskCounts.tolerated``), and their total
    counts: Mapping[str, int]
    # the newest event's id: changes whenever anything of the run changes
    marker: int
    # the definition's (what its graph is cached by)
    fingerprint: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRow:
        """The run among the columns of a row read by name (``RUN_COLUMNS``, ``dict_row``)."""
        # counted apart from the failed in the task rows; a pruned run's kept counts
        # already hold them apart
        tolerated = int(row["tolerated"] or 0)
        by_state, _ = kept_states(
            {str(state): int(n) for state, n in dict(row["counts"] or {}).items()}
        )
        if tolerated:
            by_state[TaskState.FAILED] -= tolerated
            by_state[TOLERATED] = tolerated
        counts = {**{state.value: 0 for state in TaskState}, TOLERATED: 0, **by_state}
        counts["total"] = sum(by_state.values())
        named = {field.name: row[field.name] for field in dataclasses.fields(cls)}
        return cls(
            **named
            | {"phase": RunPhase(row["phase"]), "counts": counts, "marker": int(row["marker"] or 0)}
        )


RUN_COLUMNS = f"""
run.id, run.namespace, run.name, run.uid, definition.workflow, definition.version,
run.definition_id, run.phase, run.compensating, run.cancel_requested, run.parameters,
run.created_at, run.finished_at, run.pruned_at,
coalesce((SELECT jsonb_object_agg(counted.state, counted.n) FROM (
    SELECT task.state, count(*) AS n FROM flowforge_task AS task
    WHERE task.run_id = run.id AND task.role = 'forward' GROUP BY task.state) AS counted),
  run.final_counts -> 'forward', '{{}}'::jsonb) AS counts,
({tolerated_count("run.id")}) AS tolerated,
(SELECT max(event.id) FROM flowforge_event AS event WHERE event.run_id = run.id) AS marker,
definition.fingerprint
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
"""

_LISTED = f"""
WHERE run.namespace = ANY(%(namespaces)s) AND {current_row("run")}
  AND (%(workflow)s::text IS NULL OR definition.workflow = %(workflow)s)
  AND (%(phase)s::text IS NULL OR run.phase = %(phase)s)
  AND (%(before)s::bigint IS NULL OR run.id < %(before)s)
ORDER BY run.id DESC LIMIT %(limit)s
"""
LIST_RUNS_QUERY = f"SELECT {RUN_COLUMNS} {_LISTED}"
RUN_PLACES_QUERY = f"""
SELECT run.namespace, run.id FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id {_LISTED}
"""
RUNS_BY_ID_QUERY = f"""
SELECT {RUN_COLUMNS}
WHERE run.id = ANY(%(ids)s) AND run.namespace = ANY(%(namespaces)s) AND {current_row("run")}
ORDER BY run.id DESC
"""
FIND_RUN_QUERY = f"""
SELECT {RUN_COLUMNS}
WHERE run.namespace = %(namespace)s AND run.name = %(name)s AND {current_row("run")}
ORDER BY run.id DESC LIMIT 1
"""


@dataclasses.dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows: of ``namespaces``, of one workflow and one phase when given,
    older than ``before`` (the id of the last run seen), newest first, at most ``limit``."""

    namespaces: Sequence[str]
    workflow: str | None = None
    phase: str | None = None
    before: int | None = None
    limit: int = 50

    def parameters(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "namespaces": list(self.namespaces)}


async def list_runs(
    connection: Connection,
    *,
    namespaces: Sequence[str],
    workflow: str | None = None,
    phase: str | None = None,
    before: int | None = None,
    limit: int = 50,
) -> list[RunRow]:
    """Runs of ``namespaces``, newest first; ``before`` is the id of the last run seen."""
    listed = RunFilter(namespaces, workflow=workflow, phase=phase, before=before, limit=limit)
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(LIST_RUNS_QUERY, listed.parameters())
    return [RunRow.from_row(row) for row in await cursor.fetchall()]


async def run_places(connection: Connection, listed: RunFilter) -> list[tuple[str, int]]:
    """Where the runs ``list_runs`` would list are: (namespace, id), newest first, and
    nothing else of them (what a lister judges the caller's access by, row by row)."""
    cursor = await connection.execute(RUN_PLACES_QUERY, listed.parameters())
    return [(str(namespace), int(run_id)) for namespace, run_id in await cursor.fetchall()]


async def runs_by_id(
    connection: Connection, *, ids: Sequence[int], namespaces: Sequence[str]
) -> list[RunRow]:
    """The runs ``ids`` of ``namespaces`` (others are left out), newest first."""
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(RUNS_BY_ID_QUERY, {"ids": list(ids), "namespaces": list(namespaces)})
    return [RunRow.from_row(row) for row in await cursor.fetchall()]


async def find_run(connection: Connection, *, namespace: str, name: str) -> RunRow | None:
    """The newest run called ``name`` in ``namespace``."""
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(FIND_RUN_QUERY, {"namespace": namespace, "name": name})
    row = await cursor.fetchone()
    return None if row is None else RunRow.from_row(row)


async def namespaces_with_data(connection: Connection, candidates: Sequence[str]) -> list[str]:
    """Those of ``candidates`` holding a run or a definition (one probe of an index each)."""
    cursor = await connection.execute(
        "SELECT candidate FROM unnest(%s::text[]) AS candidate WHERE EXISTS "
        f"(SELECT FROM flowforge_run AS r WHERE r.namespace = candidate AND {current_row('r')}) "
        "OR EXISTS (SELECT FROM flowforge_definition AS d "
        f"WHERE d.namespace = candidate AND {current_row('d')}) ORDER BY candidate",
        (list(candidates),),
    )
    return [str(name) for (name,) in await cursor.fetchall()]


@dataclasses.dataclass(frozen=True)
class TaskRow:
    key: str
    compensates: str | None
    state: str
    attempt: int
    max_attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None


async def run_tasks(
    connection: Connection,
    run_id: int,
    *,
    keys: Sequence[str] | None = None,
    compensators: bool = False,
) -> list[TaskRow]:
    """The run's task rows (forward and compensators, not the finally tasks) in topological
    order; only those
    named ``keys`` (and every compensator, with ``compensators``) when ``keys`` is given."""
    cursor = await connection.execute(
        "SELECT task_key, compensates_key, state, attempt, max_attempts, started_at, "
        "finished_at, last_error FROM flowforge_task WHERE run_id = %(run)s "
        "AND role <> 'finally' AND (%(keys)s::text[] IS NULL OR task_key = ANY(%(keys)s) "
        "     OR (%(compensators)s AND role = 'compensation')) "
        "ORDER BY topological_index, task_key",
        {
            "run": run_id,
            "keys": None if keys is None else list(keys),
            "compensators": compensators,
        },
    )
    return [TaskRow(*row) for row in await cursor.fetchall()]


async def task_states(connection: Connection, run_id: int) -> dict[str, str]:
    """Every task's (and compensator's) state, by key: what a graph or a stream lays over
    the definition (not the finally tasks', which are not in it: ``final_reads``)."""
    cursor = await connection.execute(
        "SELECT task_key, state FROM flowforge_task WHERE run_id = %s AND role <> 'finally'",
        (run_id,),
    )
    return {str(key): str(state) for key, state in await cursor.fetchall()}


async def creation_skips(connection: Connection, run_id: int) -> dict[str, str]:
    """The forward tasks the run skipped when it was created, by key: why
    (``ConditionFalse``, ``NoItems``; `domain/expansion.py`)."""
    cursor = await connection.execute(
        "SELECT task_key, last_error FROM flowforge_task WHERE run_id = %s "
        "AND role = 'forward' AND state = %s AND split_part(last_error, ':', 1) = ANY(%s)",
        (run_id, TaskState.SKIPPED, list(CREATION_SKIP_REASONS)),
    )
    return {
        str(key): reason
        for key, message in await cursor.fetchall()
        if (reason := creation_skip_reason(message)) is not None
    }


async def rollback_rows(connection: Connection, run_id: int) -> tuple[list[TaskRow], set[str]]:
    """The run's compensator rows in the rollback's order, and which of the tasks they
    compensate succeeded (or were undone as attempted, ``flowforge.domain.undo``): what the
    rollback is drawn from, without the other tasks' rows."""
    cursor = await connection.execute(
        "SELECT c.task_key, c.compensates_key, c.state, c.attempt, c.max_attempts, "
        "c.started_at, c.finished_at, c.last_error, "
        "(f.state = %(succeeded)s OR c.undo_of IS NOT NULL) "
        "FROM flowforge_task AS c JOIN flowforge_task AS f "
        "ON f.run_id = c.run_id AND f.task_key = c.compensates_key "
        "WHERE c.run_id = %(run)s AND c.role = 'compensation' "
        "ORDER BY c.undo_of IS NOT DISTINCT FROM %(attempted)s DESC, "
        "c.topological_index, f.finished_at DESC, c.task_key",
        {"run": run_id, "succeeded": TaskState.SUCCEEDED, "attempted": UndoOf.ATTEMPTED},
    )
    rows = await cursor.fetchall()
    return [TaskRow(*row[:8]) for row in rows], {str(row[1]) for row in rows if row[8]}


async def change_marker(connection: Connection, run_id: int) -> int:
    """The id of the run's newest event: it grows whenever anything of the run changes
    (one backward probe of ``flowforge_event_run_idx``)."""
    cursor = await connection.execute(
        "SELECT max(id) FROM flowforge_event WHERE run_id = %s", (run_id,)
    )
    row = await cursor.fetchone()
    return int(row[0] or 0) if row else 0


_EVENT_COLUMNS = "id, run_id, kind, task_key, attempt, epoch, detail, recorded_at"
# the kinds that start an attempt (of a task, a compensator, a finally task)
ATTEMPT_START_KINDS = (
    EventKind.TASK_DISPATCHED,
    EventKind.COMPENSATION_STARTED,
    EventKind.FINALLY_STARTED,
)
ATTEMPT_KINDS = (*sorted(OUTCOME_KINDS), *ATTEMPT_START_KINDS, EventKind.TASK_JOB_CREATED)


async def recent_events(
    connection: Connection, run_id: int, *, limit: int = MAX_EVENTS
) -> list[Event]:
    """The run's newest ``limit`` events, oldest first."""
    cursor = await connection.execute(
        f"SELECT {_EVENT_COLUMNS} FROM (SELECT {_EVENT_COLUMNS} FROM flowforge_event "
        "WHERE run_id = %s ORDER BY id DESC LIMIT %s) AS newest ORDER BY id",
        (run_id, limit),
    )
    return [Event(*row) for row in await cursor.fetchall()]


async def events_after(connection: Connection, run_id: int, *, after: int) -> list[Event]:
    cursor = await connection.execute(
        f"SELECT {_EVENT_COLUMNS} FROM flowforge_event WHERE run_id = %s AND id > %s "
        "ORDER BY id LIMIT 10000",
        (run_id, after),
    )
    return [Event(*row) for row in await cursor.fetchall()]


async def attempt_events(
    connection: Connection, run_id: int, *, keys: Sequence[str] | None = None
) -> list[Event]:
    """The events that make up attempts (starts, Jobs, outcomes) of the tasks ``keys`` (all
    tasks when None), oldest first."""
    cursor = await connection.execute(
        f"SELECT {_EVENT_COLUMNS} FROM flowforge_event WHERE run_id = %(run)s "
        f"AND kind IN {sql_list(ATTEMPT_KINDS)} "
        "AND (%(keys)s::text[] IS NULL OR task_key = ANY(%(keys)s)) ORDER BY id",
        {"run": run_id, "keys": None if keys is None else list(keys)},
    )
    return [Event(*row) for row in await cursor.fetchall()]


async def first_event(connection: Connection, run_id: int, kind: EventKind) -> Event | None:
    cursor = await connection.execute(
        f"SELECT {_EVENT_COLUMNS} FROM flowforge_event WHERE run_id = %s AND kind = %s "
        "ORDER BY id LIMIT 1",
        (run_id, kind),
    )
    row = await cursor.fetchone()
    return None if row is None else Event(*row)


async def compensation_starts(connection: Connection, run_id: int) -> dict[str, int]:
    """Compensator -> the id of the event that first started it (the rollback's order)."""
    cursor = await connection.execute(
        "SELECT task_key, min(id) FROM flowforge_event WHERE run_id = %s AND kind = %s "
        "AND task_key IS NOT NULL GROUP BY task_key",
        (run_id, EventKind.COMPENSATION_STARTED),
    )
    return {str(key): int(first) for key, first in await cursor.fetchall()}


@dataclasses.dataclass(frozen=True)
class DefinitionVersionRow:
    id: int
    workflow: str
    version: int
    fingerprint: str
    published_at: datetime
    tasks: int


async def definition_versions(
    connection: Connection, *, namespace: str, workflow: str | None = None
) -> list[DefinitionVersionRow]:
    """The namespace's published definitions (of one workflow when given), by workflow,
    newest version first."""
    cursor = await connection.execute(
        "SELECT id, workflow, version, fingerprint, published_at, "
        "jsonb_array_length(coalesce(document -> 'tasks', '[]'::jsonb)) "
        "FROM flowforge_definition AS d WHERE namespace = %(namespace)s "
        f"AND {current_row('d')} AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s) "
        "ORDER BY workflow, version DESC LIMIT %(limit)s",
        {"namespace": namespace, "workflow": workflow, "limit": MAX_DEFINITION_ROWS},
    )
    return [DefinitionVersionRow(*row) for row in await cursor.fetchall()]
