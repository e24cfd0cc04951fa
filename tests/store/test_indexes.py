"""Each query the operator runs is served by its intended index (EXPLAIN after ANALYZE).

The cases are the module-level query constants of ``flowforge.store`` (every statement of a
move or a read that the store names); a test keeps the list complete, so a new query
cannot be added without saying which index serves it.

The tables here hold a few hundred rows, where a sequential scan is genuinely cheaper and
the planner rightly picks it. ``enable_seqscan = off`` makes a sequential scan a last
resort, so the plan shows whether the query *can* use the index (its columns, order and
partial-index predicate match); without a matching index PostgreSQL would still fall back
to a sequential scan, and the assertion would fail.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import flowforge.store
from flowforge.domain.states import CompensationState, TaskRole
from flowforge.store import (
    action_reads,
    actions,
    approvals,
    browse,
    cancel,
    definitions,
    dispatch,
    duplicates,
    events,
    final_reads,
    final_tasks,
    gates,
    holdings,
    items,
    kueue_admission,
    moves,
    outcomes,
    queries,
    queue,
    retention,
    reuse,
    runs,
    schedule_reads,
    settle,
    steps,
    stopping,
    sweep,
)
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.pool import open_pool
from tests.plugins.postgres import _create_database, _drop_database, dsn_for_database
from tests.store.conftest import NAMESPACE, failure, record, roll_back, start_run

pytestmark = pytest.mark.store

# a run by its id: the primary key, or migration 8's (id, namespace) key (as selective)
RUN_BY_ID = frozenset({"flowforge_run_pkey", "flowforge_run_id_namespace"})
# a run by its object's identity: the identity index, or the uid index (as selective)
RUN_BY_OBJECT = frozenset({"flowforge_run_identity", "flowforge_run_uid_idx"})
TASK_PKEY = "flowforge_task_pkey"
# the lease row by its name: the primary key, or migration 25's (name, epoch) key
LEASE_PKEY = frozenset({"flowforge_lease_pkey", "flowforge_lease_epoch_key"})
TASK_IDENTITY = "flowforge_task_identity"
PROGRESS = "flowforge_task_progress_idx"
EDGES = "flowforge_task_dependency_pkey"
EVENTS = "flowforge_event_run_idx"
JOBS_CREATED = "flowforge_event_job_created_idx"


def _plan_values(plan: Any, field: str) -> Iterator[str]:
    """Every value of ``field`` ("Index Name", "Node Type") in an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, dict):
        if field in plan:
            yield str(plan[field])
        for value in plan.values():
            yield from _plan_values(value, field)
    elif isinstance(plan, list):
        for item in plan:
            yield from _plan_values(item, field)


@dataclass(frozen=True)
class Populated:
    dsn: str
    pool: Pool
    run_id: int  # a run rolling back: forward tasks resolved, a compensator running
    task_id: int  # its root task
    compensator_id: int  # its pending compensator


TASKS: list[dict[str, Any]] = [
    {"key": "root"},
    *({"key": f"mid-{n}", "dependsOn": ["root"]} for n in range(10)),
    {"key": "sink", "dependsOn": [f"mid-{n}" for n in range(10)]},
    {"key": "undo-root", "compensateFor": "root"},
    {"key": "undo-sink", "compensateFor": "sink"},
    *({"key": f"undo-mid-{n}", "compensateFor": f"mid-{n}"} for n in range(10)),
]


@pytest.fixture(scope="module")
async def populated(postgres_server_dsn: str, postgres_template: str) -> AsyncIterator[Populated]:
    """One database for the module (the plans only EXPLAIN, nothing runs): twelve runs of a
    24-task graph, finished ones (succeeded, failed and rolled back), ones running, and the
    last one rolling back."""
    name = f"flowforge_indexes_{os.getpid()}"
    _create_database(postgres_server_dsn, name, template=postgres_template)
    dsn = dsn_for_database(postgres_server_dsn, name)
    store = await open_pool(dsn, min_size=1, max_size=2)
    try:
        lease = await acquire_lease(store, holder="test-operator", ttl=timedelta(minutes=5))
        assert lease is not None
        yield await _populate(store, lease.fence, dsn)
    finally:
        await store.close()
        _drop_database(postgres_server_dsn, name)


