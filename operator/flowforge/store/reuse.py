"""Reuse: a retry of a finished run does not run again the work of the old one that stands.

``flowforge retry OLD`` creates a new WorkflowRun with ``spec.retryOf: OLD`` (admission
checks that OLD is a finished, unsuccessful run of the namespace with the same parameters).
When the operator creates the new run's rows (``runs.create_run``), every forward task
of OLD that is *reusable* starts ``succeeded`` (event ``task.reused``) instead of running
again, and the other tasks wait only for their upstreams that are not reused; all of it in
the transaction that creates the run, so no task is ever dispatched that a reuse would
have covered.

A task of OLD is reusable when it succeeded, its work was not undone (it has no compensator,
or its compensator was never triggered or was skipped before it ever started, because the
rollback halted), and
every one of its upstreams is reusable: a task that ran on top of work that was undone is
run again after that work is redone. Reuse only applies when the new run uses the same
definition (namespace, workflow, version) as OLD; otherwise everything runs.

Runs are addressed by (namespace, name) here, as users name them; when a name was used by
several WorkflowRun objects over time, the newest run wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from flowforge.domain.for_each import split_instance
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.definitions import StoredDefinition, load_definition_by_id
from flowforge.store.events import append_event
from flowforge.store.lease import Fence

FIND_BY_NAME_QUERY = """
SELECT run.id, run.namespace, run.name, run.uid, run.phase, run.compensating,
       run.cancel_requested, run.parameters, run.created_at, run.finished_at, run.pruned_at,
       definition.id, definition.workflow, definition.version
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
WHERE run.namespace = %s AND run.name = %s
ORDER BY run.id DESC LIMIT 1
"""
# the source of a retry: its namespace the retry's namespace as it is now (migration 15:
# a run of a deleted namespace whose name was taken again is another namespace's). A run
# without a recorded uid, or a retry whose namespace's uid is not known, matches by name
SOURCE_QUERY = FIND_BY_NAME_QUERY.replace(
    "AND run.name = %s",
    "AND run.name = %s AND (run.namespace_uid IS NULL OR %s::text IS NULL "
    "OR run.namespace_uid = %s::text)",
)

LIST_QUERY = """
SELECT run.id, run.namespace, run.name, run.uid, run.phase, run.compensating,
       run.cancel_requested, run.parameters, run.created_at, run.finished_at, run.pruned_at,
       definition.id, definition.workflow, definition.version
FROM flowforge_run AS run
JOIN flowforge_definition AS definition ON definition.id = run.definition_id
WHERE run.namespace = %s AND (%s::text IS NULL OR run.phase = %s::text)
ORDER BY run.id DESC LIMIT %s
"""

# forward tasks that succeeded and whose work was not undone: their compensator (if any) was
# never triggered, or skipped before any attempt of it started (the rollback halted before
# it); one skipped while it ran (the object was deleted mid-rollback) may have undone part
CANDIDATES_QUERY = f"""
SELECT forward.task_key, forward.state = '{TaskState.SUCCEEDED}'
  AND NOT EXISTS (
      SELECT 1 FROM flowforge_task AS compensator
      WHERE compensator.run_id = %(run)s AND compensator.role = 'compensation'
        AND compensator.compensates_key = forward.task_key
        AND compensator.state <> '{CompensationState.NOT_TRIGGERED}'
        AND NOT (compensator.state = '{CompensationState.SKIPPED}'
                 AND compensator.started_at IS NULL))
