"""The ``WorkflowSchedule`` kind: its spec, as the document spells it (camelCase aliases).

A schedule runs a workflow by the clock, each nominal time exactly once. The times are
computed by ``schedule_times.py``, the decision what to fire by ``schedule_decision.py``;
this module holds only the shape and the rules that one field alone decides (a cron
expression that parses, an interval of at least 10 s, a zone the ``tzdata`` package knows).
Errors name the field in Kubernetes style (``spec.schedule``).
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from flowforge.domain.schedule_times import (
    ScheduleExpressionError,
    TimeZoneError,
    parse_expression,
    zone_named,
)

_MODEL_CONFIG = ConfigDict(
    frozen=True,
    populate_by_name=True,
    alias_generator=to_camel,
    extra="forbid",
)

KIND = "WorkflowSchedule"
PLURAL = "workflowschedules"
SHORT_NAME = "wfs"
# a derived run name appends "-" and 12 digits (14 for @every): keep it a DNS-1123 label
MAX_NAME_LENGTH = 63 - 15
MAX_BACKFILLS = 20
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class OverlapPolicy(enum.StrEnum):
    SKIP = "Skip"
    ALLOW = "Allow"
    QUEUE = "Queue"
    REPLACE = "Replace"


class CatchupMode(enum.StrEnum):
    LATEST = "Latest"
    ALL = "All"


class Catchup(BaseModel):
    """What to fire of the times missed (downtime, suspension): those inside the window."""

    model_config = _MODEL_CONFIG

    window_seconds: int = Field(
        default=3600, ge=10, le=366 * 86400, description="How far back a missed time is owed."
    )
    mode: CatchupMode = Field(
        default=CatchupMode.LATEST,
        description="Latest: the newest missed time; All: each, oldest first, at most 100.",
    )


class Backfill(BaseModel):
    """Fire every nominal time in ``[from, to]``, processed once by ``id``."""

    model_config = _MODEL_CONFIG

    id: str = Field(
        min_length=1, max_length=63, description="Processed once: a new range needs a new id."
    )
    from_: datetime = Field(alias="from", description="The first instant (RFC 3339).")
    to: datetime = Field(description="The last instant (RFC 3339), inclusive.")

    @field_validator("id")
    @classmethod
    def _label(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be a DNS-1123 label")
        return value

    @field_validator("from_", "to")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("must carry a zone offset (RFC 3339, e.g. 2026-07-01T00:00:00Z)")
        return value


class History(BaseModel):
    """How many finished WorkflowRun objects to keep (PostgreSQL keeps every run)."""

    model_config = _MODEL_CONFIG

    succeeded: int = Field(default=3, ge=0, le=100, description="Succeeded runs kept.")
    failed: int = Field(default=3, ge=0, le=100, description="Failed or Cancelled runs kept.")


class ScheduleSpec(BaseModel):
    """A ``WorkflowSchedule``'s ``spec``; field names are the contract of issue 28."""

    model_config = _MODEL_CONFIG

    workflow: str = Field(min_length=1, max_length=63, description="The workflow to run.")
    version: int | None = Field(
        default=None,
        ge=1,
        description="The definition version; unset: the newest published at each fire, "
        "recorded on the run.",
    )
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="The runs' parameters, checked against the definition's declarations.",
    )
    schedule: str = Field(
        min_length=1,
        max_length=200,
        description="A 5-field cron expression (minute hour day month weekday) in timeZone, "
        "or '@every N' with N in s, m or h (at least 10 s).",
    )
    time_zone: str = Field(
        default="UTC",
        description="IANA zone of the cron expression. A wall time that occurs twice fires "
        "once (its first occurrence); one that does not exist fires at the next valid instant.",
    )
    overlap_policy: OverlapPolicy = Field(
        default=OverlapPolicy.SKIP,
        description="While a run made by this schedule is not final (rollback included): "
        "Skip (count it missed), Allow, Queue (keep one waiting), Replace (cancel it, start "
        "after its rollback settled).",
    )
    catchup: Catchup = Field(
        default_factory=Catchup,
        description="Times missed (downtime, suspension) inside windowSeconds: Latest fires "
        "the newest, All each (oldest first, at most 100).",
    )
    suspend: bool = Field(default=False, description="Fire nothing until set false again.")
    backfills: tuple[Backfill, ...] = Field(
        default=(),
        max_length=MAX_BACKFILLS,
        description="Ranges of past times to fire, each time once, each backfill once by id.",
    )
    history: History = Field(
        default_factory=History,
        description="Finished WorkflowRun objects kept (PostgreSQL keeps every run).",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError("must be a DNS-1123 label")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        parse_expression(value)  # ScheduleExpressionError is a ValueError
        return value

    @field_validator("time_zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone_named(value)  # TimeZoneError is a ValueError
        return value

    @field_validator("backfills")
    @classmethod
    def _backfills(cls, value: tuple[Backfill, ...]) -> tuple[Backfill, ...]:
        ids = [backfill.id for backfill in value]
        for index, backfill in enumerate(value):
            if ids.index(backfill.id) != index:
                raise ValueError(f"backfill id {backfill.id!r} appears twice")
            if backfill.to < backfill.from_:
                raise ValueError(f"backfill {backfill.id!r}: 'to' is before 'from'")
        return value


class ScheduleSpecError(ValueError):
    """A refused schedule spec; ``field`` names where, Kubernetes style."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _field_path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += "." + ("from" if part == "from_" else str(part))
    return path


def parse_schedule_spec(document: Any) -> ScheduleSpec:
    """Read a ``spec`` document; the first error names its field (``spec.timeZone``)."""
    if not isinstance(document, dict):
        raise ScheduleSpecError("spec", "must be an object")
    try:
        return ScheduleSpec.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, (ScheduleExpressionError, TimeZoneError)):
            message = str(cause)
        else:
            message = first["msg"].removeprefix("Value error, ")
        raise ScheduleSpecError(_field_path(tuple(first["loc"])), message) from None


def check_schedule_name(name: str) -> None:
    """A schedule's name leaves room for the derived run names' suffix."""
    if len(name) > MAX_NAME_LENGTH:
        raise ScheduleSpecError(
            "metadata.name",
            f"must be at most {MAX_NAME_LENGTH} characters (run names append the nominal time)",
        )
