"""Opening the store's connection pool (explicitly, never on import)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg_pool import AsyncConnectionPool

from flowforge.store.connection import Connection, Pool
from flowforge.store.migrate import check_schema
from flowforge.store.session import SessionLimits

# after the deadline's cancel, how long psycopg may try to cancel the query in the server
# before a second cancel makes it close the connection instead
CANCEL_GRACE_SECONDS = 1.0


class BoundedPool(AsyncConnectionPool[Connection]):
    """A pool whose every use (the wait for a connection and the work on it) ends within
    ``operation_seconds`` (plus ``CANCEL_GRACE_SECONDS``): a paused server enforces no
    statement timeout of its own.

    On the deadline the task is cancelled inside psycopg, which asks the server to cancel the
    query. A server that answers that neither would hold the task another 10 s (psycopg waits
    5 s for the cancel, then 5 s for the query), so a second cancel after the grace makes
    psycopg close the connection, and the pool discards it. The caller sees ``TimeoutError``.
    """

    operation_seconds: float | None = None

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[Connection]:
        if self.operation_seconds is None:
            async with super().connection(timeout) as connection:
                yield connection
            return
        task = asyncio.current_task()
        assert task is not None
        fired = False

        def cancel_again() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        async with asyncio.timeout(self.operation_seconds):
            again = asyncio.get_running_loop().call_later(
                self.operation_seconds + CANCEL_GRACE_SECONDS, cancel_again
            )
            try:
                async with super().connection(timeout) as connection:
                    yield connection
            finally:
                again.cancel()
                if fired:
                    task.uncancel()  # ours: the timeout turns its own into TimeoutError


async def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    verify_schema: bool = True,
    name: str = "flowforge-store",
    prepare: bool = True,
    limits: SessionLimits | None = None,
    wait_seconds: float = 30.0,
) -> Pool:
    """Open a pool and wait for its first connection; refuse an unknown schema version.

    Statements run often are prepared server-side (psycopg's default threshold); pass
    ``prepare=False`` behind PgBouncer in transaction mode, where prepared statements break.
    Connections are in autocommit mode: reads hold no transaction open, ``in_transaction``
    opens one explicitly, and a single-statement decision is its own transaction (one
    round trip, which is what makes the outcome hot path fast).

    With ``limits`` every connection carries connect and keepalive settings and the server
    timeouts (``store/session.py``), and every use of the pool is bounded client-side too.
    A caller waits at most ``wait_seconds`` for a free connection (``PoolTimeout``).
    """
    kwargs: dict[str, object] = {
        "prepare_threshold": 5 if prepare else None,
        "application_name": name,
        "autocommit": True,
    }
    if limits is not None:
        kwargs.update(limits.connection_kwargs())
    pool = BoundedPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        timeout=wait_seconds,
        kwargs=kwargs,
    )
    pool.operation_seconds = None if limits is None else limits.client_seconds + wait_seconds
    await pool.open(wait=True, timeout=30)
    if verify_schema:
        try:
            async with pool.connection() as connection:
                await check_schema(connection)
        except BaseException:
            await pool.close()
            raise
    return pool


def pool_size_for(event_workers: int) -> int:
    """Connections the operator's handlers need: one per kopf event worker, one for the
    reconciler and one for the status writer. Handlers of several kinds share them: beyond
    this a handler waits for a connection, at most the pool's ``wait_seconds``."""
    return event_workers + 2