FROM flowforge_task AS forward
WHERE forward.run_id = %(run)s AND forward.role = 'forward'
"""


@dataclasses.dataclass(frozen=True)
class NamedRun:
    """A run found by its name, with the identity of its definition."""

    id: int
    namespace: str
    name: str
    uid: str
    phase: RunPhase
    compensating: bool
    cancel_requested: bool
    parameters: Mapping[str, Any]
    created_at: datetime
    finished_at: datetime | None
    pruned_at: datetime | None
    definition_id: int
    workflow: str
    version: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> NamedRun:
        values = list(row)
        values[4] = RunPhase(values[4])
        return cls(*values)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


async def find_run_by_name(pool: Pool, *, namespace: str, name: str) -> NamedRun | None:
    """The newest run called ``name`` in ``namespace`` (index ``flowforge_run_identity``)."""
    async with pool.connection() as connection:
        return await _find_by_name(connection, namespace=namespace, name=name)


async def _find_by_name(connection: Connection, *, namespace: str, name: str) -> NamedRun | None:
    cursor = await connection.execute(FIND_BY_NAME_QUERY, (namespace, name))
    row = await cursor.fetchone()
    return None if row is None else NamedRun.from_row(row)


async def list_runs_by_namespace(
    pool: Pool, *, namespace: str, limit: int = 100, phase: str | None = None
) -> list[NamedRun]:
    """The newest ``limit`` runs of a namespace (only those in ``phase``), newest first."""
    async with pool.connection() as connection:
        cursor = await connection.execute(LIST_QUERY, (namespace, phase, phase, limit))
        return [NamedRun.from_row(row) for row in await cursor.fetchall()]


def reusable(
    graph: DependencyGraph, candidates: Collection[str], *, redone: Collection[str] | None = None
) -> frozenset[str]:
    """The candidates none of whose upstreams, transitively, is left to run again: a task
    that ran on top of work that is redone is run again after it. ``redone``: the old run's
    other forward rows (default: the graph's tasks that are no candidate); a forEach item
    (``task[item]``) stands for its task in the graph, so every item of a task downstream of
    a redone item is redone, and the items of its own task that stand are reused by key."""
    chosen = frozenset(candidates)
    again = graph.keys - chosen if redone is None else redone
    dropped = graph.downstream_of({split_instance(key)[0] for key in again})
    return frozenset(key for key in chosen if split_instance(key)[0] not in dropped)


async def reusable_in(
    connection: Connection, *, source_run_id: int, graph: DependencyGraph
) -> frozenset[str]:
    cursor = await connection.execute(CANDIDATES_QUERY, {"run": source_run_id})
    rows = [(str(key), bool(candidate)) for key, candidate in await cursor.fetchall()]
    return reusable(
        graph,
        [key for key, candidate in rows if candidate],
        redone=[key for key, candidate in rows if not candidate],
    )


async def reusable_tasks(pool: Pool, *, namespace: str, run_name: str) -> frozenset[str]:
    """Forward tasks of the run ``run_name`` that a retry would not run again (see above);
    empty when there is no such run."""
    async with pool.connection() as connection:
        run = await _find_by_name(connection, namespace=namespace, name=run_name)
        if run is None:
            return frozenset()
    definition = await load_definition_by_id(pool, run.definition_id)
    async with pool.connection() as connection:
        return await reusable_in(connection, source_run_id=run.id, graph=definition.spec.graph)


async def reused_for(
    connection: Connection,
    *,
    fence: Fence,
    run_id: int,
    definition: StoredDefinition,
    retry_of: str,
    requested_by: str | None = None,
    namespace_uid: str | None = None,
) -> frozenset[str]:
    """Inside the transaction creating run ``run_id`` as a retry of the run named
    ``retry_of``: the forward tasks it reuses (empty for another definition version, and
    when that run belongs to an earlier namespace of the same name than ``namespace_uid``);
    the ``run.retry_of`` event records who asked (``requestedBy``)."""
    cursor = await connection.execute(
        SOURCE_QUERY, (definition.namespace, retry_of, namespace_uid, namespace_uid)
    )
    row = await cursor.fetchone()
    source = None if row is None else NamedRun.from_row(row)
    if source is None or source.id == run_id:
        return frozenset()
    if source.definition_id != definition.id:
        await append_event(
            connection,
            run_id=run_id,
            kind=EventKind.RUN_RETRY_OF,
            epoch=fence.epoch,
            detail={
                "retryOf": retry_of,
                "requestedBy": requested_by,
                "reused": [],
                "note": "another definition version: nothing reused",
            },
        )
        return frozenset()
    reused = await reusable_in(connection, source_run_id=source.id, graph=definition.spec.graph)
    await append_event(
        connection,
        run_id=run_id,
        kind=EventKind.RUN_RETRY_OF,
        epoch=fence.epoch,
        detail={"retryOf": retry_of, "requestedBy": requested_by, "reused": sorted(reused)},
    )
    return reused
