"""A run's trace, built from what the store recorded: one span tree per run.

The tree is run -> task -> attempt for the forward tasks, run -> rollback -> compensator ->
attempt for the saga and run -> finally task -> attempt for ``finally``, each span opened
and closed at the times of the run's history events (``flowforge_event.recorded_at``):
nothing is held open in memory, so the operator that finishes a run (or the one that took
over) builds the same tree from the same rows.
Trace and span ids are derived from the run's uid (and the creator's ``traceparent``, when the
run carries one), so emitting a run twice sends the same ids, and a Job's ``TRACEPARENT`` names
its attempt's span before that span is emitted.

Attribute names follow OpenTelemetry's CICD semantic conventions where they have one
(``cicd.pipeline.*``); FlowForge's own are under ``flowforge.*``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from flowforge.domain.history import EventKind
from flowforge.domain.states import RunPhase, TaskRole

# the annotation by which a run's creator hands it its own trace context (W3C traceparent)
TRACEPARENT_ANNOTATION = "flowforge.io/traceparent"
TRACEPARENT_ENV = "TRACEPARENT"

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

AttributeValue = str | int | bool


class HistoryRow(Protocol):
    """A row of a run's event history (``store/events.py::Event``)."""

    @property
    def kind(self) -> str: ...
    @property
    def task_key(self) -> str | None: ...
    @property
    def attempt(self) -> int | None: ...
    @property
    def recorded_at(self) -> datetime: ...
    @property
    def detail(self) -> Mapping[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class TraceContext:
    trace_id: str  # 32 lowercase hex digits
    parent_span_id: str | None  # the creator's span, when the run joined its trace


@dataclasses.dataclass(frozen=True)
class SpanRecord:
    name: str
    span_id: str  # 16 lowercase hex digits
    parent_id: str | None  # None: the run's span, under the creator's span if any
    start: datetime
    end: datetime
    attributes: Mapping[str, AttributeValue]
    error: str | None = None  # the span's status is ERROR with this description
    server: bool = False  # the run's span (kind SERVER, as the CICD conventions say)


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What the trace says about a run besides its history."""

    namespace: str
    name: str
    uid: str
    workflow: str
    version: int
    phase: RunPhase
    traceparent: str | None = None  # the run's flowforge.io/traceparent annotation


def parse_traceparent(text: str | None) -> tuple[str, str] | None:
    """(trace id, span id) of a W3C ``traceparent`` (version 00), or None when malformed."""
    match = _TRACEPARENT.match((text or "").strip())
    if match is None or match[1] == "ff":
        return None
    trace_id, span_id = match[2], match[3]
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def trace_context(*, uid: str, traceparent: str | None) -> TraceContext:
    """The run's trace: its creator's when it carries a valid traceparent, else one of its
    own derived from its uid."""
    parent = parse_traceparent(traceparent)
    if parent is not None:
        return TraceContext(trace_id=parent[0], parent_span_id=parent[1])
    trace_id = _digest("flowforge-trace", uid)[:32]
    return TraceContext(trace_id=trace_id, parent_span_id=None)


def span_id(uid: str, *path: str) -> str:
    """The id of the span at ``path`` of the run's tree (never all zeros)."""
    digest = _digest("flowforge-span", uid, *path)
    return digest[:16] if digest[:16] != "0" * 16 else digest[16:32]


# a task's branch of the run's tree, in span paths and names
_BRANCH = {
    TaskRole.FORWARD: "task",
    TaskRole.COMPENSATION: "compensator",
    TaskRole.FINALLY: "finally",
}


def _attempt_path(role: TaskRole, task_key: str, attempt: int) -> tuple[str, ...]:
    return (_BRANCH[role], task_key, str(attempt))


def attempt_traceparent(
    *, uid: str, traceparent: str | None, role: TaskRole, task_key: str, attempt: int
) -> str:
    """The ``TRACEPARENT`` of an attempt's Job: its attempt's span (sampled)."""
    context = trace_context(uid=uid, traceparent=traceparent)
    return f"00-{context.trace_id}-{span_id(uid, *_attempt_path(role, task_key, attempt))}-01"


_RUN_RESULT = {
    RunPhase.SUCCEEDED: "success",
    RunPhase.FAILED: "failure",
    RunPhase.CANCELLED: "cancellation",
}
_ATTEMPT_END = {
    EventKind.TASK_SUCCEEDED: "success",
    EventKind.TASK_ATTEMPT_FAILED: "failure",
    EventKind.TASK_FAILED: "failure",
    EventKind.COMPENSATION_SUCCEEDED: "success",
    EventKind.COMPENSATION_ATTEMPT_FAILED: "failure",
    EventKind.COMPENSATION_FAILED: "failure",
    EventKind.FINALLY_SUCCEEDED: "success",
    EventKind.FINALLY_ATTEMPT_FAILED: "failure",
    EventKind.FINALLY_FAILED: "failure",
}
_ATTEMPT_START = (
    EventKind.TASK_DISPATCHED,
    EventKind.COMPENSATION_STARTED,
    EventKind.FINALLY_STARTED,
    EventKind.TASK_JOB_CREATED,
)
_TASK_END = {
    EventKind.TASK_SUCCEEDED: "success",
    EventKind.TASK_FAILED: "failure",
    EventKind.TASK_SKIPPED: "skip",
    EventKind.TASK_CANCELLED: "cancellation",
    EventKind.TASK_REUSED: "success",
    EventKind.COMPENSATION_SUCCEEDED: "success",
    EventKind.COMPENSATION_FAILED: "failure",
    EventKind.COMPENSATION_SKIPPED: "skip",
    EventKind.FINALLY_SUCCEEDED: "success",
    EventKind.FINALLY_FAILED: "failure",
    EventKind.FINALLY_SKIPPED: "skip",
}
_COMPENSATION_KINDS = frozenset(kind for kind in EventKind if kind.startswith("compensation."))
_FINALLY_KINDS = frozenset(kind for kind in EventKind if kind.startswith("finally."))


@dataclasses.dataclass
class _Attempt:
    start: datetime
    end: datetime | None = None
    result: str | None = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Task:
    role: TaskRole
    first: datetime  # its first event (released, dispatched, triggered)
    attempts: dict[int, _Attempt] = dataclasses.field(default_factory=dict)
    end: datetime | None = None
    result: str | None = None


def _collect(events: Sequence[HistoryRow]) -> dict[tuple[TaskRole, str], _Task]:
    # a compensator's Job is recorded as task.job_created too: a key is a compensator's when
    # any compensation.* event names it (keys are unique across both roles)
    compensators = {e.task_key for e in events if e.kind in _COMPENSATION_KINDS}
    finals = {e.task_key for e in events if e.kind in _FINALLY_KINDS}
    tasks: dict[tuple[TaskRole, str], _Task] = {}
    for event in events:
        if event.task_key is None or not event.kind.startswith(
            ("task.", "compensation.", "finally.")
        ):
            continue
        role = (
            TaskRole.COMPENSATION
            if event.task_key in compensators
            else TaskRole.FINALLY
            if event.task_key in finals
            else TaskRole.FORWARD
        )
        task = tasks.setdefault((role, event.task_key), _Task(role=role, first=event.recorded_at))
        attempt = event.attempt
        if attempt is not None and event.kind in _ATTEMPT_START:
            task.attempts.setdefault(attempt, _Attempt(start=event.recorded_at))
        if attempt is not None and event.kind in _ATTEMPT_END:
            found = task.attempts.setdefault(attempt, _Attempt(start=event.recorded_at))
            found.end, found.result = event.recorded_at, _ATTEMPT_END[EventKind(event.kind)]
            found.detail = event.detail
        if event.kind in _TASK_END:
            task.end, task.result = event.recorded_at, _TASK_END[EventKind(event.kind)]
    return tasks


def _first(events: Sequence[HistoryRow], kind: EventKind) -> datetime | None:
    return next((event.recorded_at for event in events if event.kind == kind), None)


def run_spans(run: RunFacts, events: Sequence[HistoryRow]) -> tuple[TraceContext, list[SpanRecord]]:
    """The run's span tree from its history, parents before children, in recorded order.
    Tasks that never ran an attempt (skipped, cancelled while waiting) have no span."""
    context = trace_context(uid=run.uid, traceparent=run.traceparent)
    if not events:
        return context, []
    run_start = _first(events, EventKind.RUN_CREATED) or events[0].recorded_at
    run_end = _first(events, EventKind.run_finished(run.phase)) or events[-1].recorded_at
    uid = run.uid
    base: dict[str, AttributeValue] = {
        "cicd.pipeline.name": run.workflow,
        "cicd.pipeline.run.id": uid,
        "k8s.namespace.name": run.namespace,
        "flowforge.run.name": run.name,
        "flowforge.workflow.version": run.version,
    }
    result = _RUN_RESULT.get(run.phase, "error")
    run_id = span_id(uid, "run")
    spans = [
        SpanRecord(
            name=f"RUN {run.workflow}",
            span_id=run_id,
            parent_id=None,
            start=run_start,
            end=run_end,
            attributes={
                **base,
                "cicd.pipeline.action.name": "RUN",
                "cicd.pipeline.result": result,
                "flowforge.run.phase": run.phase.value,
            },
            error=None if run.phase is RunPhase.SUCCEEDED else f"the run ended {run.phase.value}",
            server=True,
        )
    ]
    tasks = _collect(events)
    rollback_start = _first(events, EventKind.RUN_COMPENSATING)
    rollback_id = span_id(uid, "rollback")
    compensators = [
        (key, task) for (role, key), task in tasks.items() if role is TaskRole.COMPENSATION
    ]
    ran = [(key, task) for key, task in compensators if task.attempts]
    if rollback_start is not None:
        spans.append(
            SpanRecord(
                name="rollback",
                span_id=rollback_id,
                parent_id=run_id,
                start=rollback_start,
                end=max(run_end, rollback_start),  # the run ends when its rollback settles
                attributes={**base, "flowforge.rollback.compensators": len(ran)},
                error=next(
                    (f"compensator {key} failed" for key, t in ran if t.result == "failure"), None
                ),
            )
        )
    for (role, key), task in tasks.items():
        if not task.attempts:
            continue
        if role is TaskRole.COMPENSATION and rollback_start is None:
            continue
        spans.extend(
            _task_spans(
                uid=uid,
                base=base,
                key=key,
                task=task,
                parent=rollback_id if role is TaskRole.COMPENSATION else run_id,
                run_end=run_end,
            )
        )
    return context, spans


def _task_spans(
    *,
    uid: str,
    base: Mapping[str, AttributeValue],
    key: str,
    task: _Task,
    parent: str,
    run_end: datetime,
) -> list[SpanRecord]:
    branch = _BRANCH[task.role]
    task_id = span_id(uid, branch, key)
    first_attempt = min(attempt.start for attempt in task.attempts.values())
    # a forward task from its release (its wait for a slot included); a compensator from
    # its turn, so the rollback's steps show in the order they ran
    start = min(task.first, first_attempt) if task.role is TaskRole.FORWARD else first_attempt
    end = task.end or max(a.end or run_end for a in task.attempts.values())
    result = task.result or "cancellation"
    task_attributes: dict[str, AttributeValue] = {
        **base,
        "cicd.pipeline.task.name": key,
        "cicd.pipeline.task.run.id": f"{uid}/{branch}/{key}",
        "cicd.pipeline.task.run.result": result,
        "flowforge.task.role": task.role.value,
        "flowforge.task.attempts": len(task.attempts),
    }
    spans = [
        SpanRecord(
            name={
                TaskRole.FORWARD: key,
                TaskRole.COMPENSATION: f"compensate {key}",
                TaskRole.FINALLY: f"finally {key}",
            }[task.role],
            span_id=task_id,
            parent_id=parent,
            start=start,
            end=max(end, first_attempt),
            attributes=task_attributes,
            error=f"{key}: {result}" if result == "failure" else None,
        )
    ]
    for number in sorted(task.attempts):
        attempt = task.attempts[number]
        attempt_end = attempt.end or end
        attempt_result = attempt.result or "cancellation"
        detail = attempt.detail
        attributes: dict[str, AttributeValue] = {
            **base,
            "cicd.pipeline.task.name": key,
            "cicd.pipeline.task.run.id": f"{uid}/{branch}/{key}/{number}",
            "cicd.pipeline.task.run.result": attempt_result,
            "flowforge.task.role": task.role.value,
            "flowforge.attempt": number,
        }
        if detail.get("exitCode") is not None:
            attributes["process.exit.code"] = int(detail["exitCode"])
        if detail.get("reason"):
            attributes["flowforge.outcome.reason"] = str(detail["reason"])
        spans.append(
            SpanRecord(
                name=f"{key} attempt {number}",
                span_id=span_id(uid, *_attempt_path(task.role, key, number)),
                parent_id=task_id,
                start=attempt.start,
                end=max(attempt_end, attempt.start),
                attributes=attributes,
                error=(
                    f"{detail.get('reason') or 'failed'}: {detail.get('message') or ''}".strip()
                    if attempt_result == "failure"
                    else None
                ),
            )
        )
    return spans
