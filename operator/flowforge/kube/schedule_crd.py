"""The WorkflowSchedule CRD, generated with the others by `python -m flowforge.kube.crdgen`
from the domain's model (`flowforge.domain.schedule`); its status is written by
`operator/schedules.py`."""

from __future__ import annotations

from typing import Any

from flowforge.domain.schedule import KIND, PLURAL, SHORT_NAME, ScheduleSpec
from flowforge.kube.structural import column, crd, resource_schema, to_structural

Schema = dict[str, Any]

_TIME = {"type": "string", "format": "date-time"}


def _time(description: str) -> Schema:
    return {**_TIME, "description": description}


def _of(kind: str, description: str) -> Schema:
    return {"type": kind, "description": description}


_CONDITION = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": _of("string", "Ready, Stalled or Reconciling."),
        "status": {
            **_of("string", "True, False or Unknown."),
            "enum": ["True", "False", "Unknown"],
        },
        "reason": _of("string", "Why, in CamelCase."),
        "message": _of("string", "Why, for people."),
        "lastTransitionTime": _time("When the status last changed."),
        "observedGeneration": _of("integer", "The generation this condition is about."),
    },
}
STATUS_SCHEMA: Schema = {
    "type": "object",
    "description": "What the operator last decided; the fires themselves are in PostgreSQL.",
    "properties": {
        "observedGeneration": _of("integer", "The generation of the spec last acted on."),
        "nextFireTimes": {
            "type": "array",
            "description": "The next three nominal times (none while suspended).",
            "items": _TIME,
        },
        "nextFireTime": {**_TIME, "description": "The first of nextFireTimes."},
        "lastFire": {
            "type": "object",
            "description": "The newest fire: its nominal time, its run and the run's phase.",
            "properties": {
                "nominalTime": _time("The nominal time fired."),
                "run": _of("string", "The WorkflowRun it made."),
                "phase": _of("string", "The run's phase (Pending until the store holds it)."),
            },
        },
        "active": {
            "type": "array",
            "description": "This schedule's runs that are not final (a rollback included).",
            "items": {"type": "string"},
        },
        "activeCount": _of("integer", "How many runs are active."),
        "queued": {**_TIME, "description": "The time waiting (Queue, Replace)."},
        "missed": {
            "type": "object",
            "description": "Times not fired, by reason (Overlap, OutsideWindow, Superseded, "
            "TooMany, Replaced).",
            "additionalProperties": {"type": "integer"},
        },
        "timeZone": _of("string", "The zone the times are computed in."),
        "lastTrigger": _of(
            "string", "The flowforge.io/trigger annotation's token last fired (manual trigger)."
        ),
        "tzdataVersion": {"type": "string", "description": "The IANA database in use."},
        "conditions": {
            "type": "array",
            "description": "Ready, Stalled (the schedule itself cannot fire), Reconciling.",
            "items": _CONDITION,
        },
    },
}


def workflow_schedule_crd() -> Schema:
    schema = resource_schema(
        kind=KIND,
        description="Runs a workflow by the clock: one WorkflowRun per nominal time of a cron "
        "expression in a time zone (or an interval), each time exactly once.",
        spec=to_structural(ScheduleSpec.model_json_schema(by_alias=True)),
        status=STATUS_SCHEMA,
    )
    columns = [
        column("Schedule", "string", ".spec.schedule", "Cron expression or interval."),
        column("Time Zone", "string", ".spec.timeZone", "IANA zone of the expression."),
        column("Suspended", "boolean", ".spec.suspend", "Whether firing is suspended."),
        column("Last Fire", "date", ".status.lastFire.nominalTime", "The newest fired time."),
        column("Next Fire", "string", ".status.nextFireTime", "The next nominal time."),
        column("Active", "integer", ".status.activeCount", "Runs not final."),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ]
    return crd(kind=KIND, plural=PLURAL, short_name=SHORT_NAME, schema=schema, columns=columns)
