"""Reads of a run's ``finally`` tasks for the read API, on a ``browse.scoped_reader``
connection (``store/final_tasks.py`` writes them): the outcome they were told (the run's
``final_phase`` and ``rollback_outcome``, set once the outcome is decided and kept after
the run took it), whether they run now (``finalizing``) and their rows in list order.

``browse.run_tasks`` leaves these rows out: they are not tasks of the DAG. They are reached
only through a run the reader shows (its id), by ``flowforge_task_progress_idx`` (the run's
rows of one role).
"""

from __future__ import annotations

import dataclasses

from flowforge.domain.final_tasks import RollbackOutcome
from flowforge.domain.states import RunPhase, TaskRole
from flowforge.store.browse import TaskRow
from flowforge.store.connection import Connection

FINAL_QUERY = f"""
SELECT run.final_phase, run.rollback_outcome, run.finalizing, task.task_key,
       task.compensates_key, task.state, task.attempt, task.max_attempts, task.started_at,
       task.finished_at, task.last_error
FROM flowforge_run AS run
LEFT JOIN flowforge_task AS task ON task.run_id = run.id AND task.role = '{TaskRole.FINALLY}'
WHERE run.id = %s
ORDER BY task.topological_index, task.task_key
"""


@dataclasses.dataclass(frozen=True)
class FinalRows:
    """A run's ``finally`` tasks and the outcome they are (or will be) told."""

    # None until the outcome is decided
    outcome: RunPhase | None
    rollback: RollbackOutcome | None
    # they run now (the run has not taken its phase yet)
    finalizing: bool
    steps: list[TaskRow]


async def final_rows(connection: Connection, run_id: int) -> FinalRows | None:
    """The run's ``finally`` tasks in list order and the outcome decided for them; None
    when it has none (and none was decided: rows pruned after it took its phase still
    leave the outcome)."""
    cursor = await connection.execute(FINAL_QUERY, (run_id,))
    rows = await cursor.fetchall()
    if not rows:
        return None
    phase, rollback, finalizing = rows[0][:3]
    steps = [TaskRow(*row[3:]) for row in rows if row[3] is not None]
    if phase is None and not steps:
        return None
    return FinalRows(
        outcome=None if phase is None else RunPhase(phase),
        rollback=None if rollback is None else RollbackOutcome(rollback),
        finalizing=bool(finalizing),
        steps=steps,
    )
