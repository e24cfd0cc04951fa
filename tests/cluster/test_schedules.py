"""WorkflowSchedules on the real control plane and PostgreSQL: one run per nominal time
with derived names, a backfill made once, and admission's refusals naming the field.

Kept short: an ``@every 10s`` schedule watched for about 25 s, a backfill of past days
(fires at once), and refusals (the admission webhooks last: they are installed for the rest
of the module once used)."""

from __future__ import annotations

import itertools
import time
from datetime import UTC
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


async def test_every_10s_makes_one_run_per_nominal_time_with_derived_names(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(QUICK)
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        PLURAL,
        schedule("tick", schedule="@every 10s", overlapPolicy="Allow"),
    )
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
