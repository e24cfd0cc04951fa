"""WorkflowSchedules under two operators on the real control plane and PostgreSQL, over two
minutes of an ``@every 15s`` schedule, run once (the window is what costs): both operators
race for the whole window and only the lease holder fires; the leader is SIGKILLed at the
instant the store has fired a time (the fire committed, its run object being made and not
yet recorded); the other takes over, makes that run if it is missing and catches up the
time that went by with nobody leading; the killed one is started again and stands by, so
two race again to the end. Every nominal time of the window has exactly one run, named by
it, none missing, none twice.

Real processes cannot share a fake clock, hence real time: ``overlapPolicy: Allow`` (a run
still going never stands in the way), ``catchup: All`` inside 5 minutes (a time left
unfired by a takeover is owed, not superseded) and a history that keeps every WorkflowRun
object. The store's rows (fires, missed counts, the engine's runs), the lease and the
WorkflowRun objects must agree."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.schedule import PLURAL
from flowforge.store.lease import DEFAULT_LEASE, Lease, current_lease
from flowforge.store.schedules import schedule_fires
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for, wait_for_leader
from tests.support.schedules import QUICK, nominal, runs_of, schedule

pytestmark = pytest.mark.cluster

NAME = "every15"
INTERVAL = timedelta(seconds=15)
WINDOW = 8  # intervals: nine nominal times, two minutes apart first to last
SPEC = {
    "schedule": "@every 15s",
    "overlapPolicy": "Allow",
    "catchup": {"mode": "All", "windowSeconds": 300},
    "history": {"succeeded": 50, "failed": 50},
}
# a lease TTL (renewed every second) longer than the interval, shorter than two: a leader
# killed at a fire instant is replaced after exactly one nominal time went by unled
LEASE_TTL = 18
# how late a leader that is up fires a time (it sleeps until the time; measured ~0.1 s)
ON_TIME = timedelta(seconds=5)


def start_two(operators: Callable[..., OperatorProcess]) -> dict[str, OperatorProcess]:
    env = {"FLOWFORGE_LEASE_TTL": str(LEASE_TTL)}
    return {name: operators(identity=name, env=env) for name in ("one", "two")}


def standing_by(process: OperatorProcess) -> bool:
    """The process's latest start logged that another operator holds the lease."""
    latest = process.log_tail(2000).rpartition("===== start #")[2]
    return "standing by" in latest


async def roles(
    started: dict[str, OperatorProcess], driver: RunDriver
) -> tuple[OperatorProcess, OperatorProcess, Lease]:
    """The leader, the standby (up and standing by), the lease."""
    deadline = time.monotonic() + 60
    lease = await current_lease(driver.pool)
    while lease is None and time.monotonic() < deadline:
        assert all(process.running for process in started.values())
        await asyncio.sleep(0.2)
        lease = await current_lease(driver.pool)
    assert lease is not None, "no operator took the lease"
    leader = started[lease.holder]
    (standby,) = (process for name, process in started.items() if name != lease.holder)
    wait_for(lambda: standing_by(standby), timeout=60, what="the standby")
    return leader, standby, lease


