"""The schedule controller: each WorkflowSchedule's nominal times become WorkflowRuns, once.

Every operator keeps the schedules it sees (``observe``, from the watch); only the leader
acts. A pass over a schedule is one store transaction (``store/schedules.fire_due``: the
decision of ``domain/schedule_decision.py`` on the database's clock, its fires recorded
under a unique constraint), then the Kubernetes calls it implies: create the run of each
fire not yet created (named by its nominal time, owned by the schedule; AlreadyExists of
its own is success, and the store then records the object so it is never made again),
cancel the active runs under ``Replace``, a Warning Event ``TooManyMissedSchedules`` for
times dropped beyond 100, and the status (patched only when it changed). The loop sleeps
until the earliest next nominal time (at most ``max_sleep``), a watch event, or the moment
this operator gains the lease (``wake``).

A manual trigger is the annotation ``flowforge.io/trigger`` set to a new token (``flowforge
schedule trigger``); it fires at the database's now under the overlap policy, once per token
(``status.lastTrigger``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from flowforge.domain.api import PREFIX
from flowforge.domain.schedule import ScheduleSpec, ScheduleSpecError, parse_schedule_spec
from flowforge.domain.schedule_times import (
    TZDATA_VERSION,
    next_times,
    parse_expression,
    zone_named,
)
from flowforge.kube.schedule_objects import NOMINAL_TIME_ANNOTATION, ScheduleObjects, run_manifest
from flowforge.operator.failures import Failures
from flowforge.operator.metrics import REGISTRY
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions
from flowforge.store.lease import Fence
from flowforge.store.schedules import ScheduleFiring, ScheduleKey, fire_due, mark_created

logger = logging.getLogger("flowforge.operator.schedules")

TRIGGER_ANNOTATION = f"{PREFIX}/trigger"
REQUESTED_BY_ANNOTATION = f"{PREFIX}/requested-by"
MISSED = Counter(
    "flowforge_schedule_missed_total",
    "Nominal times a WorkflowSchedule did not fire, by reason",
    ["reason"],
    registry=REGISTRY,
)
FIRED = Counter("flowforge_schedule_fired_total", "Runs WorkflowSchedules made", registry=REGISTRY)


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _created_at(body: Mapping[str, Any]) -> datetime:
    stamp = body["metadata"].get("creationTimestamp")
    if isinstance(stamp, str):
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return datetime.now(UTC)


def _condition(
    kind: str, status: bool, reason: str, message: str, generation: Any
) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def schedule_status(
    body: Mapping[str, Any], spec: ScheduleSpec, firing: ScheduleFiring, trigger: str | None
) -> dict[str, Any]:
    """The status a pass shows: the schedule's own health, and the last run's beside it."""
    generation = body["metadata"].get("generation")
    expression = parse_expression(spec.schedule)
    zone = zone_named(spec.time_zone)
    upcoming = [] if spec.suspend else next_times(expression, zone, firing.now, 3)
    last = firing.last
    reason, message = (
        ("Suspended", "spec.suspend is true")
        if spec.suspend
        else (
            "Scheduled",
            f"next fire {_time(upcoming[0]) if upcoming else 'none'}",
        )
    )
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "nextFireTimes": [_time(instant) for instant in upcoming],
        "nextFireTime": _time(upcoming[0]) if upcoming else None,
        "lastFire": None
        if last is None
        else {
            "nominalTime": _time(last.nominal_time),
            "run": last.run_name,
            "phase": last.phase or "Pending",
        },
        "active": list(firing.active),
        "activeCount": len(firing.active),
        "queued": _time(firing.queued),
        "missed": dict(firing.missed),
        "timeZone": spec.time_zone,
        "tzdataVersion": TZDATA_VERSION,
        "conditions": [
            _condition("Ready", True, reason, message, generation),
            _condition("Stalled", False, reason, message, generation),
        ],
    }
    if trigger is not None:
        status["lastTrigger"] = trigger
    return status


def stalled_status(body: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
    """The schedule itself cannot fire (its spec, its workflow): nothing fires until fixed;
    the times missed meanwhile follow ``spec.catchup``."""
    generation = body["metadata"].get("generation")
    return {
        "observedGeneration": generation,
        "nextFireTimes": [],
        "nextFireTime": None,
        "tzdataVersion": TZDATA_VERSION,
        "conditions": [
            _condition("Ready", False, reason, message, generation),
            _condition("Stalled", True, reason, message, generation),
        ],
    }


async def _stall_reason(pool: Pool, namespace: str, spec: ScheduleSpec) -> tuple[str, str] | None:
    versions = await list_versions(pool, namespace=namespace, workflow=spec.workflow)
    if not versions:
        return "WorkflowNotFound", (
            f"workflow {spec.workflow!r} has no published version in namespace {namespace!r}"
        )
    if spec.version is not None and spec.version not in versions:
        return "VersionNotFound", (
            f"workflow {spec.workflow!r} version {spec.version} is not published in "
            f"namespace {namespace!r}"
        )
    return None


def runs_beyond_history(made: list[dict[str, Any]], spec: ScheduleSpec) -> list[dict[str, Any]]:
    """The finished runs past ``spec.history`` (succeeded, and failed or cancelled), oldest
    nominal times first; active runs are never among them."""
    keep = {"Succeeded": spec.history.succeeded, "Failed": spec.history.failed}
    finished: dict[str, list[dict[str, Any]]] = {"Succeeded": [], "Failed": []}
    for run in made:
        phase = (run.get("status") or {}).get("phase")
        if phase in ("Failed", "Cancelled"):
            finished["Failed"].append(run)
        elif phase == "Succeeded":
            finished["Succeeded"].append(run)
    beyond: list[dict[str, Any]] = []
    for outcome, runs in finished.items():
        runs.sort(
            key=lambda run: (run["metadata"].get("annotations") or {}).get(
                NOMINAL_TIME_ANNOTATION, ""
            ),
            reverse=True,
        )
        beyond.extend(runs[keep[outcome] :])
    return beyond


class ScheduleController:
    def __init__(
        self,
        *,
        pool: Pool,
        objects: ScheduleObjects,
        fence: Callable[[], Fence | None],
        failures: Failures,
        max_sleep: float = 5.0,
    ) -> None:
        self._pool = pool
        self._objects = objects
        self._fence = fence
        self._failures = failures
        self._max_sleep = max_sleep
        self._bodies: dict[str, Mapping[str, Any]] = {}
        self._wake = asyncio.Event()

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event: keep the newest object of each schedule, drop a deleted one."""
        uid = body.get("metadata", {}).get("uid")
        if not isinstance(uid, str):
            return
        if event_type == "DELETED":
            self._bodies.pop(uid, None)
        else:
            self._bodies[uid] = body
        self.wake()

    def wake(self) -> None:
        """A pass now, not at the next nominal time: a schedule changed, or this operator
        just became the leader (a standby's loop acts on nothing, so it would otherwise
        sleep up to ``max_sleep`` past a takeover)."""
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            # cleared before the pass: a wake during it makes another pass at once
            self._wake.clear()
            sleep = self._max_sleep
            if self._fence() is not None:
                for body in list(self._bodies.values()):
                    due_in = await self._guarded(body)
                    if due_in is not None:
                        sleep = min(sleep, due_in)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.05, sleep))

    async def _guarded(self, body: Mapping[str, Any]) -> float | None:
        result: list[float | None] = [None]

        async def act() -> None:
            result[0] = await self.reconcile(body)

        name = (
            f"WorkflowSchedule {body['metadata'].get('namespace')}/{body['metadata'].get('name')}"
        )
        await self._failures.guard(act(), what=name)
        return result[0]

    async def reconcile(self, body: Mapping[str, Any]) -> float | None:
        """One pass over a schedule; the seconds until its next nominal time."""
        fence = self._fence()
        if fence is None:
            return None
        metadata = body["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        current = body.get("status") or {}
        try:
            spec = parse_schedule_spec(body.get("spec"))
        except ScheduleSpecError as error:
            await self._stalled(body, current, "InvalidSpec", str(error))
            return None
        stall = await _stall_reason(self._pool, namespace, spec)
        if stall is not None:
            await self._stalled(body, current, *stall)
            return None
        token = (metadata.get("annotations") or {}).get(TRIGGER_ANNOTATION)
        trigger = isinstance(token, str) and token != current.get("lastTrigger")
        firing = await fire_due(
            self._pool,
            fence=fence,
            key=ScheduleKey(namespace=namespace, name=name, uid=metadata["uid"]),
            spec=spec,
            created_at=_created_at(body),
            trigger=trigger,
        )
        await self._act(body, spec, firing, fence)
        status = schedule_status(body, spec, firing, token if trigger else None)
        if any(current.get(key) != value for key, value in status.items()):
            # a fire, or a run's phase moved: the moments the history may have grown
            await self._prune_history(namespace, name, spec)
            await self._objects.patch_status(namespace=namespace, name=name, status=status)
        if spec.suspend or not status["nextFireTimes"]:
            return None
        upcoming = datetime.fromisoformat(status["nextFireTimes"][0].replace("Z", "+00:00"))
        return max(0.0, (upcoming - firing.now).total_seconds())

    async def _stalled(
        self, body: Mapping[str, Any], current: Mapping[str, Any], reason: str, message: str
    ) -> None:
        status = stalled_status(body, reason, message)
        if any(current.get(key) != value for key, value in status.items()):
            metadata = body["metadata"]
            await self._objects.patch_status(
                namespace=metadata["namespace"], name=metadata["name"], status=status
            )

    async def _prune_history(self, namespace: str, name: str, spec: ScheduleSpec) -> None:
        """Keep ``spec.history`` finished WorkflowRun objects of each outcome, the newest by
        nominal time; PostgreSQL keeps every run."""
        made = await self._objects.list_runs(namespace=namespace, schedule=name)
        for run in runs_beyond_history(made, spec):
            metadata = run["metadata"]
            await self._objects.delete_run(
                namespace=namespace, name=metadata["name"], uid=metadata["uid"]
            )

    async def _act(
        self, body: Mapping[str, Any], spec: ScheduleSpec, firing: ScheduleFiring, fence: Fence
    ) -> None:
        metadata = body["metadata"]
        namespace = metadata["namespace"]
        author = (metadata.get("annotations") or {}).get(REQUESTED_BY_ANNOTATION)
        for fire in firing.to_create:
            manifest = run_manifest(
                schedule=body,
                run_name=fire.run_name,
                nominal_time=fire.nominal_time,
                version=spec.version,
                parameters=spec.parameters,
                author=author,
                backfill=fire.backfill,
                manual=fire.manual,
            )
            uid = await self._objects.create_run(manifest)
            if uid is None:
                logger.warning(
                    "run %s/%s exists and is not this schedule's", namespace, fire.run_name
                )
                continue
            await mark_created(
                self._pool, fence=fence, namespace=namespace, run_name=fire.run_name, run_uid=uid
            )
            FIRED.inc()
        for run in firing.cancel:
            await self._objects.cancel_run(namespace=namespace, name=run)
        for reason, count in firing.newly_missed.items():
            MISSED.labels(reason).inc(count)
        if firing.too_many:
            await self._objects.warn(
                body,
                reason="TooManyMissedSchedules",
                message=f"{firing.too_many} missed times beyond the 100 a catch-up or backfill "
                "fires were not fired (counted in status.missed.TooMany)",
            )