async def _populate(store: Pool, fence: Fence, dsn: str) -> Populated:
    run_id = 0
    for n in range(12):
        run = (await start_run(store, fence, TASKS, workflow=f"wf-{n}")).run
        run_id = run.id
        await dispatch_due(store, fence=fence, run_id=run.id)
        if n % 3 == 0:  # fails at once: Failed, nothing to undo
            await record(store, fence, run, "root", failure())
            continue
        await record(store, fence, run, "root")
        if n % 3 == 1 and n > 6:  # the mids run
            continue
        for m in range(9):
            await record(store, fence, run, f"mid-{m}")
        if n % 3 == 1:  # succeeds
            await record(store, fence, run, "mid-9")
            await record(store, fence, run, "sink")
            continue
        failed = await record(store, fence, run, "mid-9", failure())  # the rollback starts
        if n != 11:
            await roll_back(store, fence, run, failed)
    async with store.connection() as connection:
        await connection.execute("ANALYZE")
        cursor = await connection.execute(
            "SELECT (SELECT id FROM flowforge_task WHERE run_id = %(run)s AND task_key = 'root'),"
            " (SELECT id FROM flowforge_task WHERE run_id = %(run)s AND state = %(pending)s "
            "  ORDER BY id LIMIT 1)",
            {"run": run_id, "pending": CompensationState.PENDING},
        )
        row = await cursor.fetchone()
    assert row is not None and row[1] is not None
    return Populated(
        dsn=dsn, pool=store, run_id=run_id, task_id=int(row[0]), compensator_id=int(row[1])
    )


async def _plan(store: Pool, query: str, params: tuple[Any, ...] | dict[str, Any]) -> Any:
    async with store.connection() as connection:
        await connection.execute("SET enable_seqscan = off")
        cursor = await connection.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params)
        row = await cursor.fetchone()
        await connection.execute("RESET enable_seqscan")
    assert row is not None
    return row[0] if not isinstance(row[0], str) else json.loads(row[0])


Params = Callable[[Populated], tuple[Any, ...] | dict[str, Any]]


def _fenced(p: Populated, **more: Any) -> dict[str, Any]:
    return {"lease": "operator", "epoch": 1, "run": p.run_id, **more}


# each entry: one index of these the plan must use
Needs = tuple[frozenset[str], ...]


def needs(*indexes: str | frozenset[str]) -> Needs:
    return tuple(frozenset({i}) if isinstance(i, str) else i for i in indexes)


# a task row by (run, task key) or by (run, role, state): both are selective, the planner
# may pick either; what must not happen is a scan of the run
TASK_ROW = frozenset({TASK_IDENTITY, PROGRESS})
# the run row by its primary key, or by the partial index of active runs (the statement
# asks for an active run)
ACTIVE_RUN = RUN_BY_ID | {"flowforge_run_active_idx"}

