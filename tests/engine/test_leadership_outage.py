"""The lease loop on its own connection, against a real server whose lease row is blocked.

A renewal that cannot finish (here: the lease row locked by another session, so every
renewal ends at the lease connection's lock timeout) keeps the leader acting only while its
lease is provably valid; then it stops acting, and resumes at the same epoch, without a new
acquisition, once a renewal goes through and nobody took the lease meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import psycopg
import pytest

from flowforge.operator.leadership import Leadership
from flowforge.store.connection import Pool
from flowforge.store.lease import current_lease
from flowforge.store.session import LEASE_LIMITS
from flowforge.store.single import SingleConnection
from tests.support.waiting import wait_until

TTL = timedelta(seconds=2)


async def test_the_leader_stops_acting_at_expiry_and_resumes_at_the_same_epoch(
    store: Pool, store_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="flowforge.operator.leadership")
    connection = SingleConnection(store_dsn, limits=LEASE_LIMITS, name="test-lease")
    leadership = Leadership(connection, identity="op-a", ttl=TTL, renew_every=0.2)
    events: list[str] = []

    async def gained(_: object) -> None:
        events.append("gained")

    async def lost() -> None:
        events.append("lost")

    leadership.on_gained = gained
    leadership.on_lost = lost
    leading = asyncio.create_task(leadership.run())
    blocker = await psycopg.AsyncConnection.connect(store_dsn)
    try:
        fence = await asyncio.wait_for(leadership.wait_until_leader(), timeout=10)
        async with blocker.transaction():
            await blocker.execute("SELECT * FROM flowforge_lease FOR UPDATE")
            blocked = time.monotonic()
            leading_at = [blocked]  # each moment it was seen acting (taken before the look)

            def stopped() -> bool:
                now = time.monotonic()
                if leadership.is_leader:
                    leading_at.append(now)
                    return False
                return True

            await wait_until(stopped, what="not acting", timeout=5)
            # a slow poll only sees the stop later: the bound is on the last moment it acted
            assert leading_at[-1] - blocked < TTL.total_seconds(), leading_at[-1] - blocked
            assert leadership.fence is None
            await asyncio.sleep(1.0)
            assert not leadership.is_leader
        await wait_until(lambda: leadership.is_leader, what="acting again", timeout=5)
        assert leadership.fence == fence, "resumed at the same epoch"
        lease = await current_lease(store)
        assert lease is not None and (lease.holder, lease.epoch) == ("op-a", fence.epoch)
        assert events == ["gained", "lost", "gained"]
        acquired = [r for r in caplog.records if "acquired by" in r.getMessage()]
        resumed = [r for r in caplog.records if "after expiry: acting again" in r.getMessage()]
        assert (len(acquired), len(resumed)) == (1, 1)
    finally:
        leading.cancel()
        await blocker.close()
        await connection.close()
