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
) -> Pool:
    """Open a pool and wait for its first connection; refuse an unknown schema version.

    ``prepare_threshold=None`` keeps the pool usable behind PgBouncer in transaction mode.
    """
    pool: Pool = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        open=False,
        name=name,
        kwargs={"prepare_threshold": None, "application_name": name},
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
