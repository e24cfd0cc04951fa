"""What a namespace's runs hold in the store, for the policy caps judged at run admission
(``maxQueuedRuns``, ``maxTaskRows``: ``domain/policy.py::holding_violations``).

One read-only statement, an index-only scan of the namespace's unfinished runs (migration
24: each run's ``task_rows`` is written with its graph), however many task rows they hold.
"""

from __future__ import annotations

from flowforge.domain.policy import Holdings
from flowforge.domain.states import RunPhase
from flowforge.store.connection import Pool

HOLDINGS_QUERY = f"""
SELECT count(*) FILTER (WHERE phase = '{RunPhase.QUEUED}'), coalesce(sum(task_rows), 0)
FROM flowforge_run
WHERE namespace = %s AND phase IN ('{RunPhase.PENDING}', '{RunPhase.QUEUED}', '{RunPhase.RUNNING}')
"""


async def namespace_holdings(pool: Pool, namespace: str) -> Holdings:
    """The namespace's queued runs and the task rows of its unfinished runs, now."""
    async with pool.connection() as connection:
        cursor = await connection.execute(HOLDINGS_QUERY, (namespace,))
        row = await cursor.fetchone()
    return (
        Holdings(queued_runs=0, task_rows=0) if row is None else Holdings(int(row[0]), int(row[1]))
    )
