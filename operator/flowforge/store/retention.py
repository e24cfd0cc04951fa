"""Retention: delete finished runs' task rows, edges and events older than a cutoff.

Only runs that finished (phase succeeded, failed or cancelled, so ``finished_at`` is set,
a CHECK guarantees it) before the cutoff are considered; a run that is not finished is
never touched. The run row itself stays, stamped ``pruned_at`` and keeping its final task
counts in ``final_counts`` (by role and state, tolerated forEach failures apart from the
failed and condition-false tasks apart from the skipped, as the task rows are counted) so
its progress can still be shown. Runs are pruned in batches, each in its own transaction,
locked with SKIP LOCKED so two pruners do not collide.

Every batch runs as ``flowforge_retention`` (``SET LOCAL ROLE``), the only role that may
delete history (``roles.py``); a login that is not a member is refused before anything is
touched, with the GRANT that would allow it.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from flowforge.store.connection import Connection, Pool
from flowforge.store.errors import StoreError
from flowforge.store.queries import COUNTED_STATE
from flowforge.store.roles import RETENTION, is_member, set_local_role
from flowforge.store.transaction import in_transaction

PRUNABLE_QUERY = (
    "SELECT id FROM flowforge_run WHERE finished_at IS NOT NULL AND pruned_at IS NULL "
    "AND finished_at < now() - %s ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED"
)


@dataclasses.dataclass(frozen=True)
class PruneReport:
    runs: int = 0
    tasks: int = 0
    dependencies: int = 0
    events: int = 0

    def __add__(self, other: PruneReport) -> PruneReport:
        return PruneReport(
            runs=self.runs + other.runs,
            tasks=self.tasks + other.tasks,
            dependencies=self.dependencies + other.dependencies,
            events=self.events + other.events,
        )

    def describe(self) -> str:
        return (
            f"pruned {self.runs} finished runs: removed {self.tasks} task rows, "
            f"{self.dependencies} dependency rows and {self.events} events"
        )


async def _check_retention_role(pool: Pool) -> None:
    async with pool.connection() as connection:
        if await is_member(connection, RETENTION):
            return
        cursor = await connection.execute("SELECT current_user")
        row = await cursor.fetchone()
    login = row[0] if row else "?"
    raise StoreError(
        f"role {login} may not prune: deleting history is for {RETENTION} only; "
        f"an administrator can allow it with: GRANT {RETENTION} TO {login}"
    )


async def prune(pool: Pool, *, older_than: timedelta, batch_size: int = 200) -> PruneReport:
    await _check_retention_role(pool)
    total = PruneReport()
    while True:

        async def prune_batch(connection: Connection) -> PruneReport:
            await set_local_role(connection, RETENTION)
            cursor = await connection.execute(PRUNABLE_QUERY, (older_than, batch_size))
            run_ids = [int(run_id) for (run_id,) in await cursor.fetchall()]
            if not run_ids:
                return PruneReport()
            await connection.execute(
                f"""
                UPDATE flowforge_run AS run SET pruned_at = now(), final_counts = kept.counts
                FROM (
                    SELECT id, coalesce((
                        SELECT jsonb_object_agg(role, states) FROM (
                            SELECT role, jsonb_object_agg(counted, n) AS states FROM (
                                SELECT role, {COUNTED_STATE} AS counted, count(*) AS n
                                FROM flowforge_task WHERE run_id = ids.id GROUP BY role, counted
                            ) AS by_state GROUP BY role
                        ) AS by_role
                    ), '{{}}'::jsonb) AS counts
                    FROM unnest(%s::bigint[]) AS ids(id)
                ) AS kept
                WHERE run.id = kept.id
                """,
                (run_ids,),
            )
            events = await connection.execute(
                "DELETE FROM flowforge_event WHERE run_id = ANY(%s)", (run_ids,)
            )
            edges = await connection.execute(
                "DELETE FROM flowforge_task_dependency WHERE run_id = ANY(%s)", (run_ids,)
            )
            tasks = await connection.execute(
                "DELETE FROM flowforge_task WHERE run_id = ANY(%s)", (run_ids,)
            )
            return PruneReport(
                runs=len(run_ids),
                tasks=tasks.rowcount,
                dependencies=edges.rowcount,
                events=events.rowcount,
            )

        batch = await in_transaction(pool, prune_batch)
        if batch.runs == 0:
            return total
        total += batch
