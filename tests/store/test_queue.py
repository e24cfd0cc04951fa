"""The run limits (``store/queue.py``), on the real PostgreSQL: every limit is decided in the
transaction that dispatches, and two transactions racing for the last slot never both win."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.policy import Holdings
from flowforge.domain.queue import NamespaceLimits, QueueReason
from flowforge.domain.states import RunPhase, TaskRole, TaskState
from flowforge.domain.validation import parse_definition
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.definitions import StoredDefinition, load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due, serve_queue
from flowforge.store.holdings import namespace_holdings
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.queue import queue_position, queued_namespaces, set_namespace_limits
from flowforge.store.runs import RunRecord, create_run, get_run
from tests.store.conftest import NAMESPACE, SUCCESS, kinds, record

pytestmark = pytest.mark.store


async def publish(
    pool: Pool,
    *,
    workflow: str,
    tasks: Sequence[Mapping[str, Any]],
    namespace: str = NAMESPACE,
    **limits: Any,
) -> StoredDefinition:
    document = {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"py": {"image": "python:3.12-slim"}},
        "tasks": [{"type": "py", **task} for task in tasks],
        **limits,
    }
    await publish_definition(pool, namespace=namespace, definition=parse_definition(document))
    return await load_definition(pool, namespace=namespace, workflow=workflow, version=1)


async def new_run(
    pool: Pool,
    fence: Fence,
    definition: StoredDefinition,
    name: str,
    *,
    namespace: str = NAMESPACE,
    **options: Any,
) -> RunRecord:
    created = await create_run(
        pool,
        fence=fence,
        namespace=namespace,
        name=name,
        uid=str(uuid.uuid4()),
        definition=definition,
        **options,
    )
    return created.run


def started_runs(decision: Decision) -> set[int]:
    """Runs whose tasks the decision (or what it decided elsewhere) dispatched."""
    found = {job.run_id for job in decision.create_jobs}
    for other in decision.elsewhere:
        found |= started_runs(other.decision)
    return found


async def running_tasks(pool: Pool, run_id: int) -> int:
    return sum(task.state == TaskState.RUNNING for task in await list_tasks(pool, run_id))


FAN_OUT = [{"key": "root"}, *({"key": f"leaf-{i}", "dependsOn": ["root"]} for i in range(12))]


async def test_max_parallel_tasks_holds_a_fan_out_to_its_limit_and_finishes(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(store, workflow="wide", tasks=FAN_OUT, maxParallelTasks=5)
    run = await new_run(store, fence, definition, "wide-1", max_parallel_tasks=3)
    await dispatch_due(store, fence=fence, run_id=run.id)
    decision = await record(store, fence, run, "root")
    assert len(decision.create_jobs) == 3  # the run's 3, below the definition's 5
    running = [job.task_key for job in decision.create_jobs]
    finished = 1
    while running:
        key = running.pop(0)
        assert await running_tasks(store, run.id) <= 3
        decision = await record(store, fence, run, key)
        finished += 1
        running += [job.task_key for job in decision.create_jobs]
        assert await running_tasks(store, run.id) == len(running) <= 3
    assert finished == 13
    assert decision.phase is RunPhase.SUCCEEDED


async def test_the_namespace_cap_lowers_a_run_s_parallelism(store: Pool, fence: Fence) -> None:
    definition = await publish(store, workflow="capped", tasks=FAN_OUT)
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_parallel_tasks=2)
    )
    run = await new_run(store, fence, definition, "capped-1")
    await dispatch_due(store, fence=fence, run_id=run.id)
    decision = await record(store, fence, run, "root")
    assert len(decision.create_jobs) == 2


async def test_max_runs_queues_by_priority_then_age_and_a_finish_starts_the_next(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(
        store, workflow="nightly", tasks=[{"key": "only"}], concurrency={"maxRuns": 2}
    )
    runs = [
        await new_run(store, fence, definition, f"n-{i}", priority=priority)
        for i, priority in enumerate([0, 0, 0, 5, 0, 5])
    ]
    phases = [(await get_run(store, run.id)).phase for run in runs]
    assert phases[:2] == [RunPhase.RUNNING] * 2
    assert phases[2:] == [RunPhase.QUEUED] * 4
    where = await queue_position(store, runs[3].id)
    assert where is not None and where.reason is QueueReason.WORKFLOW_CONCURRENCY
    assert (where.position, where.queued, where.limit) == (1, 4, 2)
    order = []
    active = [runs[0], runs[1]]
    for run in active:
        await dispatch_due(store, fence=fence, run_id=run.id)
    while active:
        run = active.pop(0)
        decision = await record(store, fence, run, "only")
        assert decision.phase is RunPhase.SUCCEEDED
        for started in started_runs(decision) - {run.id}:
            order.append(started)
            active.append(next(r for r in runs if r.id == started))
    # priority 5 first (oldest first), then the rest by age
    assert order == [runs[3].id, runs[5].id, runs[2].id, runs[4].id]
    assert EventKind.RUN_ADMITTED in await kinds(store, runs[2].id)


async def test_two_workflows_share_the_namespace_run_limit(store: Pool, fence: Fence) -> None:
    first = await publish(store, workflow="first", tasks=[{"key": "a"}])
    second = await publish(store, workflow="second", tasks=[{"key": "b"}])
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=1)
    )
    one = await new_run(store, fence, first, "first-1")
    two = await new_run(store, fence, second, "second-1")
    other = await new_run(store, fence, second, "elsewhere", namespace="team-b")
    assert (await get_run(store, one.id)).phase is RunPhase.RUNNING
    assert (await get_run(store, two.id)).phase is RunPhase.QUEUED
    assert (await get_run(store, other.id)).phase is RunPhase.RUNNING  # its own namespace
    where = await queue_position(store, two.id)
    assert where is not None and where.reason is QueueReason.NAMESPACE_RUN_LIMIT
    await dispatch_due(store, fence=fence, run_id=one.id)
    decision = await record(store, fence, one, "a")
    assert started_runs(decision) == {two.id}  # in the decision that freed the slot


async def test_raising_a_namespace_limit_starts_what_it_held(store: Pool, fence: Fence) -> None:
    definition = await publish(store, workflow="held", tasks=[{"key": "a"}])
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=1)
    )
    await new_run(store, fence, definition, "held-1")
    queued = await new_run(store, fence, definition, "held-2")
    started = await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=2)
    )
    assert [other.run_id for other in started] == [queued.id]
    assert [job.task_key for job in started[0].decision.create_jobs] == ["a"]


async def test_a_queued_run_can_be_cancelled_and_never_starts(store: Pool, fence: Fence) -> None:
    definition = await publish(
        store, workflow="solo", tasks=[{"key": "a"}], concurrency={"maxRuns": 1}
    )
    first = await new_run(store, fence, definition, "solo-1")
    queued = await new_run(store, fence, definition, "solo-2")
    decision = await cancel_run(store, fence=fence, run_id=queued.id, reason="spec.cancel is true")
    assert decision.phase is RunPhase.CANCELLED and not decision.create_jobs
    await dispatch_due(store, fence=fence, run_id=first.id)
    finished = await record(store, fence, first, "a")
    assert started_runs(finished) == {first.id} - {first.id}
    assert EventKind.TASK_DISPATCHED not in await kinds(store, queued.id)


async def test_replace_cancels_the_oldest_which_rolls_back_and_then_the_new_one_starts(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(
        store,
        workflow="latest",
        tasks=[
            {"key": "a"},
            {"key": "b", "dependsOn": ["a"]},
            {"key": "undo-a", "compensateFor": "a"},
        ],
        concurrency={"maxRuns": 1, "key": ["tenant"], "policy": "Replace"},
    )
    old = await new_run(store, fence, definition, "old", parameters={"tenant": "x"})
    other_key = await new_run(store, fence, definition, "other", parameters={"tenant": "y"})
    await dispatch_due(store, fence=fence, run_id=old.id)
    await record(store, fence, old, "a")  # b runs now; a is to be undone
    new = await new_run(store, fence, definition, "new", parameters={"tenant": "x"})
    assert (await get_run(store, other_key.id)).phase is RunPhase.RUNNING
    assert (await get_run(store, new.id)).phase is RunPhase.QUEUED

    decision = await dispatch_due(store, fence=fence, run_id=new.id)

    replaced = {other.run_id: other.decision for other in decision.elsewhere}
    assert set(replaced) == {old.id}
    assert [job.task_key for job in replaced[old.id].stop_jobs] == ["b"]
    assert [job.task_key for job in replaced[old.id].create_jobs] == ["undo-a"]
    where = await queue_position(store, new.id)
    assert where is not None and where.reason is QueueReason.REPLACING
    # a second look does not cancel another run for it
    assert not (await dispatch_due(store, fence=fence, run_id=new.id)).elsewhere
    undone = await record(store, fence, old, "undo-a", role=TaskRole.COMPENSATION)
    assert undone.phase is RunPhase.CANCELLED
    assert started_runs(undone) == {new.id}
    assert EventKind.RUN_REPLACED in await kinds(store, old.id)


async def test_concurrent_creations_never_take_more_than_the_last_slot(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(
        store, workflow="race", tasks=[{"key": "a"}], concurrency={"maxRuns": 2}
    )
    runs = await asyncio.gather(*(new_run(store, fence, definition, f"race-{i}") for i in range(8)))
    phases = [(await get_run(store, run.id)).phase for run in runs]
    assert phases.count(RunPhase.RUNNING) == 2
    assert phases.count(RunPhase.QUEUED) == 6


async def test_concurrent_finishes_hand_on_exactly_the_slots_they_free(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(
        store, workflow="relay", tasks=[{"key": "a"}], concurrency={"maxRuns": 3}
    )
    runs = [await new_run(store, fence, definition, f"relay-{i}") for i in range(9)]
    running = runs[:3]
    for run in running:
        await dispatch_due(store, fence=fence, run_id=run.id)
    decisions = await asyncio.gather(*(record(store, fence, run, "a") for run in running))
    started = set().union(*(started_runs(d) for d in decisions))
    assert started == {run.id for run in runs[3:6]}
    phases = [(await get_run(store, run.id)).phase for run in runs]
    assert phases == [RunPhase.SUCCEEDED] * 3 + [RunPhase.RUNNING] * 3 + [RunPhase.QUEUED] * 3


async def test_concurrent_successes_share_the_namespace_task_limit(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(store, workflow="pool", tasks=FAN_OUT[:7])
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_tasks=4)
    )
    runs = [await new_run(store, fence, definition, f"pool-{i}") for i in range(3)]
    roots = [await dispatch_due(store, fence=fence, run_id=run.id) for run in runs]
    assert all(len(d.create_jobs) == 1 for d in roots)
    decisions = await asyncio.gather(*(record(store, fence, run, "root") for run in runs))
    total = sum(
        len(d.create_jobs) + sum(len(o.decision.create_jobs) for o in d.elsewhere)
        for d in decisions
    )
    counts = [await running_tasks(store, run.id) for run in runs]
    assert sum(counts) == total == 4
    # one more finishes: exactly one slot is handed on, to whichever run is next in line
    busy = next(run for run, n in zip(runs, counts, strict=True) if n)
    key = next(t.task_key for t in await list_tasks(store, busy.id) if t.state == "running")
    await record(store, fence, busy, key, SUCCESS)
    assert sum([await running_tasks(store, run.id) for run in runs]) == 4


async def test_a_finish_re_projects_every_held_run_whose_place_moved(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(
        store, workflow="line", tasks=[{"key": "only"}], concurrency={"maxRuns": 1}
    )
    runs = [await new_run(store, fence, definition, f"line-{i}") for i in range(4)]
    await dispatch_due(store, fence=fence, run_id=runs[0].id)
    decision = await record(store, fence, runs[0], "only")
    assert started_runs(decision) == {runs[1].id}
    # the held runs' places moved with the admission: their status is re-projected at once,
    # not at the reconciler's next pass
    assert {other.run_id for other in decision.elsewhere} == {run.id for run in runs[1:]}
    moved = {other.run_id for other in decision.elsewhere if other.decision.queue_moved}
    assert moved == {runs[2].id, runs[3].id}
    where = await queue_position(store, runs[3].id)
    assert where is not None and (where.position, where.queued) == (2, 2)
    # a pass over the queue when nothing changed re-projects (and so patches) nothing
    assert await serve_queue(store, fence=fence, namespace=NAMESPACE) == ()


async def test_a_queued_run_cancelled_moves_the_places_behind_it(store: Pool, fence: Fence) -> None:
    definition = await publish(
        store, workflow="leave", tasks=[{"key": "only"}], concurrency={"maxRuns": 1}
    )
    runs = [await new_run(store, fence, definition, f"leave-{i}") for i in range(4)]
    decision = await cancel_run(store, fence=fence, run_id=runs[1].id, reason="not needed")
    assert decision.phase is RunPhase.CANCELLED
    assert {other.run_id for other in decision.elsewhere} == {runs[2].id, runs[3].id}
    assert not started_runs(decision)
    where = await queue_position(store, runs[3].id)
    assert where is not None and (where.position, where.queued) == (2, 2)


async def test_the_queue_s_pass_starts_what_a_missed_hand_off_left_waiting(
    store: Pool, fence: Fence
) -> None:
    definition = await publish(store, workflow="missed", tasks=[{"key": "a"}])
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=1)
    )
    await new_run(store, fence, definition, "missed-1")
    queued = [await new_run(store, fence, definition, f"missed-{i}") for i in (2, 3)]
    assert await queued_namespaces(store) == [NAMESPACE]
    async with store.connection() as connection:  # raised behind the operator's back
        await connection.execute(
            "UPDATE flowforge_namespace_limits SET max_running_runs = 2 WHERE namespace = %s",
            (NAMESPACE,),
        )
    decisions = await serve_queue(store, fence=fence, namespace=NAMESPACE)
    started = {other.run_id for other in decisions if other.decision.create_jobs}
    assert started == {queued[0].id}  # first come first served
    assert (await get_run(store, queued[1].id)).phase is RunPhase.QUEUED


async def test_a_replace_run_held_by_the_namespace_cancels_the_oldest_when_a_slot_frees(
    store: Pool, fence: Fence
) -> None:
    other = await publish(store, workflow="other", tasks=[{"key": "a"}])
    latest = await publish(
        store,
        workflow="newest",
        tasks=[{"key": "a"}],
        concurrency={"maxRuns": 1, "policy": "Replace"},
    )
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=2)
    )
    busy = await new_run(store, fence, other, "busy")
    old = await new_run(store, fence, latest, "old")
    new = await new_run(store, fence, latest, "new")
    for run in (busy, old):
        await dispatch_due(store, fence=fence, run_id=run.id)
    # the namespace holds it first: nothing to replace yet
    assert not (await dispatch_due(store, fence=fence, run_id=new.id)).elsewhere
    assert (await get_run(store, old.id)).phase is RunPhase.RUNNING

    # the finish that frees the namespace's slot cancels the oldest of the key at once (not
    # when the waiting run is next looked at), which finishes and starts the new one
    decision = await record(store, fence, busy, "a")
    replaced = {o.run_id: o.decision for o in decision.elsewhere}
    assert [job.task_key for job in replaced[old.id].stop_jobs] == ["a"]
    assert (await get_run(store, old.id)).phase is RunPhase.CANCELLED
    assert new.id in started_runs(decision)
    assert EventKind.RUN_REPLACED in await kinds(store, old.id)


async def test_two_replace_runs_each_cancel_for_their_own_slot(store: Pool, fence: Fence) -> None:
    definition = await publish(
        store,
        workflow="pair",
        tasks=[{"key": "a"}],
        concurrency={"maxRuns": 2, "policy": "Replace"},
    )
    old = [await new_run(store, fence, definition, f"pair-old-{i}") for i in range(2)]
    for run in old:
        await dispatch_due(store, fence=fence, run_id=run.id)
    new = [await new_run(store, fence, definition, f"pair-new-{i}") for i in range(2)]
    await dispatch_due(store, fence=fence, run_id=new[0].id)
    # both running runs are cancelled: one for each newer run, not one for both
    assert [(await get_run(store, run.id)).phase for run in old] == [RunPhase.CANCELLED] * 2
    assert [(await get_run(store, run.id)).phase for run in new] == [RunPhase.RUNNING] * 2


async def test_holdings_count_the_queue_and_the_rows_of_unfinished_runs_only(
    store: Pool, fence: Fence
) -> None:
    quick = await publish(store, workflow="quick", tasks=[{"key": "a"}])
    # 3 forward rows, one compensator row, one finally row
    definition = await publish(
        store,
        workflow="held-rows",
        tasks=[
            {"key": "a"},
            {"key": "b", "dependsOn": ["a"]},
            {"key": "c", "dependsOn": ["b"]},
            {"key": "undo-a", "compensateFor": "a"},
        ],
        **{"finally": [{"key": "report", "type": "py"}]},
    )
    await set_namespace_limits(
        store, fence=fence, namespace=NAMESPACE, limits=NamespaceLimits(max_running_runs=1)
    )
    first = await new_run(store, fence, quick, "quick-1")
    await new_run(store, fence, definition, "rows-1")
    await new_run(store, fence, definition, "rows-2")
    await new_run(store, fence, definition, "elsewhere", namespace="team-b")
    assert await namespace_holdings(store, NAMESPACE) == Holdings(queued_runs=2, task_rows=11)
    await dispatch_due(store, fence=fence, run_id=first.id)
    await record(store, fence, first, "a")
    # the finished run's row is no longer held; the next run left the queue
    assert await namespace_holdings(store, NAMESPACE) == Holdings(queued_runs=1, task_rows=10)
    assert await namespace_holdings(store, "team-c") == Holdings(queued_runs=0, task_rows=0)
