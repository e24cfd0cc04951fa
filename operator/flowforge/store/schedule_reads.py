"""Reads of WorkflowSchedules for the read API, on a ``browse.scoped_reader`` connection
(row-level security shows a ``flowforge_server`` login the schedules and fires of the
namespaces it was scoped to, as for runs; migration 12).

The store holds what the operator decided (``store/schedules.py``): per schedule the object's
uid, the times waiting and missed, and one row per fired nominal time with the run it made.
It holds nothing of the object's spec (workflow, expression, zone, suspend) nor the next
times its status shows. A schedule's rows carry no namespace uid (migration 15 predates
them): they are read here only for the uids of objects the caller has just read from the
apiserver, which belong to the namespace as it is now, and only the fires of that object
(``schedule_uid``). A fire's run is the one it created (name and uid), shown only while the
reader shows that run (``browse.current_row``).

Active runs are the schedule's unsettled fires whose run is not final, or not stored yet
and fired less than ``PENDING_GRACE`` ago: what ``schedules._active_runs`` counts, without
marking anything (the transaction only reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from psycopg.rows import dict_row

from flowforge.domain.states import TERMINAL_RUN_PHASES, sql_list
from flowforge.store.browse import RUN_COLUMNS, RunRow, current_row
from flowforge.store.connection import Connection
from flowforge.store.schedules import PENDING_GRACE, LastFire

# a fire's run: the object it created, while the reader shows it
_FIRE_RUN = (
    "r.namespace = f.namespace AND r.name = f.run_name AND r.uid = f.run_uid AND "
    + current_row("r")
)

SCHEDULES_QUERY = f"""
SELECT s.name, s.uid, s.missed, s.queued_time, last.nominal_time, last.run_name, last.phase,
       coalesce(active.names, '{{}}')
FROM flowforge_schedule AS s
LEFT JOIN LATERAL (
    SELECT f.nominal_time, f.run_name, r.phase FROM flowforge_schedule_fire AS f
    LEFT JOIN flowforge_run AS r ON {_FIRE_RUN}
    WHERE f.namespace = s.namespace AND f.schedule_name = s.name AND f.schedule_uid = s.uid
    ORDER BY f.fired_at DESC, f.nominal_time DESC LIMIT 1) AS last ON true
LEFT JOIN LATERAL (
    SELECT array_agg(f.run_name ORDER BY f.nominal_time) AS names
    FROM flowforge_schedule_fire AS f LEFT JOIN flowforge_run AS r ON {_FIRE_RUN}
    WHERE f.namespace = s.namespace AND f.schedule_name = s.name AND f.schedule_uid = s.uid
      AND NOT f.settled
      AND (r.phase NOT IN {sql_list(TERMINAL_RUN_PHASES)}
           OR (r.phase IS NULL AND now() - f.fired_at <= %(grace)s))) AS active ON true
WHERE s.namespace = %(namespace)s AND s.uid = ANY(%(uids)s)
ORDER BY s.name
"""

FIRES_QUERY = f"""
SELECT f.id AS fire_id, f.nominal_time AS fire_nominal_time, f.run_name AS fire_run_name,
       f.backfill_id AS fire_backfill_id, f.manual AS fire_manual, f.fired_at AS fire_fired_at,
       made.*
FROM flowforge_schedule_fire AS f
LEFT JOIN LATERAL (
    SELECT {RUN_COLUMNS}
    WHERE run.namespace = f.namespace AND run.name = f.run_name AND run.uid = f.run_uid
      AND {current_row("run")}) AS made ON true
WHERE f.namespace = %(namespace)s AND f.schedule_name = %(name)s AND f.schedule_uid = %(uid)s
  AND (%(before)s::bigint IS NULL OR f.id < %(before)s)
ORDER BY f.id DESC LIMIT %(limit)s
"""


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """What the store holds of one schedule object (by its uid)."""

    name: str
    uid: str
    missed: Mapping[str, int]
    queued: datetime | None
    last: LastFire | None
    active: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FireRow:
    """A fired nominal time and the run it made (None: not in the store, or not shown)."""

    id: int
    nominal_time: datetime
    run_name: str
    backfill: str | None
    manual: bool
    fired_at: datetime
    run: RunRow | None


async def schedule_rows(
    connection: Connection, *, namespace: str, uids: Sequence[str]
) -> dict[str, ScheduleRow]:
    """The store's record of the schedule objects with ``uids`` in ``namespace``, by uid."""
    cursor = await connection.execute(
        SCHEDULES_QUERY, {"namespace": namespace, "uids": list(uids), "grace": PENDING_GRACE}
    )
    rows: dict[str, ScheduleRow] = {}
    for name, uid, missed, queued, nominal, run_name, phase, active in await cursor.fetchall():
        rows[str(uid)] = ScheduleRow(
            name=str(name),
            uid=str(uid),
            missed={str(reason): int(count) for reason, count in dict(missed or {}).items()},
            queued=queued,
            last=None if nominal is None else LastFire(nominal, str(run_name), phase),
            active=tuple(str(run) for run in active),
        )
    return rows


async def schedule_fires(
    connection: Connection,
    *,
    namespace: str,
    name: str,
    uid: str,
    before: int | None = None,
    limit: int = 50,
) -> list[FireRow]:
    """The fires of the schedule object ``uid``, newest first; ``before``: the id of the
    last fire seen."""
    cursor = connection.cursor(row_factory=dict_row)
    await cursor.execute(
        FIRES_QUERY,
        {"namespace": namespace, "name": name, "uid": uid, "before": before, "limit": limit},
    )
    fires = []
    for row in await cursor.fetchall():
        fires.append(
            FireRow(
                id=int(row["fire_id"]),
                nominal_time=row["fire_nominal_time"],
                run_name=str(row["fire_run_name"]),
                backfill=row["fire_backfill_id"],
                manual=bool(row["fire_manual"]),
                fired_at=row["fire_fired_at"],
                run=None if row["id"] is None else RunRow.from_row(row),
            )
        )
    return fires
