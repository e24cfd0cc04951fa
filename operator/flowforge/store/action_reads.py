"""Reads of a run's WorkflowRunActions for the read API, on a ``browse.scoped_reader``
connection: the actions the operator processed, as the run's history recorded them
(``store/actions.py`` appends one ``action.accepted`` or ``action.refused`` event per action
object, once), and whether the run is paused now (``store/pausing.py``).

The events are reached only through a run the reader shows (its id); they are found by
``flowforge_event_run_idx`` (the run's events, filtered by kind), as ``browse.first_event``
finds its kinds. An action not processed yet is in the apiserver only, not here.
"""

from __future__ import annotations

from flowforge.domain.history import EventKind
from flowforge.domain.states import sql_list
from flowforge.store.connection import Connection
from flowforge.store.events import Event

ACTION_KINDS = (EventKind.ACTION_ACCEPTED, EventKind.ACTION_REFUSED)
MAX_ACTIONS = 500

ACTIONS_QUERY = f"""
SELECT id, run_id, kind, task_key, attempt, epoch, detail, recorded_at FROM (
    SELECT id, run_id, kind, task_key, attempt, epoch, detail, recorded_at
    FROM flowforge_event WHERE run_id = %s AND kind IN {sql_list(ACTION_KINDS)}
    ORDER BY id DESC LIMIT %s) AS newest
ORDER BY id
"""


async def action_events(
    connection: Connection, run_id: int, *, limit: int = MAX_ACTIONS
) -> list[Event]:
    """The run's newest ``limit`` processed actions, oldest first."""
    cursor = await connection.execute(ACTIONS_QUERY, (run_id, limit))
    return [Event(*row) for row in await cursor.fetchall()]


async def run_paused(connection: Connection, run_id: int) -> bool:
    """Whether a person's Pause holds the run now."""
    cursor = await connection.execute("SELECT paused FROM flowforge_run WHERE id = %s", (run_id,))
    row = await cursor.fetchone()
    return bool(row and row[0])
