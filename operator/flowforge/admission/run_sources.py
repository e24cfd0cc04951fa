"""What run admission reads about runs: the store's runs by name, read-only (SELECT)."""

from __future__ import annotations

from flowforge.admission.review import RetrySource
from flowforge.store.connection import Pool
from flowforge.store.queue import running_count
from flowforge.store.reuse import find_run_by_name


class StoreRetrySources:
    """Implements `flowforge.admission.review.RetrySources` on a store pool."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def run_named(self, *, namespace: str, name: str) -> RetrySource | None:
        run = await find_run_by_name(self._pool, namespace=namespace, name=name)
        if run is None:
            return None
        return RetrySource(
            phase=str(run.phase), workflow=run.workflow, parameters=dict(run.parameters)
        )

    async def running_runs(self, *, namespace: str, key: str) -> int:
        async with self._pool.connection() as connection:
            return await running_count(connection, namespace=namespace, key=key)
