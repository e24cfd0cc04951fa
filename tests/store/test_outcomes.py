"""``store.outcomes.record_outcome`` for forward tasks: the one-statement success that
releases and dispatches, the failure with a retry, the final failure that skips what is
downstream, and the compare-and-set that makes a replayed outcome a lost race."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.execution import AttemptOutcome, OutcomeReason, lost_outcome
from flowforge.domain.history import EventKind
from flowforge.domain.states import RunPhase, TaskRole, TaskState
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.moves import settle_run
from flowforge.store.pool import open_pool
from flowforge.store.queries import forward_counts, latest_outcomes, list_tasks
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import (
    AN_HOUR,
    DIAMOND,
    SUCCESS,
    failure,
    finish,
    kinds,
    record,
    start_run,
    states,
    succeed_without_settling,
)

pytestmark = pytest.mark.store

FAN_OUT: list[dict[str, Any]] = [
    *({"key": f"root-{n}"} for n in range(3)),
    {"key": "join", "dependsOn": ["root-0", "root-1", "root-2"]},
]
# two independent branches: a -> b -> c, a -> d <- e, e -> f
BRANCHES: list[dict[str, Any]] = [
    {"key": "a"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "c", "dependsOn": ["b"]},
    {"key": "d", "dependsOn": ["a", "e"]},
    {"key": "e"},
    {"key": "f", "dependsOn": ["e"]},
]


async def _running(store: Pool, fence: Fence, tasks: list[dict[str, Any]]) -> RunRecord:
    run = (await start_run(store, fence, tasks)).run
    await dispatch_due(store, fence=fence, run_id=run.id)
    return run


# --- success --------------------------------------------------------------------------


async def test_a_success_releases_and_dispatches_its_dependents_in_one_commit(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, DIAMOND)
    outcome = AttemptOutcome(
        succeeded=True,
        reason=OutcomeReason.COMPLETED,
        exit_code=0,
        started_at=datetime(2026, 11, 30, 1, 0, tzinfo=UTC),
        finished_at=datetime(2026, 11, 30, 1, 5, tzinfo=UTC),
    )

    decision = await record(store, fence, run, "extract", outcome)

    assert decision.recorded and decision.phase is None
    assert decision.outcome is not None
    assert (decision.outcome.job.task_key, decision.outcome.reason) == ("extract", "Completed")
    assert [(d.task_key, d.attempt, d.role) for d in decision.create_jobs] == [
        ("clean", 1, TaskRole.FORWARD),
        ("enrich", 1, TaskRole.FORWARD),
    ]
    assert await states(store, run.id) == {
        "extract": TaskState.SUCCEEDED,
        "clean": TaskState.RUNNING,
        "enrich": TaskState.RUNNING,
        "load": TaskState.WAITING,
    }
    history = [(e.kind, e.task_key) for e in await run_history(store, run.id)]
    assert history[-5:] == [
        (EventKind.TASK_SUCCEEDED, "extract"),
        (EventKind.TASK_RELEASED, "clean"),
        (EventKind.TASK_RELEASED, "enrich"),
        (EventKind.TASK_DISPATCHED, "clean"),
        (EventKind.TASK_DISPATCHED, "enrich"),
    ]
    detail = (await latest_outcomes(store, run.id, ["extract"]))["extract"]
    assert detail == {
        "reason": "Completed",
        "message": "",
        "exitCode": 0,
        "startedAt": "2026-11-30T01:00:00+00:00",
        "finishedAt": "2026-11-30T01:05:00+00:00",
    }


async def test_a_run_whose_tasks_all_succeed_finishes_succeeded_on_the_last_outcome(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, DIAMOND)

    decisions = [await record(store, fence, run, key) for key in ("extract", "clean", "enrich")]
    last = await record(store, fence, run, "load")

    assert [d.phase for d in decisions] == [None, None, None]
    assert [d.task_key for d in decisions[2].create_jobs] == ["load"]
    assert last.phase is RunPhase.SUCCEEDED and last.finished
    assert [n.reason for n in last.notices] == ["RunSucceeded"]
    run_row = await get_run(store, run.id)
    assert run_row.phase is RunPhase.SUCCEEDED and run_row.finished_at is not None
    counts = await forward_counts(store, run.id)
    assert (counts.total, counts.succeeded) == (4, 4)
    history = await kinds(store, run.id)
    assert history[0] == EventKind.RUN_CREATED and history[-1] == EventKind.RUN_SUCCEEDED
    assert history.count(EventKind.TASK_RELEASED) == 3
    assert history.count(EventKind.TASK_DISPATCHED) == 4


async def test_the_last_upstream_success_dispatches_the_join_and_the_join_settles_the_run(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, FAN_OUT)

    first = await record(store, fence, run, "root-0")
    await record(store, fence, run, "root-1")
    last = await record(store, fence, run, "root-2")

    assert first.recorded and first.create_jobs == () and first.phase is None
    assert [d.task_key for d in last.create_jobs] == ["join"] and last.phase is None
    join = next(t for t in await list_tasks(store, run.id) if t.task_key == "join")
    assert (join.state, join.pending_dependencies) == (TaskState.RUNNING, 0)
    finished = await record(store, fence, run, "join")
    assert finished.phase is RunPhase.SUCCEEDED


async def test_a_replayed_success_is_a_lost_race_that_records_and_releases_nothing(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, DIAMOND)
    await record(store, fence, run, "extract")
    before = await run_history(store, run.id)

    again = await record(store, fence, run, "extract")

    assert again == Decision.lost()
    assert await run_history(store, run.id) == before
    load = next(t for t in await list_tasks(store, run.id) if t.task_key == "load")
    assert load.pending_dependencies == 2


async def test_an_outcome_is_compare_and_set_on_the_running_attempt(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, [*DIAMOND, {"key": "x", "retries": 2}])).run

    not_dispatched = await record(store, fence, run, "extract")
    await dispatch_due(store, fence=fence, run_id=run.id)
    waiting = await record(store, fence, run, "clean")
    wrong_attempt = await record(store, fence, run, "extract", attempt=2)
    wrong_role = await record(store, fence, run, "extract", role=TaskRole.COMPENSATION)
    unknown = await record(store, fence, run, "no-such-task")
    failure_of_wrong_attempt = await record(store, fence, run, "x", failure(), attempt=2)

    assert [
        not_dispatched.recorded,
        waiting.recorded,
        wrong_attempt.recorded,
        wrong_role.recorded,
        unknown.recorded,
        failure_of_wrong_attempt.recorded,
    ] == [False] * 6
    assert (await states(store, run.id))["extract"] == TaskState.RUNNING
    x = next(t for t in await list_tasks(store, run.id) if t.task_key == "x")
    assert (x.state, x.attempt) == (TaskState.RUNNING, 1)
    assert (await record(store, fence, run, "extract")).recorded
    assert not (await record(store, fence, run, "extract", failure())).recorded
    assert (await states(store, run.id))["extract"] == TaskState.SUCCEEDED


async def test_a_task_with_fifty_upstreams_finishing_together_is_dispatched_once(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    upstreams = [{"key": f"part-{n:02d}"} for n in range(50)]
    sink = {"key": "merge", "dependsOn": [task["key"] for task in upstreams]}
    run = await _running(store, fence, [*upstreams, sink])

    wide = await open_pool(store_dsn, min_size=50, max_size=50)
    try:
        decisions = await asyncio.gather(
            *(record(wide, fence, run, task["key"]) for task in upstreams)
        )
    finally:
        await wide.close()

    assert all(d.recorded for d in decisions)
    assert [[j.task_key for j in d.create_jobs] for d in decisions if d.create_jobs] == [["merge"]]
    merge = next(t for t in await list_tasks(store, run.id) if t.task_key == "merge")
    assert (merge.state, merge.pending_dependencies) == (TaskState.RUNNING, 0)
    history = await run_history(store, run.id)
    released = [e.task_key for e in history if e.kind == EventKind.TASK_RELEASED]
    assert released == ["merge"]
    assert [e.task_key for e in history if e.kind == EventKind.TASK_DISPATCHED].count("merge") == 1
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING


async def test_the_last_tasks_finishing_together_settle_the_run_once(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, [{"key": f"t{n}"} for n in range(8)])

    wide = await open_pool(store_dsn, min_size=8, max_size=8)
    try:
        decisions = await asyncio.gather(*(record(wide, fence, run, f"t{n}") for n in range(8)))
    finally:
        await wide.close()

    assert [d.phase for d in decisions].count(RunPhase.SUCCEEDED) == 1
    assert [d.phase for d in decisions].count(None) == 7
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED
    assert (await kinds(store, run.id)).count(EventKind.RUN_SUCCEEDED) == 1


async def test_a_success_whose_settle_was_lost_is_settled_by_the_backstop(
    store: Pool, fence: Fence
) -> None:
    """The process died between the success's commit and the settle after it: the
    reconciler's ``settle_run`` finishes the run, exactly once."""
    run = await _running(store, fence, [{"key": "only"}])
    await succeed_without_settling(store, fence, run, "only")
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING

    settled = await settle_run(store, fence=fence, run_id=run.id)
    again = await settle_run(store, fence=fence, run_id=run.id)

    assert settled.phase is RunPhase.SUCCEEDED
    assert again == Decision.lost()
    assert (await kinds(store, run.id)).count(EventKind.RUN_SUCCEEDED) == 1


