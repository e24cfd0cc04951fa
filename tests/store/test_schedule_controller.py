"""The schedule controller (`operator/schedules.py`) on a real store with a fake apiserver:
the runs it creates (names, owner, annotations), a crash between the store's record and
the object's creation, two controllers racing, status, triggers, a stalled spec, and a new
leader's loop woken when it gains the lease."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.kube.schedule_objects import NOMINAL_TIME_ANNOTATION, SCHEDULED_BY_ANNOTATION
from flowforge.operator.failures import Failures
from flowforge.operator.leadership import Leadership
from flowforge.operator.schedules import ScheduleController
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition
from flowforge.store.lease import Fence
from flowforge.store.schedules import schedule_fires
from flowforge.store.session import LEASE_LIMITS
from flowforge.store.single import SingleConnection
from tests.store.conftest import NAMESPACE, definition
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store


class FakeObjects:
    def __init__(self) -> None:
        self.runs: dict[str, Mapping[str, Any]] = {}
        self.status: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.warnings: list[str] = []
        self.fail_next_create = False

    async def create_run(self, manifest: Mapping[str, Any]) -> str | None:
        if self.fail_next_create:
            self.fail_next_create = False
            raise ConnectionError("apiserver gone at the fire instant")
        name = manifest["metadata"]["name"]
        made = {**manifest, "metadata": {**manifest["metadata"], "uid": str(uuid.uuid4())}}
        existing = self.runs.setdefault(name, made)
        return str(existing["metadata"]["uid"])

    async def list_runs(self, *, namespace: str, schedule: str) -> list[dict[str, Any]]:
        return [dict(run) for run in self.runs.values()]

    async def delete_run(self, *, namespace: str, name: str, uid: str) -> None:
        self.runs.pop(name, None)

    async def cancel_run(self, *, namespace: str, name: str) -> None:
        self.cancelled.append(name)

    async def patch_status(self, *, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status = dict(status)

    async def warn(self, schedule: Mapping[str, Any], *, reason: str, message: str) -> None:
        self.warnings.append(reason)


async def _deposed() -> None:
    return None


@pytest.fixture(autouse=True)
async def published(store: Pool) -> None:
    await publish_definition(store, namespace=NAMESPACE, definition=definition([{"key": "only"}]))


def controller(
    pool: Pool,
    fence: Fence | Callable[[], Fence | None],
    objects: FakeObjects,
    *,
    max_sleep: float = 5.0,
) -> ScheduleController:
    return ScheduleController(
        pool=pool,
        objects=objects,  # type: ignore[arg-type]
        fence=fence if callable(fence) else lambda: fence,
        failures=Failures(on_deposed=_deposed),
        max_sleep=max_sleep,
    )


def schedule_body(created: datetime, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "poll",
            "namespace": NAMESPACE,
            "uid": "schedule-uid-1",
            "generation": 1,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "annotations": {"flowforge.io/requested-by": "alice"},
        },
        "spec": {"workflow": "etl", "schedule": "@every 10s", **spec},
    }


async def aligned(pool: Pool, back: int) -> datetime:
    async with pool.connection() as connection:
        cursor = await connection.execute("SELECT now()")
        row = await cursor.fetchone()
    assert row is not None
    now: datetime = row[0]
    newest = now.replace(microsecond=0) - timedelta(seconds=now.second % 10)
    return newest - timedelta(seconds=back - 1)


async def test_each_fire_creates_one_owned_run_named_by_its_time(store: Pool, fence: Fence) -> None:
    objects = FakeObjects()
    body = schedule_body(await aligned(store, 30), overlapPolicy="Allow", catchup={"mode": "All"})
    schedules = controller(store, fence, objects)
    due_in = await schedules.reconcile(body)
    assert due_in is not None and 0 <= due_in <= 10
    assert len(objects.runs) == 3
    for name, run in objects.runs.items():
        assert name.startswith("poll-") and len(name) == len("poll-") + 14
        assert run["metadata"]["ownerReferences"][0]["uid"] == "schedule-uid-1"
        assert run["metadata"]["labels"]["flowforge.io/schedule"] == "poll"
        annotations = run["metadata"]["annotations"]
        assert annotations[SCHEDULED_BY_ANNOTATION] == "alice"
        nominal = datetime.fromisoformat(annotations[NOMINAL_TIME_ANNOTATION])
        assert name == f"poll-{nominal.astimezone(UTC):%Y%m%d%H%M%S}"
        assert run["spec"] == {"workflow": "etl"}  # the version is pinned at each fire
    status = objects.status
    assert status["activeCount"] == 3 and len(status["nextFireTimes"]) == 3
    assert status["lastFire"]["phase"] == "Pending"
    assert status["tzdataVersion"] and status["timeZone"] == "UTC"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "Stalled": "False",
    }
    await schedules.reconcile({**body, "status": status})
    assert len(objects.runs) == 3


async def test_a_crash_between_record_and_creation_loses_no_run(store: Pool, fence: Fence) -> None:
    objects = FakeObjects()
    objects.fail_next_create = True
    body = schedule_body(await aligned(store, 10))
    schedules = controller(store, fence, objects)
    with pytest.raises(ConnectionError):
        await schedules.reconcile(body)
    assert objects.runs == {}
    await schedules.reconcile(body)  # the next pass (or the next leader) creates it
    assert len(objects.runs) == 1
    rows = await schedule_fires(store, namespace=NAMESPACE, name="poll")
    assert [row["run"] for row in rows] == list(objects.runs)
    assert rows[0]["runUid"] == next(iter(objects.runs.values()))["metadata"]["uid"]


async def test_two_controllers_racing_make_each_run_once(store: Pool, fence: Fence) -> None:
    shared = FakeObjects()
    body = schedule_body(await aligned(store, 50), overlapPolicy="Allow", catchup={"mode": "All"})
    await asyncio.gather(
        *(controller(store, fence, shared).reconcile(body) for _ in range(4)),
    )
    rows = await schedule_fires(store, namespace=NAMESPACE, name="poll")
    assert len(rows) == len(shared.runs) == 5


async def test_a_trigger_fires_once_per_token(store: Pool, fence: Fence) -> None:
    objects = FakeObjects()
    body = schedule_body(datetime.now(UTC) + timedelta(hours=1), schedule="0 2 * * *")
    body["metadata"]["annotations"]["flowforge.io/trigger"] = "t-1"
    schedules = controller(store, fence, objects)
    await schedules.reconcile(body)
    assert len(objects.runs) == 1 and objects.status["lastTrigger"] == "t-1"
    (name,) = objects.runs
    assert objects.runs[name]["metadata"]["annotations"]["flowforge.io/manual-trigger"] == "true"
    await schedules.reconcile({**body, "status": objects.status})
    assert len(objects.runs) == 1


async def test_a_bad_spec_stalls_the_schedule_and_fires_nothing(store: Pool, fence: Fence) -> None:
    objects = FakeObjects()
    body = schedule_body(await aligned(store, 30), timeZone="Mars/Base")
    assert await controller(store, fence, objects).reconcile(body) is None
    assert objects.runs == {}
    stalled = {c["type"]: c for c in objects.status["conditions"]}["Stalled"]
    assert stalled["status"] == "True" and "spec.timeZone" in stalled["message"]


async def test_history_keeps_the_newest_finished_runs_of_each_outcome(
    store: Pool, fence: Fence
) -> None:
    objects = FakeObjects()
    body = schedule_body(
        await aligned(store, 60),
        overlapPolicy="Allow",
        catchup={"mode": "All"},
        history={"succeeded": 2, "failed": 1},
    )
    schedules = controller(store, fence, objects)
    await schedules.reconcile(body)
    names = sorted(objects.runs)
    assert len(names) == 6
    phases = ["Succeeded", "Failed", "Succeeded", "Cancelled", "Succeeded", "Running"]
    for name, phase in zip(names, phases, strict=True):
        objects.runs[name] = {**objects.runs[name], "status": {"phase": phase}}
    objects.status = {}  # a change to show: the pass prunes
    await schedules.reconcile(body)
    assert sorted(objects.runs) == [names[2], names[3], names[4], names[5]]


async def test_a_workflow_that_does_not_exist_stalls_the_schedule(
    store: Pool, fence: Fence
) -> None:
    objects = FakeObjects()
    body = schedule_body(await aligned(store, 30), workflow="gone")
    assert await controller(store, fence, objects).reconcile(body) is None
    assert objects.runs == {}
    stalled = {c["type"]: c for c in objects.status["conditions"]}["Stalled"]
    assert stalled["status"] == "True" and stalled["reason"] == "WorkflowNotFound"
    pinned = schedule_body(await aligned(store, 30), version=9)
    await controller(store, fence, objects).reconcile(pinned)
    reasons = {c["type"]: c["reason"] for c in objects.status["conditions"]}
    assert reasons["Stalled"] == "VersionNotFound" and objects.runs == {}


async def test_gaining_the_lease_wakes_the_loop_for_a_pass_at_once(
    store: Pool, store_dsn: str
) -> None:
    """A standby's loop acts on nothing and sleeps (an hour here, where the operator's is
    5 s): only the wake when the lease is gained can make the run that is due."""
    connection = SingleConnection(store_dsn, limits=LEASE_LIMITS, name="test-lease")
    leadership = Leadership(
        connection,
        identity="new-leader",
        ttl=timedelta(seconds=30),
        renew_every=0.2,
    )
    consulted: list[Fence | None] = []

    def fence() -> Fence | None:
        consulted.append(leadership.fence)
        return consulted[-1]

    objects = FakeObjects()
    schedules = controller(store, fence, objects, max_sleep=3600)

    async def gained(_: Fence) -> None:
        schedules.wake()

    leadership.on_gained = gained
    schedules.observe("ADDED", schedule_body(await aligned(store, 10)))
    looping = asyncio.create_task(schedules.run_forever())
    leading: asyncio.Task[None] | None = None
    try:
        # it yields only to sleep: once it asked for the fence, it sleeps without one
        await wait_until(lambda: consulted, what="the standby's pass")
        assert consulted == [None] and objects.runs == {}
        leading = asyncio.create_task(leadership.run())
        await wait_until(lambda: objects.runs, what="the new leader's run of the due time")
        assert len(objects.runs) == 1 and consulted[-1] is not None
    finally:
        for task in (looping, leading):
            if task is not None:
                task.cancel()
        await asyncio.gather(looping, *([leading] if leading else []), return_exceptions=True)
        await connection.close()
