"""WorkflowSchedules under two operators on the real control plane and PostgreSQL: while both
run, only the lease holder fires and each nominal time makes exactly one run; when the
leader is SIGKILLed at the instant the store has fired a time (the fire committed, its run
object being made and not yet recorded), the other takes over, makes that run if it is
missing, catches up the time that went by with nobody leading, and every nominal time has
exactly one run, named by it.

Real processes cannot share a fake clock, so both tests use the smallest interval
(``@every 10s``), ``overlapPolicy: Allow`` (a run still going never stands in the way),
``catchup: All`` inside 5 minutes (a time left unfired by a takeover is owed, not
superseded) and a history that keeps every WorkflowRun object. The store's rows (fires,
missed counts, the engine's runs) and the WorkflowRun objects must agree."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.schedule import PLURAL
from flowforge.store.lease import Lease, current_lease
from flowforge.store.schedules import schedule_fires
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for, wait_for_leader
from tests.support.schedules import QUICK, nominal, runs_of, schedule

pytestmark = pytest.mark.cluster

INTERVAL = timedelta(seconds=10)
SPEC = {
    "schedule": "@every 10s",
    "overlapPolicy": "Allow",
    "catchup": {"mode": "All", "windowSeconds": 300},
    "history": {"succeeded": 50, "failed": 50},
}
# a lease TTL (renewed every second) longer than the interval: a leader killed at a fire
# instant is replaced only after the next nominal time went by with nobody leading
LONG_TTL = 13


def start_two(
    operators: Callable[..., OperatorProcess], *, lease_ttl: int = 4
) -> dict[str, OperatorProcess]:
    env = {"FLOWFORGE_LEASE_TTL": str(lease_ttl)}
    return {name: operators(identity=name, env=env) for name in ("one", "two")}


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
    wait_for(lambda: "standing by" in standby.log_tail(400), timeout=60, what="the standby")
    return leader, standby, lease


async def create_schedule(driver: RunDriver, name: str) -> datetime:
    """Publish the workflow, create the schedule; the first nominal time it owes."""
    await driver.publish(QUICK)
    body: Any = driver.custom.create_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, schedule(name, **SPEC)
    )
    created = datetime.fromisoformat(body["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    step = int(INTERVAL.total_seconds())
    return datetime.fromtimestamp((int(created.timestamp()) // step + 1) * step, UTC)


async def fire_row(driver: RunDriver, name: str, at: datetime) -> dict[str, Any] | None:
    rows = await schedule_fires(driver.pool, namespace=driver.namespace, name=name)
    return next((row for row in rows if row["nominalTime"] == at), None)


async def wait_made(driver: RunDriver, name: str, at: datetime) -> None:
    """Until the run of nominal time ``at`` exists and the store records its object."""
    deadline = time.monotonic() + max(0.0, (at - datetime.now(UTC)).total_seconds()) + 20
    while time.monotonic() < deadline:
        row = await fire_row(driver, name, at)
        if row is not None and row["runUid"] is not None:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"no run recorded for {at:%H:%M:%S}: {runs_of(driver, name).keys()}")


async def assert_one_run_per_time(
    driver: RunDriver, name: str, *, first: datetime, through: datetime
) -> None:
    """Every nominal time in ``[first, through]`` has exactly one fire in the store and one
    WorkflowRun object, named by the time, the object the store recorded; nothing before
    ``first``, nothing missed."""
    expected = [first + INTERVAL * index for index in range((through - first) // INTERVAL + 1)]
    names = [f"{name}-{instant:%Y%m%d%H%M%S}" for instant in expected]
    fires = await schedule_fires(driver.pool, namespace=driver.namespace, name=name)
    made = [row for row in fires if row["nominalTime"] <= through]
    assert [row["nominalTime"] for row in made] == expected, "a time missing or fired twice"
    assert [row["run"] for row in made] == names
    runs = runs_of(driver, name)
    assert sorted(nominal(run) for run in runs.values() if nominal(run) <= through) == expected
    assert {row["run"]: row["runUid"] for row in made} == {
        run_name: runs[run_name]["metadata"]["uid"] for run_name in names
    }, "the store records another object than the one that exists"
    async with driver.pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT name, count(*) FROM flowforge_run WHERE namespace = %s AND name = ANY(%s) "
            "GROUP BY name",
            (driver.namespace, names),
        )
        stored: dict[str, int] = dict(await cursor.fetchall())
        cursor = await connection.execute(
            "SELECT missed FROM flowforge_schedule WHERE namespace = %s AND name = %s",
            (driver.namespace, name),
        )
        missed = await cursor.fetchone()
    # the engine stores each object it sees: a name made twice would have two rows
    assert all(count == 1 for count in stored.values()), stored
    assert missed == ({},), f"times counted missed: {missed}"


async def test_two_operators_make_one_run_per_nominal_time(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    started = start_two(operators)
    first = await create_schedule(driver, "both")  # while they start: the first may be late
    leader, standby, lease = await roles(started, driver)
    through = first + 3 * INTERVAL
    await wait_made(driver, "both", through)
    assert leader.running and standby.running
    still = await current_lease(driver.pool)  # any takeover would have a new epoch
    assert still is not None and (still.holder, still.epoch) == (lease.holder, lease.epoch)
    await assert_one_run_per_time(driver, "both", first=first, through=through)


async def test_the_leader_killed_as_the_store_fires_a_time_loses_and_doubles_none(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    started = start_two(operators, lease_ttl=LONG_TTL)
    first = await create_schedule(driver, "crash")
    leader, standby, lease = await roles(started, driver)
    await wait_made(driver, "crash", first)  # the leader fires before it dies
    at = first + INTERVAL
    await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds() - 0.5))
    deadline = at + timedelta(seconds=5)
    row = await fire_row(driver, "crash", at)
    while row is None and datetime.now(UTC) < deadline:
        await asyncio.sleep(0.002)
        row = await fire_row(driver, "crash", at)
    leader.kill()  # the fire is committed, its run object is being made
    killed = datetime.now(UTC)
    assert row is not None, f"the leader did not fire {at:%H:%M:%S}:\n{leader.log_tail()}"
    print(
        f"killed {(killed - at).total_seconds() * 1000:.0f} ms after the nominal time; "
        f"the run's object was {'recorded' if row['runUid'] else 'not recorded'} yet"
    )
    epoch = await wait_for_leader(
        driver.pool, standby.identity, process=standby, timeout=LONG_TTL + 6
    )
    assert epoch > lease.epoch
    through = at + INTERVAL
    assert datetime.now(UTC) > through, "the takeover did not leave a nominal time unled"
    await wait_made(driver, "crash", through)  # owed: fired by the new leader's catch-up
    await assert_one_run_per_time(driver, "crash", first=first, through=through)