# query -> (its parameters, the indexes its plan must use)
CASES: dict[str, tuple[str, Params, Needs]] = {
    # moves
    "outcomes.RECORD_SUCCESS_QUERY": (
        outcomes.RECORD_SUCCESS_QUERY,
        lambda p: _fenced(p, key="root", attempt=1, detail="{}", **{"from": "running"}),
        needs(LEASE_PKEY, RUN_BY_ID, TASK_ROW, EDGES, TASK_PKEY),
    ),
    "queries.SKIP_DOWNSTREAM_QUERY": (
        queries.SKIP_DOWNSTREAM_QUERY,
        lambda p: {"task": p.task_id},
        needs(EDGES, TASK_PKEY),
    ),
    "outcomes.LOCK_ATTEMPT_QUERY": (
        outcomes.LOCK_ATTEMPT_QUERY,
        lambda p: (p.run_id, "root", TaskRole.FORWARD, 1),
        needs(TASK_ROW),
    ),
    "queue.DISPATCH_QUERY": (
        queue.DISPATCH_QUERY,
        lambda p: {"run": p.run_id, "epoch": 1},
        needs(ACTIVE_RUN, PROGRESS, "flowforge_namespace_limits_pkey"),
    ),
    "queue.QUEUED_QUERY": (
        queue.QUEUED_QUERY,
        lambda p: (NAMESPACE,),
        needs("flowforge_run_queue_idx"),
    ),
    "duplicates.ORIGINAL_QUERY": (
        duplicates.ORIGINAL_QUERY,
        lambda p: (NAMESPACE, "release-1"),
        needs("flowforge_run_idempotency_key"),
    ),
    "duplicates.FINISH_WAITING_QUERY": (
        duplicates.FINISH_WAITING_QUERY,
        lambda p: (NAMESPACE,),
        needs("flowforge_run_queue_idx"),
    ),
    "queue.QUEUED_NAMESPACES_QUERY": (
        queue.QUEUED_NAMESPACES_QUERY,
        lambda p: (),
        needs("flowforge_run_queue_idx"),
    ),
    "queue.RUNNING_KEYS_QUERY": (
        queue.RUNNING_KEYS_QUERY,
        lambda p: (NAMESPACE,),
        needs(frozenset({"flowforge_run_running_idx", "flowforge_run_active_idx"})),
    ),
    "queue.RUNS_OF_KEY_QUERY": (
        queue.RUNS_OF_KEY_QUERY,
        lambda p: {"namespace": NAMESPACE, "key": "wf-3", "run": None},
        needs(
            frozenset(
                {
                    "flowforge_run_running_idx",
                    "flowforge_run_active_idx",
                    "flowforge_run_queue_idx",
                    "flowforge_run_unfinished_idx",
                }
            )
        ),
    ),
    "queue.OLDEST_RUNNING_QUERY": (
        queue.OLDEST_RUNNING_QUERY,
        lambda p: (NAMESPACE, "wf-3", 1),
        needs(frozenset({"flowforge_run_running_idx", "flowforge_run_active_idx"})),
    ),
    "queue.READY_RUNS_QUERY": (
        queue.READY_RUNS_QUERY,
        lambda p: {"namespace": NAMESPACE, "skip": 0},
        needs(frozenset({"flowforge_run_running_idx", "flowforge_run_active_idx"}), PROGRESS),
    ),
    "queue.POSITION_QUERY": (
        queue.POSITION_QUERY,
        lambda p: (p.run_id,),
        needs(RUN_BY_ID | {"flowforge_run_queue_idx"}, "flowforge_run_queue_idx"),
    ),
    "queue.LOCK_NAMESPACE_QUERY": (queue.LOCK_NAMESPACE_QUERY, lambda p: (NAMESPACE,), needs()),
    "queue.LOCK_NAMESPACE_OF_RUN_QUERY": (
        queue.LOCK_NAMESPACE_OF_RUN_QUERY,
        lambda p: ("x", p.run_id),
        needs(RUN_BY_ID),
    ),
    "queue.LIMITS_QUERY": (
        queue.LIMITS_QUERY,
        lambda p: (NAMESPACE,),
        needs("flowforge_namespace_limits_pkey"),
    ),
    # an insert (its conflict arbiter is the primary key, which no plan node names)
    "queue.UPSERT_LIMITS_QUERY": (
        queue.UPSERT_LIMITS_QUERY,
        lambda p: {"namespace": NAMESPACE, "runs": 1, "tasks": None, "parallel": None},
        needs(),
    ),
    "queue.NEXT_DUE_QUERY": (
        queue.NEXT_DUE_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "dispatch.JOBS_CREATED_QUERY": (
        dispatch.JOBS_CREATED_QUERY,
        lambda p: _fenced(p, keys=["root"], attempts=[1], details=["{}"]),
        needs(LEASE_PKEY, TASK_ROW),
    ),
    "kueue_admission.ADMISSION_QUERY": (
        kueue_admission.ADMISSION_QUERY,
        lambda p: _fenced(
            p,
            key="root",
            role="forward",
            attempt=1,
            admitted=True,
            at=None,
            kind="task.admitted",
            detail="{}",
        ),
        needs(LEASE_PKEY, TASK_ROW),
    ),
    "stopping.CANCEL_TASKS_QUERY": (
        stopping.CANCEL_TASKS_QUERY,
        lambda p: {"run": p.run_id, "reason": "x", "group": None},
        needs(PROGRESS, TASK_PKEY),
    ),
    "cancel.ABANDON_QUERY": (
        cancel.ABANDON_QUERY,
        lambda p: {"run": p.run_id, "reason": "x"},
        needs(PROGRESS),
    ),
    "settle.UNRESOLVED_QUERY": (
        settle.UNRESOLVED_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    "settle.TRIGGER_QUERY": (
        settle.TRIGGER_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS, TASK_IDENTITY),
    ),
    "settle.HOLD_UNRESOLVED_QUERY": (
        settle.HOLD_UNRESOLVED_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    "settle.NEXT_STEP_QUERY": (
        settle.NEXT_STEP_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS, "flowforge_task_one_running_compensator_idx"),
    ),
    "settle.START_STEP_QUERY": (
        settle.START_STEP_QUERY,
        lambda p: (p.compensator_id,),
        needs(TASK_PKEY),
    ),
    "steps.END_STEP_QUERY": (
        steps.END_STEP_QUERY,
        lambda p: {
            "state": "pending",
            "retry": False,
            "delay": None,
            "error": None,
            "keep": True,
            "id": p.compensator_id,
        },
        needs(TASK_PKEY),
    ),
    "browse.FIND_RUN_QUERY": (
        browse.FIND_RUN_QUERY,
        lambda p: {"namespace": "team-a", "name": "r"},
        needs("flowforge_run_identity"),
    ),
    "browse.LIST_RUNS_QUERY": (
        browse.LIST_RUNS_QUERY,
        lambda p: {
            "namespaces": ["team-a"],
            "workflow": None,
            "phase": None,
            "before": None,
            "limit": 50,
        },
        needs(RUN_BY_ID),  # newest first: a backward scan that stops at the limit
    ),
    "browse.RUN_PLACES_QUERY": (
        browse.RUN_PLACES_QUERY,
        lambda p: {
            "namespaces": ["team-a", "team-b"],
            "workflow": None,
            "phase": None,
            "before": p.run_id + 1,
            "limit": 50,
        },
        needs(RUN_BY_ID),  # as the run list: a backward scan that stops at the limit
    ),
    "browse.RUNS_BY_ID_QUERY": (
        browse.RUNS_BY_ID_QUERY,
        lambda p: {"ids": [p.run_id], "namespaces": ["team-a"]},
        needs(RUN_BY_ID),
    ),
    "runs.FIND_RUN_QUERY": (
        runs.FIND_RUN_QUERY,
        lambda p: (NAMESPACE, "wf-3-run", "x"),
        needs(RUN_BY_OBJECT),
    ),
    "reuse.CANDIDATES_QUERY": (
        reuse.CANDIDATES_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    # reads
    "definitions.LOAD_QUERY": (
        definitions.LOAD_QUERY,
        lambda p: (NAMESPACE, "wf-3", 1),
        needs("flowforge_definition_identity"),
    ),
    "definitions.LOAD_NEWEST_QUERY": (
        definitions.LOAD_NEWEST_QUERY,
        lambda p: (NAMESPACE, "wf-3"),
        needs("flowforge_definition_identity"),
    ),
    "sweep.SWEEP_QUERY": (
        sweep.SWEEP_QUERY,
        lambda p: {"after": 0, "limit": 100},
        needs("flowforge_run_active_idx", PROGRESS, JOBS_CREATED),
    ),
    "sweep.LISTED_RUNS_QUERY": (
        sweep.LISTED_RUNS_QUERY,
        lambda p: ([NAMESPACE, NAMESPACE], ["wf-3-run", "wf-4-run"], ["x", "y"]),
        needs(RUN_BY_OBJECT),
    ),
    "queries.RUN_BY_UID_QUERY": (
        queries.RUN_BY_UID_QUERY,
        lambda p: ("x",),
        needs("flowforge_run_uid_idx"),
    ),
    "definitions.FINGERPRINT_QUERY": (
        definitions.FINGERPRINT_QUERY,
        lambda p: (1,),
        needs("flowforge_definition_pkey"),
    ),
    "reuse.FIND_BY_NAME_QUERY": (
        reuse.FIND_BY_NAME_QUERY,
        lambda p: (NAMESPACE, "wf-3-run"),
        needs("flowforge_run_identity", "flowforge_definition_pkey"),
    ),
    "reuse.SOURCE_QUERY": (
        reuse.SOURCE_QUERY,
        lambda p: (NAMESPACE, "wf-3-run", "a-namespace-uid", "a-namespace-uid"),
        needs("flowforge_run_identity", "flowforge_definition_pkey"),
    ),
    "reuse.LIST_QUERY": (
        reuse.LIST_QUERY,
        lambda p: (NAMESPACE, None, None, 100),
        # newest first: a backward scan of the primary key that stops at the limit, or the
        # namespace's entries of the identity index, sorted
        needs(RUN_BY_ID | {"flowforge_run_identity"}, "flowforge_definition_pkey"),
    ),
    "queries.PROGRESS_QUERY": (queries.PROGRESS_QUERY, lambda p: (p.run_id,), needs(PROGRESS)),
    "queries.TOLERATED_COUNT_QUERY": (
        queries.TOLERATED_COUNT_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "items.TASK_ITEM_QUERY": (
        items.TASK_ITEM_QUERY,
        lambda p: (p.run_id, "root"),
        needs(TASK_IDENTITY),
    ),
    "items.RUN_ITEMS_QUERY": (
        items.RUN_ITEMS_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "items.GROUP_FAILURES_QUERY": (
        items.GROUP_FAILURES_QUERY,
        lambda p: (p.task_id,),
        needs(TASK_PKEY, PROGRESS),
    ),
    "items.RELEASE_TOLERATED_QUERY": (
        items.RELEASE_TOLERATED_QUERY,
        lambda p: {"task": p.task_id},
        needs(TASK_PKEY, EDGES),
    ),
    "queries.FORWARD_COUNTS_QUERY": (
        queries.FORWARD_COUNTS_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "queries.ADMITTING_COUNT_QUERY": (
        queries.ADMITTING_COUNT_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "queries.ACTIVE_TASKS_QUERY": (
        queries.ACTIVE_TASKS_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "queries.LATEST_OUTCOMES_QUERY": (
        queries.LATEST_OUTCOMES_QUERY,
        lambda p: (p.run_id, ["root", "sink"]),
        needs(EVENTS),
    ),
    "queries.RECORDED_JOBS_QUERY": (
        queries.RECORDED_JOBS_QUERY,
        lambda p: (p.run_id,),
        needs(JOBS_CREATED),
    ),
    "queries.RECORDED_JOB_UID_QUERY": (
        queries.RECORDED_JOB_UID_QUERY,
        lambda p: (p.run_id, "root", 1),
        needs(JOBS_CREATED),
    ),
    "queries.RECORDED_JOB_AGE_QUERY": (
        queries.RECORDED_JOB_AGE_QUERY,
        lambda p: (p.run_id, "root", 1, "a-uid"),
        needs(JOBS_CREATED),
    ),
    "queries.ROLLBACK_STEPS_QUERY": (
        queries.ROLLBACK_STEPS_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS, TASK_IDENTITY),
    ),
    "queries.SUCCEEDED_ATTEMPTS_QUERY": (
        queries.SUCCEEDED_ATTEMPTS_QUERY,
        lambda p: (p.run_id,),
        needs(TASK_ROW),
    ),
    "queries.CONDITION_FALSE_COUNT_QUERY": (
        queries.CONDITION_FALSE_COUNT_QUERY,
        lambda p: (p.run_id,),
        needs(PROGRESS),
    ),
    "settle.ATTEMPTED_QUERY": (
        settle.ATTEMPTED_QUERY,
        lambda p: {"run": p.run_id},
        needs(TASK_ROW),
    ),
    # people's actions on a halted rollback
    "actions.PROCESSED_QUERY": (
        actions.PROCESSED_QUERY,
        lambda p: {"run": p.run_id, "uid": "an-action-uid"},
        needs(EVENTS),
    ),
    "actions.RESUME_QUERY": (
        actions.RESUME_QUERY,
        lambda p: {"run": p.run_id},
        needs(TASK_ROW),
    ),
    "actions.FRESH_ATTEMPTS_QUERY": (
        actions.FRESH_ATTEMPTS_QUERY,
        lambda p: (p.run_id, "undo-root"),
        needs(RUN_BY_ID, "flowforge_definition_pkey"),
    ),
    "moves.SETTLE_PROBE_QUERY": (
        moves.SETTLE_PROBE_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    "moves.WORK_PROBE_QUERY": (
        moves.WORK_PROBE_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    "action_reads.ACTIONS_QUERY": (
        action_reads.ACTIONS_QUERY,
        lambda p: (p.run_id, 100),
        needs(EVENTS),
    ),
    "final_reads.FINAL_QUERY": (
        final_reads.FINAL_QUERY,
        lambda p: (p.run_id,),
        needs(RUN_BY_ID, TASK_ROW),
    ),
    "schedule_reads.SCHEDULES_QUERY": (
        schedule_reads.SCHEDULES_QUERY,
        lambda p: {"namespace": NAMESPACE, "uids": ["uid"], "grace": timedelta(seconds=60)},
        needs("flowforge_schedule_pkey"),
    ),
    "schedule_reads.FIRES_QUERY": (
        schedule_reads.FIRES_QUERY,
        lambda p: {"namespace": NAMESPACE, "name": "s", "uid": "u", "before": None, "limit": 10},
        needs(frozenset({"flowforge_schedule_fire_pkey", "flowforge_schedule_fire_once"})),
    ),
    "final_tasks.FINAL_STEP_QUERY": (
        final_tasks.FINAL_STEP_QUERY,
        lambda p: {"run": p.run_id},
        needs(PROGRESS),
    ),
    "final_tasks.SKIP_FINALS_QUERY": (
        final_tasks.SKIP_FINALS_QUERY,
        lambda p: {"run": p.run_id, "reason": "gone"},
        needs(PROGRESS),
    ),
    "gates.OVERDUE_QUERY": (gates.OVERDUE_QUERY, lambda p: (p.run_id,), needs(PROGRESS)),
    "approvals.GATE_QUERY": (
        approvals.GATE_QUERY,
        lambda p: {"run": p.run_id, "key": "root"},
        needs(RUN_BY_ID, "flowforge_definition_pkey"),
    ),
    "approvals.APPROVED_BY_QUERY": (
        approvals.APPROVED_BY_QUERY,
        lambda p: (p.run_id, "root"),
        needs(EVENTS),
    ),
    "events.HISTORY_QUERY": (events.HISTORY_QUERY, lambda p: (p.run_id, 0), needs(EVENTS)),
    "holdings.HOLDINGS_QUERY": (
        holdings.HOLDINGS_QUERY,
        lambda p: (NAMESPACE,),
        needs("flowforge_run_unfinished_idx"),
    ),
    "retention.PRUNABLE_QUERY": (
        retention.PRUNABLE_QUERY,
        lambda p: (timedelta(days=30), 100),
        needs("flowforge_run_prunable_idx"),
    ),
}


def _store_query_constants() -> set[str]:
    names = set()
    for module_info in pkgutil.iter_modules(flowforge.store.__path__):
        module = importlib.import_module(f"flowforge.store.{module_info.name}")
        for name, value in vars(module).items():
            if name.endswith("_QUERY") and isinstance(value, str):
                names.add(f"{module_info.name}.{name}")
    return names


# read only PostgreSQL's catalogs (what the login may do), never a store table
CATALOG_QUERIES = {"roles.LOGIN_POWERS_QUERY"}


def test_every_query_constant_of_the_store_has_an_index_case() -> None:
    assert _store_query_constants() - CATALOG_QUERIES == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_the_query_uses_its_index(name: str, populated: Populated) -> None:
    query, params, indexes = CASES[name]

    plan = await _plan(populated.pool, query, params(populated))

    used = set(_plan_values(plan, "Index Name"))
    missing = [sorted(choice) for choice in indexes if not choice & used]
    assert not missing, f"{name} should use one of each of {missing}, its plan uses {sorted(used)}"
    assert "Seq Scan" not in set(_plan_values(plan, "Node Type")), f"{name} scans a table"


async def test_counts_are_an_index_only_scan(populated: Populated) -> None:
    """A run's progress, and what a namespace holds (read at each run's admission when a
    policy caps it), never read the rows they count."""
    async with await psycopg.AsyncConnection.connect(populated.dsn, autocommit=True) as connection:
        # sets the visibility map
        await connection.execute("VACUUM (ANALYZE) flowforge_task, flowforge_run")
        await connection.execute("SET enable_seqscan = off")
        for query, params in (
            (queries.PROGRESS_QUERY, (populated.run_id,)),
            (queries.FORWARD_COUNTS_QUERY, (populated.run_id,)),
            (holdings.HOLDINGS_QUERY, (NAMESPACE,)),
        ):
            cursor = await connection.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params)
            row = await cursor.fetchone()
            assert row is not None
            assert "Index Only Scan" in set(_plan_values(row[0], "Node Type")), query