async def test_settle_changes_nothing_while_forward_work_remains(store: Pool, fence: Fence) -> None:
    run = await _running(store, fence, DIAMOND)
    before = await run_history(store, run.id)

    assert await settle_run(store, fence=fence, run_id=run.id) == Decision.lost()
    assert await run_history(store, run.id) == before


# --- failure and retry ----------------------------------------------------------------


async def test_a_failure_with_attempts_left_dispatches_the_next_attempt_when_due(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, [{"key": "flaky", "retries": 2}])

    retry = await record(store, fence, run, "flaky", failure("exit code 3"))

    assert retry.recorded and retry.phase is None
    assert [(d.task_key, d.attempt) for d in retry.create_jobs] == [("flaky", 2)]
    assert [(n.reason, n.warning) for n in retry.notices] == [("TaskRetrying", True)]
    flaky = (await list_tasks(store, run.id))[0]
    assert (flaky.state, flaky.attempt, flaky.last_error) == (
        TaskState.RUNNING,
        2,
        "exit code 3",
    )
    failed = [
        e for e in await run_history(store, run.id) if e.kind == EventKind.TASK_ATTEMPT_FAILED
    ]
    assert [(e.task_key, e.attempt, e.detail["exitCode"]) for e in failed] == [("flaky", 1, 3)]
    assert failed[0].detail["retryInSeconds"] == 0.0
    assert not (await record(store, fence, run, "flaky", failure())).recorded  # attempt 1 again
    done = await record(store, fence, run, "flaky", attempt=2)
    assert done.phase is RunPhase.SUCCEEDED


