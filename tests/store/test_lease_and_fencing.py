"""The operator lease and the fencing epoch every write carries."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from flowforge.store.connection import Pool
from flowforge.store.errors import LeaseNotHeldError, StaleEpochError
from flowforge.store.events import run_history
from flowforge.store.lease import (
    acquire_lease,
    current_lease,
    release_lease,
    renew_lease,
)
from flowforge.store.queries import list_tasks
from flowforge.store.transitions import cancel_run, mark_running, record_outcome
from tests.store.conftest import start_run

pytestmark = pytest.mark.store

TTL = timedelta(seconds=30)


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


async def test_a_write_with_a_stale_epoch_changes_nothing(store: Pool) -> None:
    deposed = await acquire_lease(store, holder="operator-a", ttl=TTL)
    assert deposed is not None
    tasks: list[dict[str, Any]] = [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}]
    run_id = (await start_run(store, deposed.fence, tasks)).run.id
    await mark_running(store, fence=deposed.fence, run_id=run_id, task_key="a", attempt=1)
    await release_lease(store, deposed)
    successor = await acquire_lease(store, holder="operator-b", ttl=TTL)
    assert successor is not None
    before_tasks = await list_tasks(store, run_id)
    before_events = await run_history(store, run_id)

    with pytest.raises(StaleEpochError, match=r"epoch 1 .* stale .*current epoch: 2"):
        await record_outcome(
            store, fence=deposed.fence, run_id=run_id, task_key="a", attempt=1, succeeded=True
        )
    with pytest.raises(StaleEpochError):
        await cancel_run(store, fence=deposed.fence, run_id=run_id)

    assert await list_tasks(store, run_id) == before_tasks
    assert await run_history(store, run_id) == before_events
    result = await record_outcome(
        store, fence=successor.fence, run_id=run_id, task_key="a", attempt=1, succeeded=True
    )
    assert result.released == ("b",)
