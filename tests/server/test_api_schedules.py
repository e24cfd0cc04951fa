"""WorkflowSchedules through the read API on the real control plane and PostgreSQL, with the
operator firing them: a schedule's spec and next times (its object, read with the caller's
token) beside what it fired (the store), its runs newest first and paged, and the access
rules: ``list``/``get workflowschedules``, plus ``list workflowruns`` for a schedule's runs."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.domain.api import API_VERSION, GROUP, VERSION
from flowforge.domain.schedule import KIND, PLURAL
from flowforge.localdev.controlplane import Cluster
from tests.plugins.api_server import READER_RULES, ApiServer, Tenancy, reader_token

pytestmark = pytest.mark.cluster

# three past nights, fired at once; 03:00 in Berlin is 02:00 UTC in January
BACKFILL = {"id": "past", "from": "2026-01-01T00:00:00Z", "to": "2026-01-03T23:59:59Z"}
NIGHTS = ["2026-01-03T02:00:00Z", "2026-01-02T02:00:00Z", "2026-01-01T02:00:00Z"]


def _schedule(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"workflow": "diamond", "version": 1, "schedule": "0 3 * * *", **spec},
    }


@pytest.fixture(scope="module")
async def schedules(tenancy: Tenancy, engine: object, api_server: ApiServer) -> str:
    """``nightly`` (Berlin, its backfill fired and its three runs stored) and ``off``
    (suspended) in A; returns A's schedules path."""
    custom = k8s.CustomObjectsApi(tenancy.api)
    for body in (
        _schedule("nightly", timeZone="Europe/Berlin", backfills=[BACKFILL]),
        _schedule("off", suspend=True),
    ):
        custom.create_namespaced_custom_object(GROUP, VERSION, tenancy.a, PLURAL, body)
    base = f"/api/v1/namespaces/{tenancy.a}/schedules"
    deadline = time.monotonic() + 60
    detail: dict[str, Any] = {}
    while time.monotonic() < deadline:
        detail = api_server.request(f"{base}/nightly", token=tenancy.reader_token).json()
        runs = detail.get("runs") or []
        if len(runs) == 3 and all(run["run"] for run in runs) and detail["nextFireTimes"]:
            return base
        await asyncio.sleep(0.3)
    raise AssertionError(f"nightly did not fire its backfill: {detail}")


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_list_shows_spec_next_times_last_fire_and_missed(
    api_server: ApiServer, tenancy: Tenancy, schedules: str
) -> None:
    listed = api_server.request(schedules, token=tenancy.reader_token)
    assert listed.status == 200, listed.body
    items = {item["name"]: item for item in listed.json()["items"]}
    # the namespace is the session's (tests/ui adds its own schedules there, before or after)
    assert {"nightly", "off"} <= set(items), sorted(items)
    nightly, off = items["nightly"], items["off"]
    assert (nightly["workflow"], nightly["version"], nightly["schedule"]) == (
        "diamond",
        1,
        "0 3 * * *",
    )
    assert nightly["timeZone"] == "Europe/Berlin" and nightly["overlapPolicy"] == "Skip"
    assert nightly["suspended"] is False and nightly["namespace"] == tenancy.a
    upcoming = [_at(instant) for instant in nightly["nextFireTimes"]]
    assert len(upcoming) == 3 and upcoming == sorted(upcoming)
    assert all(instant > datetime.now(UTC) for instant in upcoming)
    assert all(instant.hour in {1, 2} and instant.minute == 0 for instant in upcoming)
    last = nightly["lastFire"]
    assert last["nominalTime"] == NIGHTS[0] and last["phase"] in {"Running", "Succeeded"}
    assert last["run"].startswith("nightly-")
    assert nightly["missed"] == {} and nightly["queued"] is None
    made = api_server.request(f"{schedules}/nightly", token=tenancy.reader_token).json()
    assert set(nightly["active"]) <= {run["name"] for run in made["runs"]}
    assert {c["type"]: c["status"] for c in nightly["conditions"]}["Ready"] == "True"
    assert off["suspended"] is True and off["nextFireTimes"] == [] and off["lastFire"] is None
    assert off["active"] == [] and off["timeZone"] == "UTC"


def test_a_schedule_s_runs_newest_first_in_pages(
    api_server: ApiServer, tenancy: Tenancy, schedules: str
) -> None:
    token = tenancy.reader_token
    first = api_server.request(f"{schedules}/nightly?limit=2", token=token).json()
    assert first["name"] == "nightly" and first["lastFire"]["run"] == first["runs"][0]["name"]
    assert [run["nominalTime"] for run in first["runs"]] == NIGHTS[:2]
    assert first["continue"]
    second = api_server.request(
        f"{schedules}/nightly?limit=2&continue={first['continue']}", token=token
    ).json()
    assert [run["nominalTime"] for run in second["runs"]] == NIGHTS[2:]
    assert second["continue"] is None
    for made in first["runs"] + second["runs"]:
        assert made["backfill"] == "past" and made["manual"] is False and made["firedAt"]
        run = made["run"]
        assert run["name"] == made["name"] and run["namespace"] == tenancy.a
        assert run["workflow"] == "diamond" and run["progress"]["total"] == 4
        # the run page of each is there for the same reader
        page = api_server.request(
            f"/api/v1/namespaces/{tenancy.a}/runs/{made['name']}", token=token
        )
        assert page.status == 200
    off = api_server.request(f"{schedules}/off", token=token).json()
    assert off["runs"] == [] and off["continue"] is None


def test_access_and_hostile_parameters(
    api_server: ApiServer, tenancy: Tenancy, cluster: Cluster, schedules: str
) -> None:
    token = tenancy.reader_token
    assert api_server.request(schedules).status == 401
    other = f"/api/v1/namespaces/{tenancy.b}/schedules"
    for path, verb in ((other, "list"), (f"{other}/nightly", "get")):
        denied = api_server.request(path, token=token)
        assert denied.status == 403, denied.body
        message = denied.json()["error"]["message"]
        assert f"verb {verb} on workflowschedules.flowforge.io" in message and tenancy.b in message
    runs_only = reader_token(cluster, tenancy.a, account="runs-only-s", rules=[READER_RULES[0]])
    denied = api_server.request(schedules, token=runs_only)
    assert denied.status == 403 and "workflowschedules" in denied.json()["error"]["message"]
    schedules_only = reader_token(
        cluster, tenancy.a, account="schedules-only", rules=[READER_RULES[1]]
    )
    assert api_server.request(schedules, token=schedules_only).status == 200
    denied = api_server.request(f"{schedules}/nightly", token=schedules_only)
    assert denied.status == 403 and "list on workflowruns" in denied.json()["error"]["message"]

    for query, parameter in (
        ("nightly?limit=0", "limit"),
        ("nightly?limit=501", "limit"),
        ("nightly?continue=%25%25%25", "continue"),
        ("Bad_Name", "name"),
        ("x" * 64, "name"),
    ):
        answer = api_server.request(f"{schedules}/{query}", token=token)
        assert answer.status == 400, (query, answer.body)
        assert parameter in answer.json()["error"]["message"], answer.body
    missing = api_server.request(f"{schedules}/not-there", token=token)
    assert missing.status == 404 and missing.json()["error"]["reason"] == "NotFound"
