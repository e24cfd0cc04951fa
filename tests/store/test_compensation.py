"""The rollback: compensators of succeeded tasks, one at a time, in reverse order."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.states import CompensationState, RunPhase
from flowforge.store.compensation import (
    finish_compensation,
    next_compensation,
    start_compensation,
)
from flowforge.store.connection import Pool
from flowforge.store.errors import TransitionConflictError
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.runs import get_run
from flowforge.store.transitions import cancel_run, mark_running, record_outcome
from tests.store.conftest import start_run

pytestmark = pytest.mark.store

CHAIN: list[dict[str, Any]] = [
    {"key": "provision"},
    {"key": "deploy", "dependsOn": ["provision"]},
    {"key": "verify", "dependsOn": ["deploy"]},
    {"key": "unprovision", "compensateFor": "provision"},
    {"key": "undeploy", "compensateFor": "deploy"},
    {"key": "unverify", "compensateFor": "verify"},
]


async def _run_until_verify_fails(store: Pool, fence: Fence) -> int:
    run_id = (await start_run(store, fence, CHAIN)).run.id
    for key in ("provision", "deploy"):
        await mark_running(store, fence=fence, run_id=run_id, task_key=key, attempt=1)
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key=key, attempt=1, succeeded=True
        )
    await mark_running(store, fence=fence, run_id=run_id, task_key="verify", attempt=1)
    failed = await record_outcome(
        store, fence=fence, run_id=run_id, task_key="verify", attempt=1, succeeded=False
    )
    assert failed.settled is not None
    assert failed.settled.compensators_triggered == ("undeploy", "unprovision")
    return run_id


async def _compensator_states(store: Pool, run_id: int) -> dict[str, str]:
    return {
        task.task_key: task.state
        for task in await list_tasks(store, run_id)
        if task.compensates_key is not None
    }


async def test_a_failed_run_rolls_back_in_reverse_order_then_finishes_failed(
    store: Pool, fence: Fence
) -> None:
    run_id = await _run_until_verify_fails(store, fence)
    run = await get_run(store, run_id)
    assert (run.phase, run.compensating) == (RunPhase.RUNNING, True)
    assert await _compensator_states(store, run_id) == {
        "unprovision": "pending",
        "undeploy": "pending",
        "unverify": "skipped",
    }

    with pytest.raises(TransitionConflictError, match="next in the rollback"):
        await start_compensation(
            store, fence=fence, run_id=run_id, task_key="unprovision", attempt=1
        )
    order = []
    while (step := await next_compensation(store, run_id)) is not None:
        order.append(step.task_key)
        await start_compensation(
            store, fence=fence, run_id=run_id, task_key=step.task_key, attempt=step.attempt
        )
        assert await next_compensation(store, run_id) is None  # one at a time
        result = await finish_compensation(
            store,
            fence=fence,
            run_id=run_id,
            task_key=step.task_key,
            attempt=step.attempt,
            succeeded=True,
        )

    assert order == ["undeploy", "unprovision"]
    assert result.settled is not None and result.settled.phase is RunPhase.FAILED
    run = await get_run(store, run_id)
    assert (run.phase, run.compensating) == (RunPhase.FAILED, False)


async def test_a_compensator_that_fails_for_good_halts_the_rollback(
    store: Pool, fence: Fence
) -> None:
    run_id = await _run_until_verify_fails(store, fence)
    await start_compensation(store, fence=fence, run_id=run_id, task_key="undeploy", attempt=1)

    result = await finish_compensation(
        store,
        fence=fence,
        run_id=run_id,
        task_key="undeploy",
        attempt=1,
        succeeded=False,
        error="exit code 1",
    )

    assert result.state is CompensationState.FAILED
    assert result.halted == ("unprovision",)
    assert result.settled is not None and result.settled.phase is RunPhase.FAILED
    assert (await _compensator_states(store, run_id))["unprovision"] == "skipped"


async def test_a_run_that_succeeds_is_never_compensated(store: Pool, fence: Fence) -> None:
    run_id = (await start_run(store, fence, CHAIN)).run.id
    for key in ("provision", "deploy", "verify"):
        await mark_running(store, fence=fence, run_id=run_id, task_key=key, attempt=1)
        await record_outcome(
            store, fence=fence, run_id=run_id, task_key=key, attempt=1, succeeded=True
        )

    assert (await get_run(store, run_id)).phase is RunPhase.SUCCEEDED
    assert set((await _compensator_states(store, run_id)).values()) == {"not_triggered"}
    assert await next_compensation(store, run_id) is None


async def test_a_cancelled_run_rolls_back_what_succeeded_then_finishes_cancelled(
    store: Pool, fence: Fence
) -> None:
    run_id = (await start_run(store, fence, CHAIN)).run.id
    await mark_running(store, fence=fence, run_id=run_id, task_key="provision", attempt=1)
    await record_outcome(
        store, fence=fence, run_id=run_id, task_key="provision", attempt=1, succeeded=True
    )

    cancelled = await cancel_run(store, fence=fence, run_id=run_id)

    assert cancelled.settled.compensators_triggered == ("unprovision",)
    await start_compensation(store, fence=fence, run_id=run_id, task_key="unprovision", attempt=1)
    done = await finish_compensation(
        store, fence=fence, run_id=run_id, task_key="unprovision", attempt=1, succeeded=True
    )
    assert done.settled is not None and done.settled.phase is RunPhase.CANCELLED
