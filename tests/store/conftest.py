"""Builders shared by the store tests: definitions, a held lease, a published run, and the
store moves the operator makes (``record_outcome``, ``dispatch_due``) as one-line helpers."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.execution import AttemptOutcome, BackoffPolicy, OutcomeReason
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition
from flowforge.store import roles
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.events import run_history
from flowforge.store.lease import Fence, acquire_lease, current_lease, release_lease
from flowforge.store.outcomes import RECORD_SUCCESS_QUERY, record_outcome
from flowforge.store.pool import open_pool
from flowforge.store.queries import list_tasks
from flowforge.store.runs import RunRecord, create_run

pytestmark = pytest.mark.store

NAMESPACE = "team-a"

DIAMOND: list[dict[str, Any]] = [
    {"key": "extract"},
    {"key": "clean", "dependsOn": ["extract"]},
    {"key": "enrich", "dependsOn": ["extract"]},
    {"key": "load", "dependsOn": ["clean", "enrich"]},
]


def definition(
    tasks: Sequence[Mapping[str, Any]],
    *,
    workflow: str = "etl",
    version: int = 1,
    description: str = "",
    parameters: Sequence[Mapping[str, Any]] = (),
    final_tasks: Sequence[Mapping[str, Any]] = (),
) -> DefinitionSpec:
    document: dict[str, Any] = {
        "workflow": workflow,
        "version": version,
        "taskTypes": {"py": {"image": "python:3.12-slim"}},
        # an approval gate (``approval``) has no type: it runs no Job
        "tasks": [task if "approval" in task else {"type": "py", **task} for task in tasks],
    }
    if final_tasks:  # ``finally``
        document["finally"] = [{"type": "py", **task} for task in final_tasks]
    if parameters:  # typed declarations (their defaults decide the tasks' ``when``)
        document["parameters"] = list(parameters)
    if description:
        document["description"] = description
    return parse_definition(document)


@pytest.fixture
async def server_pool(store_dsn: str, login_role_dsn: Any) -> AsyncIterator[Pool]:
    """A pool of a ``flowforge_server`` login granted every namespace (what it reads is
    what its transaction is scoped to, ``browse.scoped_reader``)."""
    dsn = login_role_dsn("ff_test_server", member_of=roles.SERVER)
    with psycopg.connect(store_dsn, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO flowforge_reporting_grant (grantee, namespace) "
            "VALUES ('ff_test_server', '*')"
        )
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def fence(store: Pool) -> Fence:
    lease = await acquire_lease(store, holder="test-operator", ttl=timedelta(minutes=5))
    assert lease is not None
    return lease.fence


@dataclasses.dataclass(frozen=True)
class StartedRun:
    run: RunRecord
    spec: DefinitionSpec


async def start_run(
    pool: Pool,
    fence: Fence,
    tasks: Sequence[Mapping[str, Any]],
    *,
    workflow: str = "etl",
    namespace: str = NAMESPACE,
    max_parallel_tasks: int | None = None,
    parameters: Sequence[Mapping[str, Any]] = (),
    requested_by: str | None = None,
    final_tasks: Sequence[Mapping[str, Any]] = (),
) -> StartedRun:
    spec = definition(tasks, workflow=workflow, parameters=parameters, final_tasks=final_tasks)
    await publish_definition(pool, namespace=namespace, definition=spec)
    stored = await load_definition(pool, namespace=namespace, workflow=workflow, version=1)
    created = await create_run(
        pool,
        fence=fence,
        namespace=namespace,
        name=f"{workflow}-run",
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters={} if parameters else {"date": "2026-11-30"},
        max_parallel_tasks=max_parallel_tasks,
        requested_by=requested_by,
    )
    return StartedRun(run=created.run, spec=spec)


# --- driving runs through the store moves the operator calls ---------------------------

SUCCESS = AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0)
# a retry that is due at once (the backoff is the contract of domain.execution, not here)
NO_WAIT = BackoffPolicy(first_delay_seconds=0.0, jitter=0.0)
AN_HOUR = BackoffPolicy(first_delay_seconds=3600.0, jitter=0.0, cap_seconds=3600.0)


def failure(message: str = "exit code 3", *, exit_code: int | None = 3) -> AttemptOutcome:
    return AttemptOutcome(
        succeeded=False, reason=OutcomeReason.EXIT_CODE, message=message, exit_code=exit_code
    )


async def record(
    pool: Pool,
    fence: Fence,
    run: RunRecord,
    key: str,
    outcome: AttemptOutcome = SUCCESS,
    *,
    attempt: int = 1,
    role: TaskRole = TaskRole.FORWARD,
    backoff: BackoffPolicy = NO_WAIT,
) -> Decision:
    """``store.outcomes.record_outcome`` as the operator calls it for a finished Job."""
    return await record_outcome(
        pool,
        fence=fence,
        run_id=run.id,
        run_uid=run.uid,
        job=JobRef(task_key=key, attempt=attempt, role=role),
        outcome=outcome,
        backoff=backoff,
    )


async def finish(
    pool: Pool,
    fence: Fence,
    run: RunRecord,
    key: str,
    outcome: AttemptOutcome = SUCCESS,
    *,
    backoff: BackoffPolicy = NO_WAIT,
) -> Decision:
    """Dispatch what is due (the operator does on first sight and on wake-up), then record
    the outcome of the task's current attempt."""
    await dispatch_due(pool, fence=fence, run_id=run.id)
    task = next(t for t in await list_tasks(pool, run.id) if t.task_key == key)
    return await record(pool, fence, run, key, outcome, attempt=task.attempt, backoff=backoff)


