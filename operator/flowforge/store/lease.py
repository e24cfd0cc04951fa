"""The operator lease in PostgreSQL, and the fencing check every write makes.

One row per lease name: the holder, a monotonically increasing ``epoch`` and an expiry.
Acquiring a lease that another holder let expire (or released) increments the epoch;
renewing keeps it. Every store write carries a ``Fence`` (lease name and epoch) and, as
the first statement of its transaction, locks the lease row ``FOR KEY SHARE`` and compares
epochs. A takeover changes ``epoch``, a key column (migration 25 puts it in a unique
constraint), so its row lock is ``FOR UPDATE``: it waits for in-flight writes of the old
epoch to commit, and every write of the old epoch that starts after the takeover is
refused: a deposed operator cannot overwrite newer state. A renewal changes ``expires_at``
only, whose lock (``FOR NO KEY UPDATE``) the writes' ``KEY SHARE`` does not block, so a
stream of writes cannot starve the renewal of its leader. Expiry alone does not fence (only
a new holder does), so an operator whose renewal was late but not taken over keeps working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeAlias, TypeVar

from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import LeaseNotHeldError, StaleEpochError
from flowforge.store.single import SingleConnection
from flowforge.store.transaction import in_transaction

DEFAULT_LEASE = "operator"
T = TypeVar("T")
# the operator renews through a connection of its own (``SingleConnection``); tests and
# tools may use a pool. Every lease statement is one statement, its own transaction.
LeaseStore: TypeAlias = Pool | SingleConnection


async def _one_statement(store: LeaseStore, decide: Callable[[Connection], Awaitable[T]]) -> T:
    if isinstance(store, SingleConnection):
        return await store.run(decide)
    return await in_transaction(store, decide)


@dataclasses.dataclass(frozen=True)
class Fence:
    """The fencing token a write carries: the writer's lease and epoch."""

    lease: str
    epoch: int


@dataclasses.dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    epoch: int
    expires_at: datetime

    @property
    def fence(self) -> Fence:
        return Fence(lease=self.name, epoch=self.epoch)


async def acquire_lease(
    pool: LeaseStore, *, holder: str, ttl: timedelta, name: str = DEFAULT_LEASE
) -> Lease | None:
    """Take the lease if it is free, expired or already ours; None while another holds it.

    A different holder (or our own expired lease) gets the next epoch.
    """

    async def decide(connection: Connection) -> Lease | None:
        cursor = await connection.execute(
            """
            INSERT INTO flowforge_lease AS lease (name, holder, epoch, expires_at)
            VALUES (%(name)s, %(holder)s, 1, now() + %(ttl)s)
            ON CONFLICT (name) DO UPDATE SET
                epoch = CASE
                    WHEN lease.holder = EXCLUDED.holder AND lease.expires_at > now()
                    THEN lease.epoch ELSE lease.epoch + 1 END,
                acquired_at = CASE
                    WHEN lease.holder = EXCLUDED.holder AND lease.expires_at > now()
                    THEN lease.acquired_at ELSE now() END,
                holder = EXCLUDED.holder,
                expires_at = EXCLUDED.expires_at
            WHERE lease.holder = EXCLUDED.holder OR lease.expires_at <= now()
            RETURNING name, holder, epoch, expires_at
            """,
            {"name": name, "holder": holder, "ttl": ttl},
        )
        row = await cursor.fetchone()
        return None if row is None else Lease(*row)

    return await _one_statement(pool, decide)


async def renew_lease(pool: LeaseStore, lease: Lease, *, ttl: timedelta) -> Lease:
    """Extend our lease; ``LeaseNotHeldError`` once someone else took it over."""

    async def decide(connection: Connection) -> Lease:
        cursor = await connection.execute(
            "UPDATE flowforge_lease SET expires_at = now() + %s "
            "WHERE name = %s AND holder = %s AND epoch = %s "
            "RETURNING name, holder, epoch, expires_at",
            (ttl, lease.name, lease.holder, lease.epoch),
        )
        row = await cursor.fetchone()
        if row is None:
            raise LeaseNotHeldError(lease=lease.name, holder=lease.holder, epoch=lease.epoch)
        return Lease(*row)

    return await _one_statement(pool, decide)


async def release_lease(pool: LeaseStore, lease: Lease) -> bool:
    """Let the lease expire now so a successor need not wait; False if it was not ours."""

    async def decide(connection: Connection) -> bool:
        cursor = await connection.execute(
            "UPDATE flowforge_lease SET expires_at = now() "
            "WHERE name = %s AND holder = %s AND epoch = %s",
            (lease.name, lease.holder, lease.epoch),
        )
        return cursor.rowcount == 1

    return await _one_statement(pool, decide)


async def current_lease(pool: Pool, name: str = DEFAULT_LEASE) -> Lease | None:
    async with pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT name, holder, epoch, expires_at FROM flowforge_lease WHERE name = %s",
            (name,),
        )
        row = await cursor.fetchone()
    return None if row is None else Lease(*row)


# The fence of a single-statement move, as its first common table expression: the statement
# locks the lease row like ``check_fence`` and writes only ``WHERE (SELECT epoch FROM fence)
# = %(epoch)s``; it returns the epoch it found for ``refuse_stale``. Parameters: ``lease``.
FENCE_CTE = "fence AS (SELECT epoch FROM flowforge_lease WHERE name = %(lease)s FOR KEY SHARE)"


def refuse_stale(fence: Fence, current: object) -> None:
    """Refuse the move when the lease's epoch (as found by the fence) is not the writer's."""
    epoch = None if current is None else int(str(current))
    if epoch != fence.epoch:
        raise StaleEpochError(lease=fence.lease, epoch=fence.epoch, current_epoch=epoch)


async def check_fence(connection: Connection, fence: Fence) -> None:
    """Inside the writer's transaction: refuse the write unless its epoch is current."""
    cursor = await connection.execute(
        "SELECT epoch FROM flowforge_lease WHERE name = %s FOR KEY SHARE", (fence.lease,)
    )
    row = await cursor.fetchone()
    refuse_stale(fence, None if row is None else row[0])
