"""WorkflowSchedules on the real control plane and PostgreSQL: one run per nominal time
with derived names, the catch-up after a suspension, a backfill made once, and admission's
refusals naming the field.

Kept short: an ``@every 10s`` schedule watched for about 25 s while, beside it, a `Latest`
and an `All` schedule are suspended for three intervals and resumed (one operator, about
45 s in all), a backfill of past days (fires at once), and refusals (the admission webhooks
last: they are installed for the rest of the module once used)."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.schedule import KIND, PLURAL
from flowforge.localdev.controlplane import Cluster
from flowforge.store.schedules import schedule_fires
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for
from tests.plugins.webhooks import WebhookServer
from tests.support.schedules import QUICK, nominal, runs_of, schedule

pytestmark = pytest.mark.cluster


INTERVAL = timedelta(seconds=10)
EVERY_10S = {
    "schedule": "@every 10s",
    "overlapPolicy": "Allow",  # a catch-up's runs all start, whatever is still running
    "history": {"succeeded": 50, "failed": 50},  # every object kept: none pruned mid-test
}
CATCHING_UP = {"latest": "Latest", "all": "All"}


def schedule_status(driver: RunDriver, name: str) -> dict[str, Any]:
    body = driver.custom.get_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, name
    )
    return dict(body.get("status") or {})


def set_suspend(driver: RunDriver, suspend: bool) -> None:
    """What ``kubectl patch wfs NAME --type merge -p '{"spec":{"suspend":...}}'`` does."""
    for name in CATCHING_UP:
        driver.custom.patch_namespaced_custom_object(
            GROUP, VERSION, driver.namespace, PLURAL, name, {"spec": {"suspend": suspend}}
        )


def suspend_after_the_first_fire(driver: RunDriver) -> datetime:
    """Suspend the catching-up schedules once each fired; the time each fired last."""
    wait_for(
        lambda: all(runs_of(driver, name) for name in CATCHING_UP), timeout=30, what="first fires"
    )
    set_suspend(driver, True)
    wait_for(
        lambda: all(
            {"type": "Ready", "reason": "Suspended"}.items() <= condition.items()
            for name in CATCHING_UP
            for condition in schedule_status(driver, name).get("conditions", [])
            if condition["type"] == "Ready"
        ),
        timeout=10,
        what="the suspension shown",
    )
    lasts = {max(map(nominal, runs_of(driver, name).values())) for name in CATCHING_UP}
    assert len(lasts) == 1, f"the schedules fired different times before suspending: {lasts}"
    return lasts.pop()


async def resume_after_three_intervals(driver: RunDriver, last: datetime) -> list[datetime]:
    """Resume one second after the third time missed; the three times missed."""
    missed = [last + INTERVAL * index for index in (1, 2, 3)]
    await asyncio.sleep(max(0.0, (missed[-1] - datetime.now(UTC)).total_seconds() + 1))
    resumed = datetime.now(UTC)
    set_suspend(driver, False)
    assert datetime.now(UTC) < missed[-1] + INTERVAL, "resumed after a fourth time"
    wait_for(
        lambda: (
            set(missed) <= set(map(nominal, runs_of(driver, "all").values()))
            and missed[-1] in map(nominal, runs_of(driver, "latest").values())
        ),
        timeout=15,
        what="the catch-up runs",
    )
    fired_late = await fired_in_order(driver, "all", after=last)
    assert all(at >= resumed for _, at in fired_late), "fired while suspended"
    return missed


async def fired_in_order(
    driver: RunDriver, name: str, *, after: datetime
) -> list[tuple[datetime, datetime]]:
    """(nominal time, fired at) of the schedule's fires after ``after``, in the order fired."""
    async with driver.pool.connection() as connection:
        cursor = await connection.execute(
            "SELECT nominal_time, fired_at FROM flowforge_schedule_fire WHERE namespace = %s "
            "AND schedule_name = %s AND nominal_time > %s ORDER BY id",
            (driver.namespace, name, after),
        )
        return list(await cursor.fetchall())


async def assert_caught_up(driver: RunDriver, last: datetime, missed: list[datetime]) -> None:
    """`Latest` fired the newest time missed, the others superseded; `All` fired the three,
    oldest first: in the store's order and as run objects named by their times."""
    made = {
        name: sorted(
            instant
            for instant in map(nominal, runs_of(driver, name).values())
            if last < instant <= missed[-1]
        )
        for name in CATCHING_UP
    }
    assert made == {"latest": missed[-1:], "all": missed}
    assert set(runs_of(driver, "all")) >= {
        f"all-{instant.astimezone(UTC):%Y%m%d%H%M%S}" for instant in missed
    }
    order = [instant for instant, _ in await fired_in_order(driver, "all", after=last)]
    assert order[:3] == missed, "All did not fire the missed times oldest first"
    # the status is patched after the pass made its runs
    wait_for(
        lambda: schedule_status(driver, "latest").get("missed") == {"Superseded": 2},
        timeout=10,
        what=lambda: f"Latest's missed counts: {schedule_status(driver, 'latest')}",
    )
    assert not schedule_status(driver, "all").get("missed")


