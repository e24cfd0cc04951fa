"""``GET .../namespaces/{ns}/schedules`` and ``.../schedules/{name}``: WorkflowSchedules.

The store holds what the operator decided for each schedule object (its fires and the runs
they made, the times missed and waiting: ``store/schedule_reads.py``), but none of the
object's spec (workflow, expression, time zone, suspend) nor the next times its status shows.
Those are read from the object itself, with the caller's own token, as logs are: the
apiserver judges that read too, and the server's own credentials read nothing more. The
caller needs ``list`` (the list) or ``get`` (one) ``workflowschedules``, checked with a
SubjectAccessReview before the store is read, and for a schedule's runs also ``list
workflowruns``. A schedule deleted is not listed (its runs stay in the run list); the store's
rows are read only for the objects' uids, so a namespace re-created under its name never
shows its predecessor's schedules.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from flowforge.server import access, models, views
from flowforge.server.routes import (
    DNS_LABEL,
    ERRORS,
    MAX_LIMIT,
    Authenticated,
    Namespace,
    State,
    cursor_before,
    json_of,
    next_cursor,
)
from flowforge.store.schedule_reads import FireRow, ScheduleRow, schedule_fires, schedule_rows

router = APIRouter(prefix="/api/v1", responses=ERRORS)

ScheduleName = Annotated[
    str, Path(pattern=DNS_LABEL, max_length=63, description="a WorkflowSchedule")
]


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _conditions(status: Mapping[str, Any]) -> list[models.Condition]:
    conditions = status.get("conditions")
    return [
        models.Condition(
            type=str(condition.get("type") or ""),
            status=str(condition.get("status") or "Unknown"),
            reason=str(condition.get("reason") or ""),
            message=str(condition.get("message") or ""),
            last_transition_time=_time(condition.get("lastTransitionTime")),
        )
        for condition in (conditions if isinstance(conditions, list) else [])
        if isinstance(condition, Mapping)
    ]


def summary(body: Mapping[str, Any], row: ScheduleRow | None) -> models.ScheduleSummary:
    """The object's spec and next times, and the store's record of what it fired."""
    metadata, spec = _mapping(body.get("metadata")), _mapping(body.get("spec"))
    status = _mapping(body.get("status"))
    version = spec.get("version")
    upcoming = status.get("nextFireTimes")
    return models.ScheduleSummary(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        workflow=str(spec.get("workflow") or ""),
        version=version if isinstance(version, int) else None,
        schedule=str(spec.get("schedule") or ""),
        time_zone=str(spec.get("timeZone") or "UTC"),
        suspended=spec.get("suspend") is True,
        overlap_policy=str(spec.get("overlapPolicy") or "Skip"),
        next_fire_times=[
            instant
            for instant in map(_time, upcoming if isinstance(upcoming, list) else [])
            if instant is not None
        ],
        conditions=_conditions(status),
        created_at=_time(metadata.get("creationTimestamp")),
        last_fire=None
        if row is None or row.last is None
        else models.LastFire(
            nominal_time=row.last.nominal_time, run=row.last.run_name, phase=row.last.phase
        ),
        active=[] if row is None else list(row.active),
        missed={} if row is None else dict(row.missed),
        queued=None if row is None else row.queued,
    )


def _scheduled_run(fire: FireRow) -> models.ScheduledRun:
    return models.ScheduledRun(
        nominal_time=fire.nominal_time,
        name=fire.run_name,
        backfill=fire.backfill,
        manual=fire.manual,
        fired_at=fire.fired_at,
        run=None if fire.run is None else views.summary(fire.run),
    )


@router.get("/namespaces/{namespace}/schedules", response_model=models.ScheduleList)
async def list_schedules(
    caller: Authenticated, state: State, namespace: Namespace
) -> models.ScheduleList:
    """The namespace's WorkflowSchedules by name (at most 500)."""
    await state.authorizer.require(caller, namespace=namespace, permission=access.LIST_SCHEDULES)
    objects = await state.user_api.list_schedules(token=caller.token, namespace=namespace)
    uids = [str(_mapping(body.get("metadata")).get("uid") or "") for body in objects]
    async with state.reader([namespace]) as connection:
        rows = await schedule_rows(connection, namespace=namespace, uids=uids)
    return models.ScheduleList(
        items=[summary(body, rows.get(uid)) for body, uid in zip(objects, uids, strict=True)]
    )


@router.get("/namespaces/{namespace}/schedules/{name}", response_model=models.ScheduleDetail)
async def schedule_detail(
    caller: Authenticated,
    state: State,
    namespace: Namespace,
    name: ScheduleName,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    continue_: Annotated[str | None, Query(alias="continue", max_length=256)] = None,
) -> Response:
    """One WorkflowSchedule and the runs it made, newest fire first (``continue``: the
    next page, as for the run list)."""
    before = cursor_before(continue_)
    await state.authorizer.require(caller, namespace=namespace, permission=access.GET_SCHEDULES)
    await state.authorizer.require(caller, namespace=namespace, permission=access.LIST_RUNS)
    body = await state.user_api.get_schedule(token=caller.token, namespace=namespace, name=name)
    uid = str(_mapping(body.get("metadata")).get("uid") or "")
    async with state.reader([namespace]) as connection:
        rows = await schedule_rows(connection, namespace=namespace, uids=[uid])
        fires = await schedule_fires(
            connection, namespace=namespace, name=name, uid=uid, before=before, limit=limit + 1
        )
    more = len(fires) > limit
    fires = fires[:limit]
    detail = models.ScheduleDetail(
        **summary(body, rows.get(uid)).model_dump(),
        runs=[_scheduled_run(fire) for fire in fires],
        continue_=next_cursor(fires[-1].id) if more else None,
    )
    return json_of(detail)