async def create_schedule(driver: RunDriver) -> datetime:
    """Publish the workflow, create the schedule; the first nominal time it owes."""
    await driver.publish(QUICK)
    body: Any = driver.custom.create_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, schedule(NAME, **SPEC)
    )
    created = datetime.fromisoformat(body["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    step = int(INTERVAL.total_seconds())
    return datetime.fromtimestamp((int(created.timestamp()) // step + 1) * step, UTC)


async def fire_row(driver: RunDriver, at: datetime) -> dict[str, Any] | None:
    rows = await schedule_fires(driver.pool, namespace=driver.namespace, name=NAME)
    return next((row for row in rows if row["nominalTime"] == at), None)


async def wait_made(driver: RunDriver, at: datetime) -> None:
    """Until the run of nominal time ``at`` exists and the store records its object."""
    deadline = time.monotonic() + max(0.0, (at - datetime.now(UTC)).total_seconds()) + 20
    while time.monotonic() < deadline:
        row = await fire_row(driver, at)
        if row is not None and row["runUid"] is not None:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no run recorded for {at:%H:%M:%S}: {runs_of(driver, NAME).keys()}")


async def kill_as_the_store_fires(driver: RunDriver, leader: OperatorProcess, at: datetime) -> None:
    """SIGKILL the leader the moment the store holds its fire of ``at``."""
    await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds() - 0.5))
    deadline = at + timedelta(seconds=5)
    row = await fire_row(driver, at)
    while row is None and datetime.now(UTC) < deadline:
        await asyncio.sleep(0.002)
        row = await fire_row(driver, at)
    leader.kill()  # the fire is committed, its run object is being made
    killed = datetime.now(UTC)
    assert row is not None, f"the leader did not fire {at:%H:%M:%S}:\n{leader.log_tail()}"
    print(
        f"killed {(killed - at).total_seconds() * 1000:.0f} ms after the nominal time; "
        f"the run's object was {'recorded' if row['runUid'] else 'not recorded'} yet"
    )


async def lease_acquired_at(driver: RunDriver) -> datetime:
    async with driver.pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT acquired_at FROM flowforge_lease WHERE name = %s", (DEFAULT_LEASE,)
        )
        row = await cursor.fetchone()
    assert row is not None
    acquired: datetime = row[0]
    return acquired


async def assert_one_run_per_time(
    driver: RunDriver, *, first: datetime, through: datetime
) -> list[dict[str, Any]]:
    """Every nominal time in ``[first, through]`` has exactly one fire in the store and one
    WorkflowRun object, named by the time, created no earlier than it, the object the store
    recorded; nothing before ``first``, nothing missed. The fires, oldest first."""
    expected = [first + INTERVAL * index for index in range((through - first) // INTERVAL + 1)]
    names = [f"{NAME}-{instant:%Y%m%d%H%M%S}" for instant in expected]
    fires = await schedule_fires(driver.pool, namespace=driver.namespace, name=NAME)
    made = [row for row in fires if row["nominalTime"] <= through]
    assert [row["nominalTime"] for row in made] == expected, "a time missing or fired twice"
    assert [row["run"] for row in made] == names
    runs = runs_of(driver, NAME)
    assert sorted(nominal(run) for run in runs.values() if nominal(run) <= through) == expected
    assert {row["run"]: row["runUid"] for row in made} == {
        run_name: runs[run_name]["metadata"]["uid"] for run_name in names
    }, "the store records another object than the one that exists"
    early = {
        run_name: created
        for run_name, instant in zip(names, expected, strict=True)
        if (created := datetime.fromisoformat(runs[run_name]["metadata"]["creationTimestamp"]))
        < instant
    }
    assert not early, f"runs created before their nominal times: {early}"
    async with driver.pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT name, count(*) FROM flowforge_run WHERE namespace = %s AND name = ANY(%s) "
            "GROUP BY name",
            (driver.namespace, names),
        )
        stored: dict[str, int] = dict(await cursor.fetchall())
        cursor = await connection.execute(
            "SELECT missed FROM flowforge_schedule WHERE namespace = %s AND name = %s",
            (driver.namespace, NAME),
        )
        missed = await cursor.fetchone()
    # the engine stores each object it sees: a name made twice would have two rows
    assert stored == dict.fromkeys(names, 1), stored
    assert missed == ({},), f"times counted missed: {missed}"
    return made


async def test_two_minutes_of_every_15s_two_operators_racing_and_the_leader_killed_at_a_fire(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    started = start_two(operators)
    first = await create_schedule(driver)  # while they start: the first may be late
    leader, standby, lease = await roles(started, driver)
    led_since = datetime.now(UTC)
    through = first + WINDOW * INTERVAL
    # the first time the leader fires while the other stands by (a slow start may have left
    # earlier ones to its catch-up), after at least one it made: a fire instant
    after = led_since + timedelta(seconds=1) - first
    at = first + INTERVAL * max(1, math.ceil(after / INTERVAL))
    await wait_made(driver, at - INTERVAL)
    await kill_as_the_store_fires(driver, leader, at)

    epoch = await wait_for_leader(
        driver.pool, standby.identity, process=standby, timeout=LEASE_TTL + 6
    )
    assert epoch > lease.epoch
    taken = await lease_acquired_at(driver)
    unled = [instant for instant in (at + INTERVAL * index for index in (1, 2)) if instant < taken]
    assert unled == [at + INTERVAL], f"the takeover at {taken} left other times unled than one"
    leader.start()
    wait_for(lambda: standing_by(leader), timeout=60, what=f"{leader.identity} to stand by again")

    await wait_made(driver, through)
    assert leader.running and standby.running
    still = await current_lease(driver.pool)  # a takeover by the restarted one: a new epoch
    assert still is not None and (still.holder, still.epoch) == (standby.identity, epoch)
    fires = await assert_one_run_per_time(driver, first=first, through=through)

    fired = {row["nominalTime"]: row["firedAt"] for row in fires}
    print("fired late by", [f"{(fired[t] - t).total_seconds():.2f}s" for t in fired])
    led = [instant for instant in fired if instant >= at and instant not in unled]
    late = {t: fired[t] - t for t in led if fired[t] - t >= ON_TIME}
    assert not late, f"a leader that was up fired late: {late}"
    # the time nobody led is owed: the new leader's catch-up fired it, once it led
    assert all(fired[t] >= taken for t in unled), (fired, taken)