async def test_every_10s_makes_one_run_per_nominal_time_and_catches_up_after_suspend(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(QUICK)
    driver.custom.create_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, schedule("tick", **EVERY_10S)
    )
    for name, mode in CATCHING_UP.items():
        driver.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            driver.namespace,
            PLURAL,
            schedule(name, **EVERY_10S, catchup={"mode": mode, "windowSeconds": 300}),
        )
    last = suspend_after_the_first_fire(driver)
    wait_for(lambda: len(runs_of(driver, "tick")) >= 3, timeout=40, what="three fires")
    runs = runs_of(driver, "tick")
    times = sorted(nominal(run) for run in runs.values())
    assert all(int(instant.timestamp()) % 10 == 0 for instant in times)
    # consecutive nominal times: none missing, none twice
    assert [int((b - a).total_seconds()) for a, b in itertools.pairwise(times)] == [10] * (
        len(times) - 1
    )
    assert sorted(runs) == sorted(
        f"tick-{instant.astimezone(UTC):%Y%m%d%H%M%S}" for instant in times
    )
    for run in runs.values():
        owner = run["metadata"]["ownerReferences"][0]
        assert owner["kind"] == KIND and owner["name"] == "tick" and owner["controller"] is True
    fires = await schedule_fires(driver.pool, namespace=driver.namespace, name="tick")
    assert {row["run"] for row in fires} >= set(runs)
    assert len({row["nominalTime"] for row in fires}) == len(fires)

    def shown() -> dict[str, Any] | None:
        status = driver.custom.get_namespaced_custom_object(
            GROUP, VERSION, driver.namespace, PLURAL, "tick"
        ).get("status")
        return status if status and status.get("lastFire") else None

    status = wait_for(shown, timeout=10, what="the schedule's status")
    assert len(status["nextFireTimes"]) == 3 and status["timeZone"] == "UTC"
    assert status["observedGeneration"] == 1

    missed = await resume_after_three_intervals(driver, last)
    await assert_caught_up(driver, last, missed)


async def test_a_backfill_makes_its_five_runs_once_and_reapplying_makes_none(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(QUICK)
    backfill = {"id": "july", "from": "2026-07-01T00:00:00Z", "to": "2026-07-05T23:59:59Z"}
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        PLURAL,
        schedule("nightly", schedule="0 2 * * *", timeZone="Europe/Paris", backfills=[backfill]),
    )
    expected = {f"nightly-202607{day:02d}0200" for day in range(1, 6)}
    wait_for(lambda: set(runs_of(driver, "nightly")) == expected, timeout=20, what="five runs")
    uids = {name: run["metadata"]["uid"] for name, run in runs_of(driver, "nightly").items()}
    # re-applying: the same backfill again under its id, and a change that wakes the schedule
    driver.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        PLURAL,
        "nightly",
        {"spec": {"backfills": [backfill], "parameters": {"again": "1"}}},
    )
    time.sleep(3)  # the controller reacts to the watch event within a pass
    assert {name: run["metadata"]["uid"] for name, run in runs_of(driver, "nightly").items()} == (
        uids
    )
    fires = await schedule_fires(driver.pool, namespace=driver.namespace, name="nightly")
    assert sorted(row["run"] for row in fires) == sorted(expected)


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        ({"schedule": "61 * * * *"}, "spec.schedule", "not a valid cron expression"),
        ({"schedule": "@every 5s"}, "spec.schedule", "under the minimum of 10s"),
        (
            {"schedule": "@every 30s", "timeZone": "Mars/Olympus"},
            "spec.timeZone",
            "unknown time zone",
        ),
    ],
)
def test_admission_refuses_a_bad_schedule_naming_the_field(
    cluster: Cluster,
    namespace: str,
    kube_api: k8s.ApiClient,
    flowforge_crds: list[str],
    admission_webhooks: WebhookServer,
    spec: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    custom = k8s.CustomObjectsApi(kube_api)
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, schedule("bad", **spec)
        )
    assert 400 <= refused.value.status < 500
    body = str(refused.value.body)
    assert f"{field}:" in body and fragment in body
    admission_webhooks.assert_alive()
