"""spec.idempotencyKey: a run whose key matches an earlier run of its namespace never
executes; it shows that run's result, or waits in the queue for it."""

from __future__ import annotations

import uuid

import pytest

from flowforge.domain.queue import QueueReason
from flowforge.domain.states import RunPhase
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.runs import CreatedRun, create_run, get_run
from tests.store.conftest import NAMESPACE, failure, finish, kinds, start_run

pytestmark = pytest.mark.store

KEY = "release-2026.12.02"


async def _create(
    store: Pool,
    fence: Fence,
    name: str,
    *,
    key: str | None = KEY,
    namespace: str = NAMESPACE,
    retry_of: str | None = None,
) -> CreatedRun:
    stored = await load_definition(store, namespace=namespace, workflow="etl", version=1)
    return await create_run(
        store,
        fence=fence,
        namespace=namespace,
        name=name,
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters={"date": "2026-11-30"},
        idempotency_key=key,
        retry_of=retry_of,
    )


async def _original(store: Pool, fence: Fence) -> CreatedRun:
    """A one-task run with the key, which executes (nothing came before it)."""
    await start_run(store, fence, [{"key": "only"}])  # publishes etl v1 (its run has no key)
    first = await _create(store, fence, "deploy-1")
    assert first.run.duplicate_of is None
    assert [task.task_key for task in await list_tasks(store, first.run.id)] == ["only"]
    return first


async def test_a_run_with_the_key_of_a_finished_run_takes_its_phase_without_tasks(
    store: Pool, fence: Fence
) -> None:
    first = await _original(store, fence)
    await finish(store, fence, first.run, "only")

    again = await _create(store, fence, "deploy-1-recreated")

    assert again.created
    assert again.run.phase is RunPhase.SUCCEEDED
    assert again.run.finished_at is not None
    assert again.run.duplicate_of == first.run.id
    assert await list_tasks(store, again.run.id) == []
    assert await kinds(store, again.run.id) == ["run.succeeded"]


async def test_a_failed_original_is_not_executed_again_either(store: Pool, fence: Fence) -> None:
    first = await _original(store, fence)
    await finish(store, fence, first.run, "only", failure())
    assert (await get_run(store, first.run.id)).phase is RunPhase.FAILED

    again = await _create(store, fence, "deploy-1-recreated")

    assert again.run.phase is RunPhase.FAILED
    assert await list_tasks(store, again.run.id) == []


async def test_a_duplicate_of_a_running_run_waits_in_the_queue_for_its_result(
    store: Pool, fence: Fence
) -> None:
    first = await _original(store, fence)

    waiting = await _create(store, fence, "deploy-1-recreated")

    assert waiting.run.phase is RunPhase.QUEUED
    assert waiting.run.duplicate_of == first.run.id
    # looked at for admission (the operator does on first sight): it never leaves by a slot
    assert (await dispatch_due(store, fence=fence, run_id=waiting.run.id)).phase is None
    stored = await get_run(store, waiting.run.id)
    assert stored.phase is RunPhase.QUEUED
    async with store.connection() as connection:
        cursor = await connection.execute(
            "SELECT queue_reason FROM flowforge_run WHERE id = %s", (waiting.run.id,)
        )
        assert await cursor.fetchone() == (QueueReason.IDEMPOTENCY_KEY.value,)

    decision = await finish(store, fence, first.run, "only", failure())

    assert decision.phase is RunPhase.FAILED
    # the original's finish decides the duplicate's too (the operator re-projects it)
    others = {other.run_id: other.decision for other in decision.elsewhere}
    assert others[waiting.run.id].phase is RunPhase.FAILED
    assert (await get_run(store, waiting.run.id)).phase is RunPhase.FAILED
    assert await list_tasks(store, waiting.run.id) == []
    assert await kinds(store, waiting.run.id) == ["run.queued", "run.failed"]


async def test_a_retry_executes_and_becomes_the_original_of_later_runs(
    store: Pool, fence: Fence
) -> None:
    first = await _original(store, fence)
    await finish(store, fence, first.run, "only", failure())

    retry = await _create(store, fence, "deploy-1-retry", retry_of="deploy-1")
    assert retry.run.duplicate_of is None
    await finish(store, fence, retry.run, "only")

    again = await _create(store, fence, "deploy-1-recreated")
    assert again.run.duplicate_of == retry.run.id
    assert again.run.phase is RunPhase.SUCCEEDED


async def test_the_key_is_per_namespace_and_runs_without_one_are_never_duplicates(
    store: Pool, fence: Fence
) -> None:
    first = await _original(store, fence)
    await finish(store, fence, first.run, "only")
    await start_run(store, fence, [{"key": "only"}], namespace="team-b")

    elsewhere = await _create(store, fence, "deploy-1", namespace="team-b")
    keyless = await _create(store, fence, "deploy-2", key=None)

    assert elsewhere.run.duplicate_of is None
    assert elsewhere.run.phase is RunPhase.RUNNING
    assert keyless.run.duplicate_of is None
    assert keyless.run.phase is RunPhase.RUNNING