async def test_a_retry_waits_for_its_backoff_and_says_when_to_wake(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, [{"key": "flaky", "retries": 1}])

    retry = await record(store, fence, run, "flaky", failure(), backoff=AN_HOUR)

    assert retry.recorded and retry.create_jobs == ()
    assert retry.wake_in is not None  # seconds, on the database's clock
    assert AN_HOUR.first_delay_seconds - 60 < retry.wake_in <= AN_HOUR.first_delay_seconds
    flaky = (await list_tasks(store, run.id))[0]
    assert (flaky.state, flaky.attempt) == (TaskState.READY, 2)
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING


async def test_a_failure_after_the_last_attempt_fails_the_task_and_the_run(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, [{"key": "flaky", "retries": 1}])
    await record(store, fence, run, "flaky", failure())

    final = await record(store, fence, run, "flaky", failure("exit code 4", exit_code=4), attempt=2)

    assert final.phase is RunPhase.FAILED and final.create_jobs == ()
    assert [n.reason for n in final.notices] == ["TaskFailed", "RunFailed"]
    flaky = (await list_tasks(store, run.id))[0]
    assert (flaky.state, flaky.attempt, flaky.last_error) == (
        TaskState.FAILED,
        2,
        "exit code 4",
    )
    history = await kinds(store, run.id)
    assert history.count(EventKind.TASK_ATTEMPT_FAILED) == 1
    assert history[-2:] == [EventKind.TASK_FAILED, EventKind.RUN_FAILED]


async def test_a_vanished_job_is_a_failed_attempt_with_nothing_left_to_delete(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, [{"key": "a", "retries": 1}])

    decision = await record(
        store, fence, run, "a", lost_outcome(job="etl-run-a-1-x", now=datetime.now(UTC))
    )

    assert decision.outcome is not None and decision.outcome.job_gone
    assert [(d.task_key, d.attempt) for d in decision.create_jobs] == [("a", 2)]
    assert (await list_tasks(store, run.id))[0].last_error == (
        "Job etl-run-a-1-x vanished before its outcome was recorded"
    )


