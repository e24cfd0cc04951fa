"""The lease loop: only the holder acts; a standby waits and takes over on expiry.

The lease lives in PostgreSQL (``flowforge.store.lease``), renewed through a connection of
its own (``store/single.py``), never the handlers' pool: handlers that exhaust the pool
cannot make the leader miss a renewal. Its epoch is the fencing token every store write of
the engine carries, so a deposed operator's late writes are refused by the store itself,
whatever this loop believes.

This operator acts only while its lease is provably valid: until the moment its last
successful renewal was *sent* plus the TTL (less a margin), measured on the monotonic
clock. A renewal that fails (PostgreSQL stopped or paused) is retried; when none succeeds
before that moment this operator stops acting (``on_lost``) but keeps its lease record and
keeps renewing it. The renewal succeeds when the database is back and nobody took the lease
meanwhile: the same epoch, one "resumed" line, no new acquisition (no flapping). If a standby
took the expired lease first, the renewal is refused and this operator stands by.

The choice for outages longer than the TTL (the default TTL is 10 s, a 30 s outage is
longer): a dead leader must be replaced within the TTL, so the TTL is not stretched to cover
outages. A standby may take the lease once it expired; that is safe because the old leader
stopped acting at expiry and the epoch fence refuses any write it still had in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from flowforge.operator import metrics
from flowforge.operator.failures import NotLeaderError
from flowforge.store.errors import LeaseNotHeldError
from flowforge.store.lease import (
    DEFAULT_LEASE,
    Fence,
    Lease,
    LeaseStore,
    acquire_lease,
    release_lease,
    renew_lease,
)

logger = logging.getLogger(__name__)


class Leadership:
    def __init__(
        self,
        pool: LeaseStore,
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
        self._acting = False
        self._valid_until = 0.0  # monotonic: our lease is provably valid until then
        self._margin = min(1.0, ttl.total_seconds() / 4)
        self._gained = asyncio.Event()
        self._standing_by = False
        self.on_gained: Callable[[Fence], Awaitable[None]] | None = None
        self.on_lost: Callable[[], Awaitable[None]] | None = None

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def fence(self) -> Fence | None:
        return self._lease.fence if self.is_leader and self._lease is not None else None

    def require_fence(self) -> Fence:
        """The fence every write carries; NotLeaderError when this operator may not write."""
        fence = self.fence
        if fence is None:
            raise NotLeaderError("this operator does not hold the lease")
        return fence

    @property
    def is_leader(self) -> bool:
        return self._acting and time.monotonic() < self._valid_until

    async def wait_until_leader(self) -> Fence:
        while True:
            await self._gained.wait()
            fence = self.fence
            if fence is not None:
                return fence
            await asyncio.sleep(0.1)  # expired, not yet noticed by the loop

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
                what = "renewal" if self._lease else "acquisition"
                logger.warning("lease %s: %s", what, repr(error) if not str(error) else error)
            await asyncio.sleep(self._renew_every)

    def _bound(self) -> float:
        """How long one lease statement may take: never past the lease's validity."""
        left = self._valid_until - time.monotonic() if self._acting else self._renew_every
        return max(0.5, min(self._ttl.total_seconds(), left))

    async def _try_acquire(self) -> None:
        sent = time.monotonic()
        async with asyncio.timeout(self._bound()):
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
        logger.info("lease %s acquired by %s at epoch %d", lease.name, lease.holder, lease.epoch)
        await self._act(sent)

    async def _act(self, sent: float) -> None:
        assert self._lease is not None
        self._valid_until = sent + self._ttl.total_seconds() - self._margin
        if self._acting:
            return
        self._acting = True
        metrics.LEADER.set(1)
        self._gained.set()
        if self.on_gained is not None:
            await self.on_gained(self._lease.fence)

    async def _renew(self) -> None:
        assert self._lease is not None
        sent = time.monotonic()
        try:
            async with asyncio.timeout(self._bound()):
                lease = await renew_lease(self._pool, self._lease, ttl=self._ttl)
        except LeaseNotHeldError:
            logger.error("lease %s lost: another operator took over; no longer acting", self._name)
            await self.lose()
            return
        except Exception:
            if self._acting and time.monotonic() >= self._valid_until:
                logger.error(
                    "lease %s not renewed before it expired: not acting until it is", self._name
                )
                await self._stop_acting()
            raise
        resumed = not self._acting
        self._lease = lease
        if resumed:
            logger.info(
                "lease %s renewed at epoch %d after expiry: acting again", lease.name, lease.epoch
            )
        await self._act(sent)

    async def release(self) -> None:
        """On a clean shutdown: let the lease expire now so a standby need not wait."""
        lease, self._lease = self._lease, None
        self._acting = False
        self._gained.clear()
        metrics.LEADER.set(0)
        if lease is not None:
            try:
                await release_lease(self._pool, lease)
            except Exception as error:  # shutting down anyway; expiry frees it later
                logger.warning("lease %s not released: %s", self._name, error)

    async def lose(self) -> None:
        """Deposed: forget the lease, and acquire anew (a new epoch) if it comes free."""
        self._lease = None
        await self._stop_acting()

    async def _stop_acting(self) -> None:
        self._acting = False
        self._gained.clear()
        metrics.LEADER.set(0)
        if self.on_lost is not None:
            await self.on_lost()
