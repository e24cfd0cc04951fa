"""The rollback, as the store runs it through ``record_outcome`` and ``settle_*``: the
compensators of what succeeded, strictly one at a time, in reverse dependency order, each
started by the decision that finished the one before; a retry waits its backoff, a final
failure halts the rollback, a cancel rolls back too."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskRole
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.dispatch import dispatch_due
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.moves import settle_run
from flowforge.store.queries import list_tasks, rollback_started_at, rollback_steps
from flowforge.store.runs import RunRecord, get_run
from tests.store.conftest import (
    AN_HOUR,
    failure,
    finish,
    kinds,
    record,
    roll_back,
    start_run,
    states,
)

pytestmark = pytest.mark.store

CHAIN: list[dict[str, Any]] = [
    {"key": "provision"},
    {"key": "deploy", "dependsOn": ["provision"]},
    {"key": "verify", "dependsOn": ["deploy"]},
    {"key": "unprovision", "compensateFor": "provision"},
    {"key": "undeploy", "compensateFor": "deploy", "retries": 1},
    {"key": "unverify", "compensateFor": "verify"},
]
# declared out of order: the rollback follows the graph, not the declaration
DIAMOND: list[dict[str, Any]] = [
    {"key": "undo-d", "compensateFor": "d"},
    {"key": "undo-a", "compensateFor": "a"},
    {"key": "d", "dependsOn": ["b", "c"]},
    {"key": "c", "dependsOn": ["a"]},
    {"key": "undo-c", "compensateFor": "c"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "undo-b", "compensateFor": "b"},
    {"key": "a"},
    {"key": "e"},
]


async def _compensators(store: Pool, run_id: int) -> dict[str, str]:
    return {
        t.task_key: t.state
        for t in await list_tasks(store, run_id)
        if t.role is TaskRole.COMPENSATION
    }


async def _until_verify_fails(store: Pool, fence: Fence) -> tuple[RunRecord, Decision]:
    run = (await start_run(store, fence, CHAIN)).run
    await finish(store, fence, run, "provision")
    await record(store, fence, run, "deploy")
    failed = await record(store, fence, run, "verify", failure())
    return run, failed


async def test_a_final_failure_triggers_the_rollback_and_starts_the_last_step_first(
    store: Pool, fence: Fence
) -> None:
    run, failed = await _until_verify_fails(store, fence)

    assert failed.recorded and failed.phase is None
    assert [(d.task_key, d.role, d.attempt) for d in failed.create_jobs] == [
        ("undeploy", TaskRole.COMPENSATION, 1)
    ]
    assert [n.reason for n in failed.notices] == ["TaskFailed", "RollbackStarted"]
    assert failed.notices[1].message.endswith("undeploy -> unprovision")
    run_row = await get_run(store, run.id)
    assert (run_row.phase, run_row.compensating) == (RunPhase.RUNNING, True)
    assert await _compensators(store, run.id) == {
        "unprovision": CompensationState.PENDING,
        "undeploy": CompensationState.RUNNING,
        "unverify": CompensationState.SKIPPED,  # verify never succeeded
    }
    assert [(s.task_key, s.compensates_key) for s in await rollback_steps(store, run.id)] == [
        ("undeploy", "deploy"),
        ("unprovision", "provision"),
    ]
    assert await rollback_started_at(store, run.id) is not None
    compensating = [
        e for e in await run_history(store, run.id) if e.kind == EventKind.RUN_COMPENSATING
    ]
    assert [dict(e.detail) for e in compensating] == [{"order": ["undeploy", "unprovision"]}]


async def test_the_rollback_runs_one_at_a_time_then_the_run_finishes_failed(
    store: Pool, fence: Fence
) -> None:
    run, _ = await _until_verify_fails(store, fence)

    # while undeploy runs nothing else starts, whoever asks
    assert await settle_run(store, fence=fence, run_id=run.id) == Decision.lost()
    assert (await dispatch_due(store, fence=fence, run_id=run.id)).create_jobs == ()
    assert (await _compensators(store, run.id))["unprovision"] == CompensationState.PENDING

    undeployed = await record(store, fence, run, "undeploy", role=TaskRole.COMPENSATION)

    assert [(d.task_key, d.role) for d in undeployed.create_jobs] == [
        ("unprovision", TaskRole.COMPENSATION)
    ]
    assert undeployed.phase is None
    assert [n.reason for n in undeployed.notices] == ["CompensationSucceeded"]
    done = await record(store, fence, run, "unprovision", role=TaskRole.COMPENSATION)
    assert done.phase is RunPhase.FAILED and done.create_jobs == ()
    run_row = await get_run(store, run.id)
    assert (run_row.phase, run_row.compensating) == (RunPhase.FAILED, False)
    history = [(e.kind, e.task_key) for e in await run_history(store, run.id)]
    assert [h for h in history if h[0].startswith("compensation.")] == [
        (EventKind.COMPENSATION_TRIGGERED, "undeploy"),
        (EventKind.COMPENSATION_TRIGGERED, "unprovision"),
        (EventKind.COMPENSATION_SKIPPED, "unverify"),
        (EventKind.COMPENSATION_STARTED, "undeploy"),
        (EventKind.COMPENSATION_SUCCEEDED, "undeploy"),
        (EventKind.COMPENSATION_STARTED, "unprovision"),
        (EventKind.COMPENSATION_SUCCEEDED, "unprovision"),
    ]
    assert history[-1] == (EventKind.RUN_FAILED, None)


async def test_the_rollback_order_is_the_reverse_topological_order(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, DIAMOND)).run
    for key in ("a", "b", "c", "d"):
        await finish(store, fence, run, key)
    failed = await finish(store, fence, run, "e", failure())

    ran = await roll_back(store, fence, run, failed)

    assert ran == ["undo-d", "undo-c", "undo-b", "undo-a"]
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED


async def test_the_last_success_after_a_failure_elsewhere_starts_the_rollback(
    store: Pool, fence: Fence
) -> None:
    """The success hot path settles after its commit when it released nothing: the
    rollback starts from it, and includes the compensator of the task that just succeeded."""
    tasks: list[dict[str, Any]] = [
        {"key": "left"},
        {"key": "right"},
        {"key": "undo-left", "compensateFor": "left"},
        {"key": "undo-right", "compensateFor": "right"},
    ]
    run = (await start_run(store, fence, tasks)).run
    await dispatch_due(store, fence=fence, run_id=run.id)
    failed = await record(store, fence, run, "left", failure())
    assert failed.phase is None and failed.create_jobs == ()  # right still runs

    last = await record(store, fence, run, "right")

    assert [(d.task_key, d.role) for d in last.create_jobs] == [
        ("undo-right", TaskRole.COMPENSATION)
    ]
    assert (await _compensators(store, run.id))["undo-left"] == CompensationState.SKIPPED
    assert await roll_back(store, fence, run, last) == ["undo-right"]
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED


async def test_the_database_refuses_a_second_running_compensator(
    store_dsn: str, store: Pool, fence: Fence
) -> None:
    run, _ = await _until_verify_fails(store, fence)
    async with await psycopg.AsyncConnection.connect(store_dsn) as connection:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await connection.execute(
                "UPDATE flowforge_task SET state = %s "
                "WHERE run_id = %s AND task_key = 'unprovision'",
                (CompensationState.RUNNING, run.id),
            )


async def test_a_failed_compensator_with_attempts_left_runs_again_before_the_next_step(
    store: Pool, fence: Fence
) -> None:
    run, _ = await _until_verify_fails(store, fence)

    retry = await record(store, fence, run, "undeploy", failure("busy"), role=TaskRole.COMPENSATION)

    assert [(d.task_key, d.attempt) for d in retry.create_jobs] == [("undeploy", 2)]
    assert [n.reason for n in retry.notices] == ["CompensationRetrying"]
    assert (await _compensators(store, run.id))["unprovision"] == CompensationState.PENDING
    assert EventKind.COMPENSATION_ATTEMPT_FAILED in await kinds(store, run.id)
    step = (await rollback_steps(store, run.id))[0]
    assert (step.task_key, step.state, step.attempt, step.last_error) == (
        "undeploy",
        CompensationState.RUNNING,
        2,
        "NonZeroExitCode: busy",
    )
    undeployed = await record(store, fence, run, "undeploy", attempt=2, role=TaskRole.COMPENSATION)
    assert [d.task_key for d in undeployed.create_jobs] == ["unprovision"]
    undone = {step.task_key: step for step in await rollback_steps(store, run.id)}["undeploy"]
    # its success keeps the error of the attempt before it (a finally task's clears it)
    assert (undone.state, undone.last_error) == (
        CompensationState.SUCCEEDED,
        "NonZeroExitCode: busy",
    )


async def test_a_compensator_retry_waits_for_its_backoff_and_the_rollback_waits_with_it(
    store: Pool, fence: Fence
) -> None:
    run, _ = await _until_verify_fails(store, fence)

    retry = await record(
        store, fence, run, "undeploy", failure(), role=TaskRole.COMPENSATION, backoff=AN_HOUR
    )

    assert retry.create_jobs == () and retry.wake_in is not None
    assert AN_HOUR.first_delay_seconds - 60 < retry.wake_in <= AN_HOUR.first_delay_seconds
    assert await _compensators(store, run.id) == {
        "unprovision": CompensationState.PENDING,
        "undeploy": CompensationState.PENDING,
        "unverify": CompensationState.SKIPPED,
    }
    early = await settle_run(store, fence=fence, run_id=run.id)
    assert early.create_jobs == () and early.wake_in is not None
    assert AN_HOUR.first_delay_seconds - 60 < early.wake_in <= retry.wake_in

    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_task SET not_before = now() - interval '1 second' "
            "WHERE run_id = %s AND task_key = 'undeploy'",
            (run.id,),
        )
    woken = await settle_run(store, fence=fence, run_id=run.id)
    assert [(d.task_key, d.attempt) for d in woken.create_jobs] == [("undeploy", 2)]


async def test_a_compensator_that_fails_for_good_halts_the_rollback(
    store: Pool, fence: Fence
) -> None:
    run, _ = await _until_verify_fails(store, fence)
    await record(store, fence, run, "undeploy", failure(), role=TaskRole.COMPENSATION)

    halted = await record(
        store, fence, run, "undeploy", failure("exit code 1"), attempt=2, role=TaskRole.COMPENSATION
    )

    assert halted.phase is RunPhase.FAILED and halted.create_jobs == ()
    assert [n.reason for n in halted.notices] == ["CompensationFailed", "RunFailed"]
    assert halted.notices[0].message.endswith("; not run: unprovision")
    assert await _compensators(store, run.id) == {
        "unprovision": CompensationState.SKIPPED,
        "undeploy": CompensationState.FAILED,
        "unverify": CompensationState.SKIPPED,
    }
    history = await kinds(store, run.id)
    assert history[-3:] == [
        EventKind.COMPENSATION_FAILED,
        EventKind.COMPENSATION_SKIPPED,
        EventKind.RUN_FAILED,
    ]
    assert (await get_run(store, run.id)).compensating is False


async def test_a_run_that_succeeds_is_never_compensated(store: Pool, fence: Fence) -> None:
    run = (await start_run(store, fence, CHAIN)).run
    await finish(store, fence, run, "provision")
    await record(store, fence, run, "deploy")
    last = await record(store, fence, run, "verify")

    assert last.phase is RunPhase.SUCCEEDED and last.create_jobs == ()
    assert set((await _compensators(store, run.id)).values()) == {CompensationState.NOT_TRIGGERED}
    assert await rollback_steps(store, run.id) == []
    assert await rollback_started_at(store, run.id) is None


async def test_a_failure_with_nothing_succeeded_finishes_failed_without_a_rollback(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, CHAIN)).run

    failed = await finish(store, fence, run, "provision", failure())

    assert failed.phase is RunPhase.FAILED and failed.create_jobs == ()
    assert EventKind.RUN_COMPENSATING not in await kinds(store, run.id)


async def test_a_cancelled_run_rolls_back_what_succeeded_then_finishes_cancelled(
    store: Pool, fence: Fence
) -> None:
    run = (await start_run(store, fence, CHAIN)).run
    await finish(store, fence, run, "provision")

    cancelled = await cancel_run(store, fence=fence, run_id=run.id, reason="test")

    assert [(j.task_key, j.attempt) for j in cancelled.stop_jobs] == [("deploy", 1)]
    ran = await roll_back(store, fence, run, cancelled)
    assert ran == ["unprovision"]
    assert (await get_run(store, run.id)).phase is RunPhase.CANCELLED


async def test_a_cancel_during_a_rollback_lets_it_finish_and_the_run_ends_cancelled(
    store: Pool, fence: Fence
) -> None:
    """The rollback is not interrupted (only a deleted object skips it); the cancel request
    wins the final phase, as ``projection.settled_phase`` rules."""
    run, failed = await _until_verify_fails(store, fence)

    cancelled = await cancel_run(store, fence=fence, run_id=run.id, reason="test")

    assert cancelled.stop_jobs == () and cancelled.create_jobs == ()
    assert (await states(store, run.id))["undeploy"] == CompensationState.RUNNING
    assert await roll_back(store, fence, run, failed) == ["undeploy", "unprovision"]
    assert (await get_run(store, run.id)).phase is RunPhase.CANCELLED