# --- final failure skips downstream ---------------------------------------------------


async def test_a_final_failure_skips_everything_downstream_and_nothing_else(
    store: Pool, fence: Fence
) -> None:
    run = await _running(store, fence, BRANCHES)

    failed = await record(store, fence, run, "a", failure())

    assert failed.recorded and failed.phase is None and failed.create_jobs == ()
    (notice,) = failed.notices
    assert notice.reason == "TaskFailed" and notice.message.endswith("; skipped b, c, d")
    assert await states(store, run.id) == {
        "a": TaskState.FAILED,
        "b": TaskState.SKIPPED,
        "c": TaskState.SKIPPED,
        "d": TaskState.SKIPPED,
        "e": TaskState.RUNNING,
        "f": TaskState.WAITING,
    }
    skipped = [
        e.task_key for e in await run_history(store, run.id) if e.kind == EventKind.TASK_SKIPPED
    ]
    assert skipped == ["b", "c", "d"]

    # the independent branch goes on; its success releases f but never the skipped d
    e = await record(store, fence, run, "e")
    assert [d.task_key for d in e.create_jobs] == ["f"] and e.phase is None
    last = await finish(store, fence, run, "f")
    assert last.phase is RunPhase.FAILED
    counts = await forward_counts(store, run.id)
    assert (counts.succeeded, counts.failed, counts.skipped) == (2, 1, 3)


async def test_a_failure_dispatches_the_retries_that_are_due_in_the_same_run(
    store: Pool, fence: Fence
) -> None:
    """The failure path ends with ``dispatch_due``: a retry of another task whose backoff
    is over is dispatched by it too (nothing is left to a wake-up that may be late)."""
    run = await _running(store, fence, [{"key": "p", "retries": 1}, {"key": "q"}])
    await record(store, fence, run, "p", failure(), backoff=AN_HOUR)
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_task SET not_before = now() - interval '1 second' "
            "WHERE run_id = %s AND task_key = 'p'",
            (run.id,),
        )

    q_failed = await record(store, fence, run, "q", failure())

    assert [(d.task_key, d.attempt) for d in q_failed.create_jobs] == [("p", 2)]
    assert q_failed.phase is None


async def test_an_outcome_of_a_skipped_task_is_lost(store: Pool, fence: Fence) -> None:
    run = await _running(store, fence, BRANCHES)
    await record(store, fence, run, "a", failure())
    before = await run_history(store, run.id)

    assert await record(store, fence, run, "b", SUCCESS) == Decision.lost()
    assert (await states(store, run.id))["b"] == TaskState.SKIPPED
    assert await run_history(store, run.id) == before


@pytest.mark.parametrize("held_back", [EventKind.TASK_FAILED, EventKind.TASK_SUCCEEDED])
async def test_a_failure_and_a_success_finishing_together_settle_the_run(
    held_back: EventKind, store_dsn: str, store: Pool, fence: Fence
) -> None:
    """The failure decides under the run's lock before it commits; the success probes after
    its own commit without a lock. With one of them held back in its COMMIT (a deferred
    trigger sleeps there) while the other decides, one of the two must still see the other
    and settle the run, exactly once."""
    run = await _running(store, fence, [{"key": "left"}, {"key": "right"}])
    async with await psycopg.AsyncConnection.connect(store_dsn, autocommit=True) as admin:
        await admin.execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$"
        )
        await admin.execute(
            "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON flowforge_event "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
            f"WHEN (NEW.kind = '{held_back}') EXECUTE FUNCTION slow_commit()"
        )
    fail = record(store, fence, run, "left", failure())
    succeed = record(store, fence, run, "right")
    first, second = (fail, succeed) if held_back is EventKind.TASK_FAILED else (succeed, fail)

    held = asyncio.ensure_future(first)
    await asyncio.sleep(0.2)  # it has decided and waits in its COMMIT
    other = await second
    decisions = [await held, other]

    assert [d.phase for d in decisions].count(RunPhase.FAILED) == 1
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED
    assert (await kinds(store, run.id)).count(EventKind.RUN_FAILED) == 1
