"""The items of a run's forEach instances (`flowforge.domain.for_each`): as ``create_run``
recorded them (for the Job of one instance, and for the run's ConfigMap), and what an
item's final failure does to its group (``tolerateFailures``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from flowforge.domain.decision import JobRef
from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskState
from flowforge.store.connection import Connection, Pool
from flowforge.store.events import append_task_events
from flowforge.store.lease import Fence
from flowforge.store.stopping import cancel_tasks_locked

TASK_ITEM_QUERY = (
    "SELECT item_group, item_key, item::text FROM flowforge_task "
    "WHERE run_id = %s AND task_key = %s AND item_group IS NOT NULL"
)

RUN_ITEMS_QUERY = (
    "SELECT item_group, item_key, item::text FROM flowforge_task "
    "WHERE run_id = %s AND role = 'forward' AND item_group IS NOT NULL "
    "ORDER BY item_group, topological_index"
)


async def task_item(pool: Pool, *, run_id: int, task_key: str) -> tuple[str, str, str] | None:
    """The forEach task, item key and item (JSON text) of the instance ``task_key`` (forward
    or compensating); None for a task that is no instance."""
    async with pool.connection() as connection:
        cursor = await connection.execute(TASK_ITEM_QUERY, (run_id, task_key))
        row = await cursor.fetchone()
    return None if row is None else (str(row[0]), str(row[1]), str(row[2]))


async def run_items(pool: Pool, run_id: int) -> dict[str, dict[str, Any]]:
    """Each forEach task of the run -> {item key: item}."""
    async with pool.connection() as connection:
        cursor = await connection.execute(RUN_ITEMS_QUERY, (run_id,))
        rows = await cursor.fetchall()
    items: dict[str, dict[str, Any]] = {}
    for group, key, text in rows:
        items.setdefault(str(group), {})[str(key)] = json.loads(text)
    return items


# the group and tolerance of a forward row that just failed for good, and how many of its
# group's items have failed so far (itself included)
GROUP_FAILURES_QUERY = f"""
SELECT task.item_group, task.group_tolerated,
       (SELECT count(*) FROM flowforge_task AS sibling
        WHERE sibling.run_id = task.run_id AND sibling.item_group = task.item_group
          AND sibling.role = 'forward' AND sibling.state = '{TaskState.FAILED}')
FROM flowforge_task AS task
WHERE task.id = %s AND task.role = 'forward' AND task.item_group IS NOT NULL
"""

# a tolerated failure releases the item's dependents as a success does (under id-ordered
# row locks); the locked dispatch that follows in the transaction starts them
RELEASE_TOLERATED_QUERY = f"""
WITH tolerated AS (
    UPDATE flowforge_task SET tolerated = true WHERE id = %(task)s RETURNING id
), dependents AS (
    SELECT task.id FROM flowforge_task AS task
    JOIN flowforge_task_dependency AS edge ON edge.task_id = task.id
    WHERE edge.upstream_id = (SELECT id FROM tolerated)
    ORDER BY task.id
    FOR NO KEY UPDATE OF task
)
UPDATE flowforge_task AS task
SET pending_dependencies = task.pending_dependencies - 1,
    state = CASE WHEN task.pending_dependencies = 1 AND task.state = '{TaskState.WAITING}'
                 THEN CASE WHEN task.approval THEN '{TaskState.AWAITING}'
                           ELSE '{TaskState.READY}' END
                 ELSE task.state END,
    not_before = CASE WHEN task.pending_dependencies = 1 AND task.state = '{TaskState.WAITING}'
                      THEN greatest(task.not_before, now()) ELSE task.not_before END,
    updated_at = now()
FROM dependents
WHERE task.id = dependents.id
RETURNING task.task_key, task.state
"""


@dataclass(frozen=True)
class ItemFailure:
    """What the final failure of a forEach item did to its group."""

    group: str
    failed: int  # the group's failed items, this one included
    tolerance: int
    released: tuple[str, ...] = ()  # dependents it released (within the tolerance)
    stop_jobs: tuple[JobRef, ...] = ()  # running items cancelled (past it)

    @property
    def tolerated(self) -> bool:
        return self.failed <= self.tolerance


async def item_failed_locked(
    connection: Connection, *, fence: Fence, run_id: int, task_id: int
) -> ItemFailure | None:
    """Inside the transaction that failed the forward row ``task_id`` for good (holding the
    run's row lock): None when it is no forEach item. Within its group's
    ``tolerateFailures`` the item is marked tolerated and its dependents are released; past
    it the group's other unresolved items are cancelled (nothing new starts, the running
    ones' Jobs are stopped), and the caller fails what is downstream as for any failure."""
    cursor = await connection.execute(GROUP_FAILURES_QUERY, (task_id,))
    row = await cursor.fetchone()
    if row is None:
        return None
    judged = ItemFailure(group=str(row[0]), failed=int(row[2]), tolerance=int(row[1] or 0))
    if judged.tolerated:
        cursor = await connection.execute(RELEASE_TOLERATED_QUERY, {"task": task_id})
        rows = [(str(key), state) for key, state in await cursor.fetchall()]
        released = tuple(sorted(key for key, state in rows if state == TaskState.READY))
        await append_task_events(
            connection,
            run_id=run_id,
            kind=EventKind.TASK_RELEASED,
            epoch=fence.epoch,
            task_keys=released,
        )
        await append_task_events(  # approval gates (`gates.py`): the dispatch that follows
            connection,  # sets the wake-up at their timeout
            run_id=run_id,
            kind=EventKind.TASK_AWAITING_APPROVAL,
            epoch=fence.epoch,
            task_keys=sorted(key for key, state in rows if state == TaskState.AWAITING),
        )
        return dataclasses.replace(judged, released=released)
    stop = await cancel_tasks_locked(
        connection,
        fence=fence,
        run_id=run_id,
        reason=f"{judged.failed} items of {judged.group} failed, more than its "
        f"tolerateFailures ({judged.tolerance})",
        group=judged.group,
    )
    return dataclasses.replace(judged, stop_jobs=stop)
