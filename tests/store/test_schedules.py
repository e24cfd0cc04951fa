"""Schedules in the store: each nominal time fired once, on the database's clock, under
racing passes, a reset watermark, backfills and overlap with the runs the store holds."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from psycopg import errors as pg_errors

from flowforge.domain.schedule import ScheduleSpec, parse_schedule_spec
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.errors import StaleEpochError
from flowforge.store.lease import Fence
from flowforge.store.runs import create_run
from flowforge.store.schedules import (
    ScheduleKey,
    fire_due,
    mark_created,
    schedule_fires,
)
from tests.store.conftest import NAMESPACE, definition, finish, take_over

pytestmark = pytest.mark.store


def spec(**fields: Any) -> ScheduleSpec:
    return parse_schedule_spec({"workflow": "etl", "schedule": "@every 10s", **fields})


async def db_now(pool: Pool) -> datetime:
    async with pool.connection() as connection:
        cursor = await connection.execute("SELECT now()")
        row = await cursor.fetchone()
        assert row is not None
        return row[0]


async def aligned(pool: Pool, back: int) -> datetime:
    """A creation time with exactly ``back / 10`` times of ``@every 10s`` due now."""
    now = await db_now(pool)
    newest = now.replace(microsecond=0) - timedelta(seconds=now.second % 10)
    return newest - timedelta(seconds=back - 1)


def key(name: str = "poll") -> ScheduleKey:
    return ScheduleKey(namespace=NAMESPACE, name=name, uid=str(uuid.uuid4()))


async def test_due_times_fire_once_on_the_database_clock(store: Pool, fence: Fence) -> None:
    schedule = key()
    created = await aligned(store, 30)
    all_of_them = spec(overlapPolicy="Allow", catchup={"mode": "All"})
    first = await fire_due(store, fence=fence, key=schedule, spec=all_of_them, created_at=created)
    assert len(first.fired) == 3
    assert [fire.nominal_time.timestamp() % 10 for fire in first.fired] == [0, 0, 0]
    assert all(fire.nominal_time <= first.now for fire in first.fired)
    assert [fire.run_name for fire in first.to_create] == [fire.run_name for fire in first.fired]
    assert first.fired[0].run_name == f"poll-{first.fired[0].nominal_time:%Y%m%d%H%M%S}"
    again = await fire_due(store, fence=fence, key=schedule, spec=all_of_them, created_at=created)
    assert again.fired == ()
    rows = await schedule_fires(store, namespace=NAMESPACE, name="poll")
    assert len(rows) == 3


async def test_racing_passes_record_each_time_once(store: Pool, fence: Fence) -> None:
    schedule = key()
    created = await aligned(store, 90)
    all_of_them = spec(overlapPolicy="Allow", catchup={"mode": "All"})
    passes = await asyncio.gather(
        *(
            fire_due(store, fence=fence, key=schedule, spec=all_of_them, created_at=created)
            for _ in range(6)
        )
    )
    fired = [fire.nominal_time for one in passes for fire in one.fired]
    assert len(fired) == len(set(fired)) >= 9
    rows = await schedule_fires(store, namespace=NAMESPACE, name="poll")
    assert sorted(row["nominalTime"] for row in rows) == sorted(fired)


async def test_a_second_fire_of_the_same_nominal_time_records_nothing(
    store: Pool, fence: Fence
) -> None:
    """Even a pass that decides from a stale watermark (as a second operator without the
    lock would) cannot record a time twice: the unique constraint holds."""
    schedule = key()
    created = await aligned(store, 20)
    allow = spec(overlapPolicy="Allow", catchup={"mode": "All"})
    first = await fire_due(store, fence=fence, key=schedule, spec=allow, created_at=created)
    assert len(first.fired) == 2
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_schedule SET watermark = %s WHERE name = 'poll'", (created,)
        )
    stale = await fire_due(store, fence=fence, key=schedule, spec=allow, created_at=created)
    assert stale.fired == ()
    async with store.connection() as connection:
        with pytest.raises(pg_errors.UniqueViolation):
            await connection.execute(
                "INSERT INTO flowforge_schedule_fire (namespace, schedule_name, schedule_uid, "
                "nominal_time, run_name) VALUES (%s, 'poll', %s, %s, 'poll-other')",
                (NAMESPACE, schedule.uid, first.fired[0].nominal_time),
            )


async def test_skip_counts_an_overlap_until_the_run_is_final(store: Pool, fence: Fence) -> None:
    tasks = [{"key": "only"}]
    await publish_definition(store, namespace=NAMESPACE, definition=definition(tasks))
    stored = await load_definition(store, namespace=NAMESPACE, workflow="etl", version=1)
    schedule = key()
    created = await aligned(store, 20)
    skip = spec(catchup={"mode": "All"})
    first = await fire_due(store, fence=fence, key=schedule, spec=skip, created_at=created)
    # two times due: the older fires, the newer is skipped while it is active
    (fired,) = first.fired
    assert first.newly_missed == {"Overlap": 1} and first.active == (fired.run_name,)
    newest = fired.nominal_time + timedelta(seconds=10)
    # the object is created and the operator stores its run
    run_uid = str(uuid.uuid4())
    await mark_created(
        store, fence=fence, namespace=NAMESPACE, run_name=fired.run_name, run_uid=run_uid
    )
    run = await create_run(
        store, fence=fence, namespace=NAMESPACE, name=fired.run_name, uid=run_uid, definition=stored
    )

    async def rewind() -> None:  # as if the newest time were due again
        async with store.connection() as connection:
            await connection.execute(
                "UPDATE flowforge_schedule SET watermark = %s", (fired.nominal_time,)
            )

    await rewind()
    busy = await fire_due(store, fence=fence, key=schedule, spec=skip, created_at=created)
    assert busy.fired == () and busy.active == (fired.run_name,)
    assert busy.newly_missed == {"Overlap": 1} and busy.to_create == ()
    assert busy.missed == {"Overlap": 2}
    assert busy.last is not None and busy.last.phase == "Running"
    await finish(store, fence, run.run, "only")
    await rewind()
    free = await fire_due(store, fence=fence, key=schedule, spec=skip, created_at=created)
    assert [fire.nominal_time for fire in free.fired] == [newest]
    assert free.active == (free.fired[0].run_name,)


async def test_a_backfill_fires_its_times_once_and_reapplying_makes_none(
    store: Pool, fence: Fence
) -> None:
    schedule = key("nightly")
    nightly = parse_schedule_spec(
        {
            "workflow": "etl",
            "schedule": "0 2 * * *",
            "timeZone": "Europe/Paris",
            "backfills": [
                {"id": "july", "from": "2026-07-01T00:00:00Z", "to": "2026-07-05T23:59:59Z"}
            ],
        }
    )
    created = await db_now(store)
    first = await fire_due(store, fence=fence, key=schedule, spec=nightly, created_at=created)
    assert [fire.run_name for fire in first.fired] == [
        f"nightly-202607{day:02d}0200" for day in range(1, 6)
    ]
    assert {fire.backfill for fire in first.fired} == {"july"}
    again = await fire_due(store, fence=fence, key=schedule, spec=nightly, created_at=created)
    assert again.fired == ()
    # a second backfill over the same days and one more fires only the new day
    wider = nightly.model_copy(
        update={
            "backfills": parse_schedule_spec(
                {
                    "workflow": "etl",
                    "schedule": "0 2 * * *",
                    "backfills": [
                        {
                            "id": "again",
                            "from": "2026-07-01T00:00:00Z",
                            "to": "2026-07-06T12:00:00Z",
                        }
                    ],
                }
            ).backfills
        }
    )
    more = await fire_due(store, fence=fence, key=schedule, spec=wider, created_at=created)
    assert [fire.run_name for fire in more.fired] == ["nightly-202607060200"]


async def test_a_new_object_of_the_same_name_starts_afresh_but_never_refires(
    store: Pool, fence: Fence
) -> None:
    created = await aligned(store, 10)
    allow = spec(overlapPolicy="Allow")
    first = await fire_due(store, fence=fence, key=key(), spec=allow, created_at=created)
    assert len(first.fired) == 1
    second = await fire_due(store, fence=fence, key=key(), spec=allow, created_at=created)
    assert second.fired == () and second.missed == {}


async def test_a_deposed_operator_fires_nothing(store: Pool, fence: Fence) -> None:
    deposed, _ = await take_over(store)
    created = await aligned(store, 10)
    with pytest.raises(StaleEpochError):
        await fire_due(store, fence=deposed, key=key(), spec=spec(), created_at=created)
    assert await schedule_fires(store, namespace=NAMESPACE, name="poll") == []
