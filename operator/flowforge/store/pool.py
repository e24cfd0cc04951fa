"""Opening the store's connection pool (explicitly, never on import)."""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from flowforge.store.connection import Pool
from flowforge.store.migrate import check_schema


async def open_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    verify_schema: bool = True,
    name: str = "flowforge-store",
    prepare: bool = True,
) -> Pool:
    """Open a pool and wait for its first connection; refuse an unknown schema version.

    Statements run often are prepared server-side (psycopg's default threshold); pass
    ``prepare=False`` behind PgBouncer in transaction mode, where prepared statements break.
    Connections are in autocommit mode: reads hold no transaction open, ``in_transaction``
    opens one explicitly, and a single-statement decision is its own transaction (one
    round trip, which is what makes the outcome hot path fast).
    """
    pool: Pool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        kwargs={
            "prepare_threshold": 5 if prepare else None,
            "application_name": name,
            "autocommit": True,
        },
    )
    await pool.open(wait=True, timeout=30)
    if verify_schema:
        try:
            async with pool.connection() as connection:
                await check_schema(connection)
        except BaseException:
            await pool.close()
            raise
    return pool
