"""Loading one run for the API: its row, definition, tasks, attempts and rollback, in the
caller's scoped transaction (shared by the run endpoints and the live stream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flowforge.domain.for_each import instance_key, split_instance
from flowforge.domain.history import EventKind
from flowforge.server import models, views
from flowforge.server.errors import ApiError
from flowforge.server.state import ServerState
from flowforge.store import action_reads, browse, final_reads
from flowforge.store.browse import RunRow, TaskRow
from flowforge.store.connection import Connection

# a run's detail shows its newest actions; ``.../actions`` up to ``action_reads.MAX_ACTIONS``
MAX_DETAIL_ACTIONS = 100


@dataclass(frozen=True)
class LoadedRun:
    """A run with every task's state and its rollback (not the tasks' rows)."""

    run: RunRow
    states: dict[str, str]
    rollback: models.Compensation

    def with_conditions(self) -> models.RunWithConditions:
        return models.RunWithConditions(
            **views.summary(self.run).model_dump(),
            conditions=views.conditions(self.run, self.rollback),
        )


async def find(connection: Connection, *, namespace: str, name: str) -> RunRow:
    run = await browse.find_run(connection, namespace=namespace, name=name)
    if run is None:
        raise ApiError(404, f'no run "{name}" in namespace "{namespace}"')
    return run


async def rollback_of(
    connection: Connection, run: RunRow, *, compensators: list[TaskRow], succeeded: set[str]
) -> models.Compensation:
    """The run's rollback from its compensator rows and the tasks that succeeded."""
    starts = await browse.compensation_starts(connection, run.id)
    failed = await browse.first_event(connection, run.id, EventKind.TASK_FAILED)
    return views.compensation(
        compensators,
        succeeded=succeeded,
        starts=starts,
        triggered_by=None if failed is None else failed.task_key,
    )


def succeeded_tasks(rows: list[TaskRow]) -> set[str]:
    return {row.key for row in rows if row.compensates is None and row.state == "succeeded"}


async def rollback(connection: Connection, run: RunRow) -> models.Compensation:
    compensators, succeeded = await browse.rollback_rows(connection, run.id)
    return await rollback_of(connection, run, compensators=compensators, succeeded=succeeded)


async def load(connection: Connection, *, namespace: str, name: str) -> LoadedRun:
    run = await find(connection, namespace=namespace, name=name)
    return LoadedRun(
        run=run,
        states=await browse.task_states(connection, run.id),
        rollback=await rollback(connection, run),
    )


async def graph(state: ServerState, connection: Connection, *, namespace: str, name: str) -> bytes:
    """The run's graph as ``models.Graph`` JSON: the definition's part from the cache, the
    states and the rollback's order read now."""
    loaded = await load(connection, namespace=namespace, name=name)
    skeleton = await state.graph_skeleton(
        connection, definition_id=loaded.run.definition_id, fingerprint=loaded.run.fingerprint
    )
    steps = loaded.rollback.steps
    order = [step.compensator for step in steps] if steps else None
    return skeleton.render(
        loaded.states, order, await browse.creation_skips(connection, loaded.run.id)
    )


async def detail(
    state: ServerState, connection: Connection, *, namespace: str, name: str
) -> models.RunDetail:
    run = await find(connection, namespace=namespace, name=name)
    omitted = run.counts.get("total", 0) > views.DETAIL_TASK_LIMIT
    tasks: list[models.TaskBrief] = []
    attempts: dict[str, list[models.Attempt]] | None = None
    rolled_back = await rollback(connection, run)
    if not omitted:
        rows = await browse.run_tasks(connection, run.id)
        definition = await state.definition(connection, run.definition_id)
        attempts = views.attempt_history(await browse.attempt_events(connection, run.id))
        tasks = views.task_briefs(definition, rows, attempts)
    final = await final_tasks(state, connection, run, attempts=attempts)
    retried = await browse.first_event(connection, run.id, EventKind.RUN_RETRY_OF)
    events = await browse.recent_events(connection, run.id)
    actions = await action_reads.action_events(connection, run.id, limit=MAX_DETAIL_ACTIONS)
    return models.RunDetail(
        **views.summary(run).model_dump(),
        parameters=dict(run.parameters),
        retry_of=None if retried is None else str(retried.detail.get("retryOf") or "") or None,
        conditions=views.conditions(run, rolled_back),
        tasks=tasks,
        tasks_omitted=omitted,
        compensation=rolled_back,
        events=views.history(events),
        paused=await action_reads.run_paused(connection, run.id),
        actions=views.run_actions(actions),
        finally_=final,
    )


async def final_tasks(
    state: ServerState,
    connection: Connection,
    run: RunRow,
    *,
    attempts: Mapping[str, Sequence[models.Attempt]] | None,
) -> models.Finally | None:
    """The run's ``finally`` tasks with their attempts (read for them alone unless
    ``attempts`` holds every task's already)."""
    rows = await final_reads.final_rows(connection, run.id)
    if rows is None:
        return None
    if attempts is None:
        keys = [row.key for row in rows.steps]
        events = await browse.attempt_events(connection, run.id, keys=keys) if keys else []
        attempts = views.attempt_history(events)
    definition = await state.definition(connection, run.definition_id)
    return views.final_tasks(definition, rows, attempts)


async def actions(connection: Connection, *, namespace: str, name: str) -> models.RunActionList:
    run = await find(connection, namespace=namespace, name=name)
    return models.RunActionList(
        items=views.run_actions(await action_reads.action_events(connection, run.id))
    )


def compensator_row_key(definition: views.DefinitionView, task: str, *, name: str) -> str | None:
    """The key of the compensator row of the run's forward task row ``task`` (a task of the
    DAG or an item of a forEach task, ``deploy[eu]``: then its compensator's instance,
    ``undo-deploy[eu]``); None when it has no compensator. 404 when ``task`` is none."""
    group, item = split_instance(task)
    if group not in definition.levels:
        raise ApiError(404, f'run "{name}" has no task "{task}"')
    compensator = definition.compensator_of.get(group)
    if compensator is None or item is None:
        return compensator
    return instance_key(compensator, item)


def _why_no_row(task: str) -> str:
    group, item = split_instance(task)
    if item is not None:
        return f": no such item of {group}, or the run's rows were pruned"
    return f" (a forEach task has one per item, {task}[<item key>]; or they were pruned)"


async def task(
    state: ServerState, connection: Connection, *, namespace: str, name: str, task: str
) -> models.TaskDetail:
    run = await find(connection, namespace=namespace, name=name)
    definition = await state.definition(connection, run.definition_id)
    compensator_key = compensator_row_key(definition, task, name=name)
    keys = [task] if compensator_key is None else [task, compensator_key]
    rows = {row.key: row for row in await browse.run_tasks(connection, run.id, keys=keys)}
    if task not in rows:
        raise ApiError(404, f'run "{name}" has no row of task "{task}"' + _why_no_row(task))
    attempts = views.attempt_history(await browse.attempt_events(connection, run.id, keys=keys))
    brief = views.task_brief(
        definition,
        rows[task],
        attempts=attempts.get(task, []),
        compensator=rows.get(compensator_key) if compensator_key else None,
    )
    return models.TaskDetail(
        **brief.model_dump(),
        attempt_history=attempts.get(task, []),
        compensator_attempts=attempts.get(compensator_key, []) if compensator_key else [],
    )
