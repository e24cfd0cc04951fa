"""Schedules: each nominal time fired exactly once, decided on the database's clock.

``fire_due`` is one transaction per pass over a schedule: it checks the fence, locks the
schedule's row (made on first sight; a new object of the same name starts afresh), reads
``now()``, the schedule's runs that are not final (a fire without a stored run yet counts
for ``PENDING_GRACE``, a rolling-back run until it is final), the fired times inside the
unprocessed backfills, asks the pure ``schedule_decision.decide`` and records its outcome
in the same transaction: a row per fired time (unique per schedule and nominal time, and
per run name, so a racing operator's insert records nothing), the watermark, the waiting
time, the processed backfills and the missed counts. The WorkflowRun objects are created
after the commit, named by the nominal time; a fire whose object is not recorded yet
(``run_uid``) is handed back by every pass until ``mark_created`` records it (a crash
between commit and creation loses nothing, and creating twice is AlreadyExists).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from flowforge.domain.schedule import ScheduleSpec
from flowforge.domain.schedule_decision import (
    FireDecision,
    ScheduleView,
    decide,
)
from flowforge.domain.schedule_times import parse_expression, run_name, zone_named
from flowforge.domain.states import TERMINAL_RUN_PHASES
from flowforge.store.connection import Connection, Pool
from flowforge.store.lease import Fence, check_fence
from flowforge.store.transaction import in_transaction

# a fire whose run the store does not hold yet counts as active this long (its object is
# being created, or the operator has not stored it); after that it is presumed gone
PENDING_GRACE = timedelta(minutes=5)
_TERMINAL = sorted(TERMINAL_RUN_PHASES)


@dataclasses.dataclass(frozen=True)
class ScheduleKey:
    namespace: str
    name: str
    uid: str


@dataclasses.dataclass(frozen=True)
class FiredRun:
    """A fired nominal time and the run it makes."""

    nominal_time: datetime
    run_name: str
    backfill: str | None = None
    manual: bool = False


@dataclasses.dataclass(frozen=True)
class LastFire:
    nominal_time: datetime
    run_name: str
    phase: str | None  # None: the store does not hold the run yet


@dataclasses.dataclass(frozen=True)
class ScheduleFiring:
    """What one pass decided and recorded, and what the status shows."""

    now: datetime
    fired: tuple[FiredRun, ...]  # recorded by this pass
    to_create: tuple[FiredRun, ...]  # fired (now or before) whose object is not recorded
    cancel: tuple[str, ...]  # active runs to cancel (Replace)
    active: tuple[str, ...]  # the schedule's runs not final, after this pass
    missed: Mapping[str, int]  # totals by reason
    newly_missed: Mapping[str, int]
    too_many: int
    queued: datetime | None
    last: LastFire | None


async def fire_due(
    pool: Pool,
    *,
    fence: Fence,
    key: ScheduleKey,
    spec: ScheduleSpec,
    created_at: datetime,
    trigger: bool = False,
) -> ScheduleFiring:
    """One pass over a schedule (see the module's docstring); ``created_at`` is the
    object's creation (no time before it is owed), ``trigger`` a manual fire now."""

    async def decide_and_record(connection: Connection) -> ScheduleFiring:
        await check_fence(connection, fence)
        now, watermark, queued, done, missed = await _lock_schedule(connection, key, created_at)
        active = await _active_runs(connection, key, now)
        fired_times = await _fired_in_backfills(connection, key, spec, done)
        view = ScheduleView(
            now=now,
            since=watermark,
            active=active,
            queued=queued,
            processed_backfills=frozenset(done),
            fired=fired_times,
            trigger=now.replace(microsecond=0) if trigger else None,
        )
        decision = decide(spec, view)
        fired = await _record_fires(connection, key, spec, decision)
        totals = dict(missed)
        for reason, count in decision.missed.items():
            totals[str(reason)] = totals.get(str(reason), 0) + count
        await connection.execute(
            "UPDATE flowforge_schedule SET watermark = %s, queued_time = %s, "
            "backfills_done = backfills_done || %s::text[], missed = %s, updated_at = now() "
            "WHERE namespace = %s AND name = %s",
            (
                decision.watermark or watermark,
                decision.queued,
                list(decision.backfills_done),
                Jsonb(totals),
                key.namespace,
                key.name,
            ),
        )
        return ScheduleFiring(
            now=now,
            fired=fired,
            to_create=await _uncreated(connection, key),
            cancel=decision.cancel,
            active=active + tuple(fire.run_name for fire in fired),
            missed=totals,
            newly_missed={str(reason): count for reason, count in decision.missed.items()},
            too_many=decision.too_many,
            queued=decision.queued,
            last=await _last_fire(connection, key),
        )

    return await in_transaction(pool, decide_and_record)


async def _lock_schedule(
    connection: Connection, key: ScheduleKey, created_at: datetime
) -> tuple[datetime, datetime, datetime | None, list[str], dict[str, int]]:
    await connection.execute(
        "INSERT INTO flowforge_schedule (namespace, name, uid, watermark) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (namespace, name) DO NOTHING",
        (key.namespace, key.name, key.uid, created_at),
    )
    cursor = await connection.execute(
        "SELECT now(), uid, watermark, queued_time, backfills_done, missed "
        "FROM flowforge_schedule WHERE namespace = %s AND name = %s FOR UPDATE",
        (key.namespace, key.name),
    )
    row = await cursor.fetchone()
    assert row is not None
    now, uid, watermark, queued, done, missed = row
    if uid != key.uid:  # a new object of the same name: its own watermark and counts
        await connection.execute(
            "UPDATE flowforge_schedule SET uid = %s, watermark = %s, queued_time = NULL, "
            "backfills_done = '{}', missed = '{}'::jsonb WHERE namespace = %s AND name = %s",
            (key.uid, created_at, key.namespace, key.name),
        )
        return now, created_at, None, [], {}
    return now, watermark, queued, list(done), dict(missed)


async def _active_runs(connection: Connection, key: ScheduleKey, now: datetime) -> tuple[str, ...]:
    """The schedule's runs that are not final; fires found final are marked settled."""
    cursor = await connection.execute(
        "SELECT f.id, f.run_name, f.fired_at, r.phase FROM flowforge_schedule_fire AS f "
        "LEFT JOIN flowforge_run AS r "
        "ON r.namespace = f.namespace AND r.name = f.run_name AND r.uid = f.run_uid "
        "WHERE f.namespace = %s AND f.schedule_name = %s AND NOT f.settled "
        "ORDER BY f.nominal_time",
        (key.namespace, key.name),
    )
    active: list[str] = []
    settled: list[int] = []
    for fire_id, name, fired_at, phase in await cursor.fetchall():
        if phase in _TERMINAL or (phase is None and now - fired_at > PENDING_GRACE):
            settled.append(fire_id)
        else:
            active.append(name)
    if settled:
        await connection.execute(
            "UPDATE flowforge_schedule_fire SET settled = true WHERE id = ANY(%s)", (settled,)
        )
    return tuple(active)


async def _fired_in_backfills(
    connection: Connection, key: ScheduleKey, spec: ScheduleSpec, done: list[str]
) -> frozenset[datetime]:
    pending = [backfill for backfill in spec.backfills if backfill.id not in done]
    if not pending:
        return frozenset()
    cursor = await connection.execute(
        "SELECT nominal_time FROM flowforge_schedule_fire "
        "WHERE namespace = %s AND schedule_name = %s AND nominal_time BETWEEN %s AND %s",
        (
            key.namespace,
            key.name,
            min(backfill.from_ for backfill in pending),
            max(backfill.to for backfill in pending),
        ),
    )
    return frozenset(row[0] for row in await cursor.fetchall())


async def _record_fires(
    connection: Connection, key: ScheduleKey, spec: ScheduleSpec, decision: FireDecision
) -> tuple[FiredRun, ...]:
    expression = parse_expression(spec.schedule)
    zone = zone_named(spec.time_zone)
    fired: list[FiredRun] = []
    for fire in decision.fire:
        name = run_name(key.name, expression, zone, fire.nominal)
        cursor = await connection.execute(
            "INSERT INTO flowforge_schedule_fire (namespace, schedule_name, schedule_uid, "
            "nominal_time, run_name, backfill_id, manual) VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING id",
            (key.namespace, key.name, key.uid, fire.nominal, name, fire.backfill, fire.manual),
        )
        if await cursor.fetchone() is not None:
            fired.append(FiredRun(fire.nominal, name, backfill=fire.backfill, manual=fire.manual))
    return tuple(fired)


async def _uncreated(connection: Connection, key: ScheduleKey) -> tuple[FiredRun, ...]:
    cursor = await connection.execute(
        "SELECT nominal_time, run_name, backfill_id, manual FROM flowforge_schedule_fire "
        "WHERE namespace = %s AND schedule_name = %s AND NOT settled AND run_uid IS NULL "
        "ORDER BY nominal_time",
        (key.namespace, key.name),
    )
    return tuple(FiredRun(*row) for row in await cursor.fetchall())


async def _last_fire(connection: Connection, key: ScheduleKey) -> LastFire | None:
    cursor = await connection.execute(
        "SELECT f.nominal_time, f.run_name, r.phase FROM flowforge_schedule_fire AS f "
        "LEFT JOIN flowforge_run AS r "
        "ON r.namespace = f.namespace AND r.name = f.run_name AND r.uid = f.run_uid "
        "WHERE f.namespace = %s AND f.schedule_name = %s "
        "ORDER BY f.fired_at DESC, f.nominal_time DESC LIMIT 1",
        (key.namespace, key.name),
    )
    row = await cursor.fetchone()
    return None if row is None else LastFire(*row)


async def mark_created(
    pool: Pool, *, fence: Fence, namespace: str, run_name: str, run_uid: str
) -> None:
    """Record the WorkflowRun object a fire made (it is not created again)."""

    async def record(connection: Connection) -> None:
        await check_fence(connection, fence)
        await connection.execute(
            "UPDATE flowforge_schedule_fire SET run_uid = %s "
            "WHERE namespace = %s AND run_name = %s AND run_uid IS NULL",
            (run_uid, namespace, run_name),
        )

    await in_transaction(pool, record)


async def schedule_fires(pool: Pool, *, namespace: str, name: str) -> list[dict[str, Any]]:
    """Every fire of a schedule, oldest first (for describe and tests)."""

    async def read(connection: Connection) -> list[dict[str, Any]]:
        cursor = await connection.execute(
            "SELECT nominal_time, run_name, backfill_id, manual, fired_at, run_uid "
            "FROM flowforge_schedule_fire WHERE namespace = %s AND schedule_name = %s "
            "ORDER BY nominal_time",
            (namespace, name),
        )
        columns = ("nominalTime", "run", "backfill", "manual", "firedAt", "runUid")
        return [dict(zip(columns, row, strict=True)) for row in await cursor.fetchall()]

    return await in_transaction(pool, read, single_statement=True)
