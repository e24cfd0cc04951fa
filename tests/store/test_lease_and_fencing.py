"""The operator lease, and the fencing epoch every store move carries: after a takeover,
each move of the deposed holder is refused with ``StaleEpochError`` and changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from flowforge.domain.decision import Decision
from flowforge.domain.states import RunPhase, TaskRole
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition
from flowforge.store.dispatch import JobCreated, dispatch_due, record_jobs_created
from flowforge.store.errors import LeaseNotHeldError, StaleEpochError
from flowforge.store.events import run_history
from flowforge.store.lease import (
    Fence,
    acquire_lease,
    check_fence,
    current_lease,
    release_lease,
    renew_lease,
)
from flowforge.store.moves import settle_run
from flowforge.store.queries import list_tasks
from flowforge.store.runs import RunRecord, create_run, get_run
from tests.store.conftest import (
    NAMESPACE,
    failure,
    record,
    start_run,
    succeed_without_settling,
    take_over,
)

pytestmark = pytest.mark.store

TTL = timedelta(seconds=30)
TASKS: list[dict[str, Any]] = [
    {"key": "a", "retries": 1},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "c"},
    {"key": "undo-a", "compensateFor": "a"},
    {"key": "undo-c", "compensateFor": "c"},
]


async def test_a_valid_lease_keeps_other_holders_out(store: Pool) -> None:
    first = await acquire_lease(store, holder="operator-a", ttl=TTL)
    second = await acquire_lease(store, holder="operator-b", ttl=TTL)

    assert first is not None and first.epoch == 1
    assert second is None
    again = await acquire_lease(store, holder="operator-a", ttl=TTL)
    assert again is not None and again.epoch == 1


async def test_a_new_holder_of_an_expired_lease_gets_the_next_epoch(store: Pool) -> None:
    first = await acquire_lease(store, holder="operator-a", ttl=timedelta(milliseconds=10))
    assert first is not None
    await asyncio.sleep(0.05)

    successor = await acquire_lease(store, holder="operator-b", ttl=TTL)

    assert successor is not None and successor.epoch == first.epoch + 1
    with pytest.raises(LeaseNotHeldError):
        await renew_lease(store, first, ttl=TTL)
    renewed = await renew_lease(store, successor, ttl=TTL)
    assert renewed.epoch == successor.epoch and renewed.expires_at >= successor.expires_at


async def test_a_released_lease_is_taken_over_at_once(store: Pool) -> None:
    first = await acquire_lease(store, holder="operator-a", ttl=TTL)
    assert first is not None
    assert await release_lease(store, first)

    successor = await acquire_lease(store, holder="operator-b", ttl=TTL)

    assert successor is not None and successor.epoch == 2
    assert await current_lease(store) == successor


# --- every move refuses a stale epoch ---------------------------------------------------

Move = Callable[[Pool, Fence, RunRecord], Awaitable[Any]]


async def _running(store: Pool, fence: Fence, run: RunRecord) -> None:
    await dispatch_due(store, fence=fence, run_id=run.id)


async def _rolling_back(store: Pool, fence: Fence, run: RunRecord) -> None:
    """c succeeded, a failed for good: undo-c runs."""
    await dispatch_due(store, fence=fence, run_id=run.id)
    await record(store, fence, run, "c")
    await record(store, fence, run, "a", failure())
    await record(store, fence, run, "a", failure(), attempt=2)


async def _settleable(store: Pool, fence: Fence, run: RunRecord) -> None:
    """Every forward task succeeded, and the settle after the last one never ran."""
    await dispatch_due(store, fence=fence, run_id=run.id)
    await record(store, fence, run, "a")
    await record(store, fence, run, "c")
    await succeed_without_settling(store, fence, run, "b")


async def _create_again(store: Pool, fence: Fence, run: RunRecord) -> Any:
    stored = await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)
    return await create_run(
        store,
        fence=fence,
        namespace=NAMESPACE,
        name="another-run",
        uid=str(uuid.uuid4()),
        definition=stored,
        retry_of=run.name,
    )


MOVES: dict[str, tuple[Callable[[Pool, Fence, RunRecord], Awaitable[None]] | None, Move]] = {
    "create_run": (None, _create_again),
    "dispatch_due": (None, lambda s, f, r: dispatch_due(s, fence=f, run_id=r.id)),
    "record_jobs_created": (
        _running,
        lambda s, f, r: record_jobs_created(
            s, fence=f, run_id=r.id, jobs=(JobCreated("a", 1, job="j", uid="u", created=True),)
        ),
    ),
    "record_outcome success": (_running, lambda s, f, r: record(s, f, r, "a")),
    "record_outcome failure with a retry": (
        _running,
        lambda s, f, r: record(s, f, r, "a", failure()),
    ),
    "record_outcome final failure": (_running, lambda s, f, r: record(s, f, r, "c", failure())),
    "record_outcome compensator": (
        _rolling_back,
        lambda s, f, r: record(s, f, r, "undo-c", role=TaskRole.COMPENSATION),
    ),
    "cancel_run": (_running, lambda s, f, r: cancel_run(s, fence=f, run_id=r.id, reason="x")),
    "cancel_run without rollback": (
        _rolling_back,
        lambda s, f, r: cancel_run(s, fence=f, run_id=r.id, reason="x", rollback=False),
    ),
    "settle_run": (_settleable, lambda s, f, r: settle_run(s, fence=f, run_id=r.id)),
}


async def _snapshot(store: Pool, run_id: int) -> tuple[Any, ...]:
    async with store.connection() as connection:
        cursor = await connection.execute("SELECT count(*) FROM flowforge_run")
        runs = await cursor.fetchone()
    return (
        runs,
        await get_run(store, run_id),
        await list_tasks(store, run_id),
        await run_history(store, run_id),
    )


@pytest.mark.parametrize("name", sorted(MOVES))
async def test_a_move_with_a_stale_epoch_is_refused_and_changes_nothing(
    name: str, store: Pool, fence: Fence
) -> None:
    prepare, move = MOVES[name]
    run = (await start_run(store, fence, TASKS)).run
    if prepare is not None:
        await prepare(store, fence, run)
    deposed, successor = await take_over(store)
    before = await _snapshot(store, run.id)

    with pytest.raises(StaleEpochError, match=r"epoch 1 .* stale .*current epoch: 2"):
        await move(store, deposed, run)

    assert await _snapshot(store, run.id) == before
    # the same move with the successor's epoch does change something
    moved = await move(store, successor, run)
    assert not isinstance(moved, Decision) or moved.recorded
    assert await _snapshot(store, run.id) != before


async def test_a_takeover_waits_for_a_move_of_the_old_epoch_in_flight(
    store: Pool, fence: Fence
) -> None:
    """A takeover updates the lease row's epoch, which waits for the old holder's in-flight
    move (it holds the fence's lock on the row); the move after it is refused."""
    run = (await start_run(store, fence, TASKS)).run
    await dispatch_due(store, fence=fence, run_id=run.id)

    async with store.connection() as connection, connection.transaction():
        await check_fence(connection, fence)
        takeover = asyncio.ensure_future(take_over(store))
        await asyncio.sleep(0.2)
        assert not takeover.done()  # waits for the old epoch's transaction
    deposed, _ = await takeover

    with pytest.raises(StaleEpochError):
        await record(store, deposed, run, "a")
    assert (await get_run(store, run.id)).phase is RunPhase.RUNNING


async def test_a_renewal_does_not_wait_for_the_moves_in_flight(store: Pool, fence: Fence) -> None:
    """The fence's lock does not block a renewal (it changes no key column): with the row
    locked FOR SHARE, 50 concurrent moves kept a renewal waiting past its statement timeout
    and the leader stopped acting. The renewal commits while a move holds the fence."""
    lease = await current_lease(store)
    assert lease is not None
    async with store.connection() as connection, connection.transaction():
        await check_fence(connection, fence)
        longer = timedelta(hours=1)
        renewed = await asyncio.wait_for(renew_lease(store, lease, ttl=longer), timeout=10)
        assert renewed.epoch == lease.epoch and renewed.expires_at > lease.expires_at
        await check_fence(connection, fence)  # the move goes on under the same epoch