async def roll_back(
    pool: Pool, fence: Fence, run: RunRecord, decision: Decision, *, failing: str = ""
) -> list[str]:
    """Run the rollback the way the operator does: each compensator a decision starts
    finishes (``failing`` fails for good), and its decision starts the next one. Returns
    the compensators in the order they ran."""
    ran: list[str] = []
    while steps := [d for d in decision.create_jobs if d.role is TaskRole.COMPENSATION]:
        assert len(steps) == 1, f"one compensator at a time, got {steps}"
        step = steps[0]
        ran.append(step.task_key)
        outcome = failure("undo failed") if step.task_key == failing else SUCCESS
        decision = await record(
            pool, fence, run, step.task_key, outcome, attempt=step.attempt, role=step.role
        )
    return ran


async def succeed_without_settling(pool: Pool, fence: Fence, run: RunRecord, key: str) -> None:
    """The success hot path's statement alone: as if the process died between its commit
    and the settle after it."""
    async with pool.connection() as connection:
        await connection.execute(
            RECORD_SUCCESS_QUERY,
            {
                "lease": fence.lease,
                "epoch": fence.epoch,
                "run": run.id,
                "key": key,
                "attempt": 1,
                "from": "running",
                "detail": Jsonb({}),
            },
        )


async def states(pool: Pool, run_id: int) -> dict[str, str]:
    return {task.task_key: task.state for task in await list_tasks(pool, run_id)}


async def kinds(pool: Pool, run_id: int) -> list[str]:
    return [event.kind for event in await run_history(pool, run_id)]


async def take_over(pool: Pool) -> tuple[Fence, Fence]:
    """The lease changes hands: returns (the deposed holder's fence, the successor's)."""
    lease = await current_lease(pool)
    assert lease is not None
    await release_lease(pool, lease)
    successor = await acquire_lease(pool, holder="successor", ttl=timedelta(minutes=5))
    assert successor is not None and successor.epoch == lease.epoch + 1
    return lease.fence, successor.fence


async def stored_edges(pool: Pool, run_id: int) -> dict[str, set[str]]:
    """Each task of the run -> the tasks it depends on, as the store holds the edges."""
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT task.task_key, upstream.task_key FROM flowforge_task_dependency AS edge "
            "JOIN flowforge_task AS task ON task.id = edge.task_id "
            "JOIN flowforge_task AS upstream ON upstream.id = edge.upstream_id "
            "WHERE edge.run_id = %s",
            (run_id,),
        )
        edges: dict[str, set[str]] = {}
        for task, upstream in await cursor.fetchall():
            edges.setdefault(task, set()).add(upstream)
    return edges
