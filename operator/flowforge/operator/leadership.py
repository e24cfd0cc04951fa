"""The lease loop: only the holder acts; a standby waits and takes over on expiry.

The lease lives in PostgreSQL (``flowforge.store.lease``). Its epoch is the fencing token
every store write of the engine carries, so a deposed operator's late writes are refused by
the store itself, whatever this loop believes. When renewal finds that another operator took
the lease, this operator stops acting at once (``on_lost``). A renewal that merely fails (the
database is unreachable) keeps trying: expiry alone does not fence, so an operator whose
lease expired while PostgreSQL was down keeps it unless a standby took it meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from flowforge.operator import metrics
from flowforge.store.connection import Pool
from flowforge.store.errors import LeaseNotHeldError
from flowforge.store.lease import (
    DEFAULT_LEASE,
    Fence,
    Lease,
    acquire_lease,
    release_lease,
    renew_lease,
)

logger = logging.getLogger(__name__)


class Leadership:
    def __init__(
        self,
        pool: Pool,
        *,
        identity: str,
        ttl: timedelta,
        renew_every: float,
        name: str = DEFAULT_LEASE,
    ) -> None:
        self._pool = pool
        self._identity = identity
        self._ttl = ttl
        self._renew_every = renew_every
        self._name = name
        self._lease: Lease | None = None
        self._gained = asyncio.Event()
        self._standing_by = False
        self.on_gained: Callable[[Fence], Awaitable[None]] | None = None
        self.on_lost: Callable[[], Awaitable[None]] | None = None

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def fence(self) -> Fence | None:
        return None if self._lease is None else self._lease.fence

    @property
    def is_leader(self) -> bool:
        return self._lease is not None

    async def wait_until_leader(self) -> Fence:
        while True:
            await self._gained.wait()
            fence = self.fence
            if fence is not None:
                return fence

    async def run(self) -> None:
        """Acquire, then renew, forever (until cancelled)."""
        while True:
            try:
                if self._lease is None:
                    await self._try_acquire()
                else:
                    await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the database may be down: keep trying
                logger.warning("lease %s: %s", "renewal" if self._lease else "acquisition", error)
            await asyncio.sleep(self._renew_every)

    async def _try_acquire(self) -> None:
        lease = await acquire_lease(
            self._pool, holder=self._identity, ttl=self._ttl, name=self._name
        )
        if lease is None:
            if not self._standing_by:
                self._standing_by = True
                logger.info("standing by: another operator holds lease %s", self._name)
            return
        self._standing_by = False
        self._lease = lease
        metrics.LEADER.set(1)
        logger.info("lease %s acquired by %s at epoch %d", lease.name, lease.holder, lease.epoch)
        self._gained.set()
        if self.on_gained is not None:
            await self.on_gained(lease.fence)

    async def _renew(self) -> None:
        assert self._lease is not None
        try:
            self._lease = await renew_lease(self._pool, self._lease, ttl=self._ttl)
        except LeaseNotHeldError:
            logger.error("lease %s lost: another operator took over; no longer acting", self._name)
            await self.lose()

    async def release(self) -> None:
        """On a clean shutdown: let the lease expire now so a standby need not wait."""
        lease, self._lease = self._lease, None
        self._gained.clear()
        metrics.LEADER.set(0)
        if lease is not None:
            try:
                await release_lease(self._pool, lease)
            except Exception as error:  # shutting down anyway; expiry frees it later
                logger.warning("lease %s not released: %s", self._name, error)

    async def lose(self) -> None:
        self._lease = None
        self._gained.clear()
        metrics.LEADER.set(0)
        if self.on_lost is not None:
            await self.on_lost()
