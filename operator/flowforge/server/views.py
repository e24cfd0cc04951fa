"""From the store's rows to the API's shapes (``models``): pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from flowforge.domain.execution import attempts_made
from flowforge.domain.expansion import creation_skip_reason
from flowforge.domain.for_each import split_instance
from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.projection import StatusInput, TaskCounts, run_conditions
from flowforge.domain.run import CompensationStep as DomainStep
from flowforge.domain.states import CompensationState, TaskState
from flowforge.server import models
from flowforge.store.browse import ATTEMPT_START_KINDS, RunRow, TaskRow
from flowforge.store.definitions import DefinitionText, StoredDefinition
from flowforge.store.events import Event
from flowforge.store.final_reads import FinalRows
from flowforge.store.queries import TOLERATED

# a run detail lists its tasks only up to this size; above, the graph and per-task reads
DETAIL_TASK_LIMIT = 2000
# a parsed definition with its derived maps holds about this many bytes per byte of its
# JSON text (16.8 MB for a 10,000-task document of 1.0 MB, measured with tracemalloc)
PARSED_BYTES_PER_TEXT_BYTE = 16
# the type an approval gate (a task with ``approval``, no ``type``) is shown with
GATE_TYPE = "approval"


def seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


@dataclass(frozen=True)
class DefinitionView:
    """A published definition with what every read of its runs derives from it."""

    stored: StoredDefinition
    # the length of its document's JSON text
    document_bytes: int = 0

    @classmethod
    def parse(cls, text: DefinitionText) -> DefinitionView:
        """The view of a stored document, everything derived computed now (CPU-heavy for a
        large definition: called off the event loop)."""
        view = cls(text.parsed(), document_bytes=len(text.document))
        derived = ("levels", "level_count", "final_keys", "compensator_of", "planned_rollback")
        for name in derived:
            getattr(view, name)
        return view

    @property
    def spec(self) -> DefinitionSpec:
        return self.stored.spec

    @property
    def size(self) -> int:
        """The bytes it holds, estimated from its text (what a cache weighs it by)."""
        return self.document_bytes * PARSED_BYTES_PER_TEXT_BYTE

    @cached_property
    def levels(self) -> dict[str, int]:
        return {
            key: number for number, level in enumerate(self.spec.graph.levels()) for key in level
        }

    @cached_property
    def level_count(self) -> int:
        return len(self.spec.graph.levels())

    @cached_property
    def final_keys(self) -> frozenset[str]:
        return frozenset(task.key for task in self.spec.finally_tasks)

    @cached_property
    def compensator_of(self) -> dict[str, str]:
        """Forward task -> its compensator's key."""
        return {task: spec.key for task, spec in self.spec.compensators.items()}

    @cached_property
    def planned_rollback(self) -> list[str]:
        """The compensators in the order a rollback of every task would run them."""
        every = self.spec.graph.keys
        return list(self.spec.graph.compensation_order(every, self.compensator_of))


def progress(counts: Mapping[str, int]) -> models.Progress:
    return models.Progress(
        total=counts.get("total", 0),
        succeeded=counts.get(TaskState.SUCCEEDED, 0),
        failed=counts.get(TaskState.FAILED, 0),
        running=counts.get(TaskState.RUNNING, 0),
        waiting=counts.get(TaskState.WAITING, 0),
        skipped=counts.get(TaskState.SKIPPED, 0),
        cancelled=counts.get(TaskState.CANCELLED, 0),
        ready=counts.get(TaskState.READY, 0),
        tolerated=counts.get(TOLERATED, 0),
    )


def summary(run: RunRow) -> models.RunSummary:
    return models.RunSummary(
        namespace=run.namespace,
        name=run.name,
        uid=run.uid,
        workflow=run.workflow,
        version=run.version,
        phase=run.phase.value,
        compensating=run.compensating,
        cancel_requested=run.cancel_requested,
        queue=None,
        progress=progress(run.counts),
        created_at=run.created_at,
        started_at=run.created_at,
        finished_at=run.finished_at,
        duration_seconds=seconds(run.created_at, run.finished_at),
    )


def _task_counts(counts: Mapping[str, int]) -> TaskCounts:
    return TaskCounts(
        total=counts.get("total", 0),
        tolerated=counts.get(TOLERATED, 0),
        **{state.value: counts.get(state, 0) for state in TaskState},
    )


# attempts


def attempt_history(events: Sequence[Event]) -> dict[str, list[models.Attempt]]:
    """Task (or compensator) key -> its attempts, from the events that start, launch and
    finish them (those still running have no outcome yet)."""
    started: dict[tuple[str, int], datetime] = {}
    jobs: dict[tuple[str, int], str] = {}
    done: dict[tuple[str, int], models.Attempt] = {}
    order: list[tuple[str, int]] = []
    for event in events:
        if event.task_key is None or event.attempt is None:
            continue
        key = (event.task_key, event.attempt)
        if key not in started and key not in done:
            order.append(key)
        if event.kind in ATTEMPT_START_KINDS:
            started.setdefault(key, event.recorded_at)
        elif event.kind == EventKind.TASK_JOB_CREATED:
            if isinstance(event.detail.get("job"), str):
                jobs[key] = event.detail["job"]
        elif event.kind in OUTCOME_KINDS:
            detail = event.detail
            exit_code = detail.get("exitCode")
            begin = _parse_time(detail.get("startedAt")) or started.get(key)
            end = _parse_time(detail.get("finishedAt")) or event.recorded_at
            done[key] = models.Attempt(
                number=event.attempt,
                job_name=jobs.get(key),
                state=TaskState.SUCCEEDED
                if event.kind.endswith(".succeeded")
                else TaskState.FAILED,
                exit_code=exit_code if isinstance(exit_code, int) else None,
                reason=_text(detail.get("reason")),
                message=_text(detail.get("message") or detail.get("error")),
                started_at=begin,
                finished_at=end,
                duration_seconds=seconds(begin, end),
            )
    history: dict[str, list[models.Attempt]] = {}
    for key in dict.fromkeys(order):
        attempt = done.get(key) or models.Attempt(
            number=key[1],
            job_name=jobs.get(key),
            state=TaskState.RUNNING,
            exit_code=None,
            reason=None,
            message=None,
            started_at=started.get(key),
            finished_at=None,
            duration_seconds=None,
        )
        history.setdefault(key[0], []).append(attempt)
    return history


def _parse_time(text: object) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _text(value: object) -> str | None:
    return None if value is None else str(value)[:4096]


# tasks


def task_brief(
    definition: DefinitionView,
    row: TaskRow,
    *,
    attempts: Sequence[models.Attempt],
    compensator: TaskRow | None,
) -> models.TaskBrief:
    spec = definition.spec.task_of(row.key)  # a forEach item's row: its task
    compensator_spec = definition.spec.compensators.get(spec.key)
    group, item = split_instance(row.key)
    return models.TaskBrief(
        **_outcome(row, attempts),
        for_each=None if item is None else group,
        item=item,
        type=spec.type or GATE_TYPE,
        depends_on=sorted(spec.depends_on),
        level=definition.levels.get(spec.key, 0),
        compensator=None
        if compensator is None or compensator_spec is None
        else models.CompensatorBrief(
            name=compensator.key, state=compensator.state, type=compensator_spec.type
        ),
    )


def _outcome(row: TaskRow, attempts: Sequence[models.Attempt]) -> dict[str, Any]:
    """A task row's fields every view of a task shows: its state, attempts made, what its
    last attempt said (or why it was skipped when the run was created), its times."""
    last = attempts[-1] if attempts else None
    skipped = row.state == TaskState.SKIPPED
    return {
        "name": row.key,
        "state": row.state,
        "attempts": attempts_made(
            state=row.state, attempt=row.attempt, started=row.started_at is not None
        ),
        "exit_code": last.exit_code if last else None,
        "reason": last.reason
        if last
        else creation_skip_reason(row.last_error if skipped else None),
        "message": (last.message if last else None) or row.last_error,
        "started_at": row.started_at,
        "finished_at": row.finished_at,
        "duration_seconds": seconds(row.started_at, row.finished_at),
    }


def task_briefs(
    definition: DefinitionView,
    rows: Sequence[TaskRow],
    attempts: Mapping[str, Sequence[models.Attempt]],
) -> list[models.TaskBrief]:
    compensators = {row.compensates: row for row in rows if row.compensates is not None}
    return [
        task_brief(
            definition,
            row,
            attempts=attempts.get(row.key, ()),
            compensator=compensators.get(row.key),
        )
        for row in rows
        if row.compensates is None
    ]


def final_tasks(
    definition: DefinitionView,
    rows: FinalRows,
    attempts: Mapping[str, Sequence[models.Attempt]],
) -> models.Finally:
    """The ``finally`` tasks in list order, and the outcome they are (or will be) told."""
    return models.Finally(
        outcome=None if rows.outcome is None else rows.outcome.value,
        rollback=None if rows.rollback is None else rows.rollback.value,
        finalizing=rows.finalizing,
        steps=[
            models.FinalStep(
                **_outcome(row, attempts.get(row.key, ())),
                type=definition.spec.task(row.key).type or "",
                attempt_history=list(attempts.get(row.key, ())),
            )
            for row in rows.steps
        ],
    )


# the rollback


def compensation(
    compensators: Sequence[TaskRow],
    *,
    succeeded: Collection[str],
    starts: Mapping[str, int],
    triggered_by: str | None,
) -> models.Compensation:
    """The rollback's steps in the order they ran, then those still to run in the order they
    will (compensators of tasks that never succeeded are not steps). ``compensators`` are
    the run's compensator rows in topological order, ``succeeded`` its succeeded tasks."""
    compensators = [
        row
        for row in compensators
        if row.compensates in succeeded and row.state != CompensationState.NOT_TRIGGERED
    ]
    last = max(starts.values(), default=0) + 1
    ordered = [
        row
        for _, row in sorted(
            enumerate(reversed(compensators)),
            key=lambda item: (starts.get(item[1].key, last), item[0]),
        )
    ]
    steps = [
        models.CompensationStep(
            order=number,
            task=str(row.compensates),
            compensator=row.key,
            state=row.state,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )
        for number, row in enumerate(ordered, start=1)
    ]
    failed = next((row.key for row in ordered if row.state == CompensationState.FAILED), None)
    active = any(
        row.state in (CompensationState.PENDING, CompensationState.RUNNING) for row in ordered
    )
    state: str = "NotTriggered"
    if failed is not None:
        state = "Halted"
    elif active:
        state = "Running"
    elif steps:
        state = "Completed"
    return models.Compensation(
        state=state,
        halted_by=failed,
        triggered_by=triggered_by if steps else None,
        steps=steps,
    )


def conditions(
    run: RunRow, rollback: models.Compensation, *, failure: str | None = None
) -> list[models.Condition]:
    """The run's conditions by the rules ``WorkflowRun.status`` is projected with."""
    status = StatusInput(
        phase=run.phase,
        counts=_task_counts(run.counts),
        fingerprint="",
        started_at=run.created_at,
        finished_at=run.finished_at,
        now=datetime.now(UTC),
        cancel_requested=run.cancel_requested,
        failure_message=failure,
        compensating=run.compensating,
        compensation=[
            DomainStep(
                name=step.compensator,
                compensates=step.task,
                state=CompensationState(step.state),
            )
            for step in rollback.steps
        ],
        rollback_started_at=rollback.steps[0].started_at if rollback.steps else None,
        rollback_halted_at=next(
            (s.finished_at for s in rollback.steps if s.state == CompensationState.FAILED), None
        ),
    )
    return [
        models.Condition(
            type=condition.type,
            status=condition.status.value,
            reason=condition.reason,
            message=condition.message,
            last_transition_time=condition.last_transition_time,
        )
        for condition in run_conditions(status)
    ]


# history


def history(events: Sequence[Event]) -> list[models.HistoryEntry]:
    return [
        models.HistoryEntry(
            at=event.recorded_at,
            kind=event.kind,
            task=event.task_key,
            message=_event_message(event),
        )
        for event in events
    ]


def run_actions(events: Sequence[Event]) -> list[models.RunAction]:
    """The actions the history recorded (``store/actions.py`` writes their detail)."""
    actions = []
    for event in events:
        detail = event.detail
        actor = detail.get("actor")
        compensator = detail.get("compensator")
        actions.append(
            models.RunAction(
                name=str(detail.get("name") or ""),
                action=str(detail.get("action") or ""),
                actor=models.Actor(
                    username=str(actor.get("username") or ""),
                    groups=[str(group) for group in actor.get("groups") or []],
                )
                if isinstance(actor, Mapping)
                else None,
                task=None if compensator else event.task_key,
                compensator=str(compensator) if compensator else None,
                reason=str(detail.get("reason") or ""),
                result="Accepted" if event.kind == EventKind.ACTION_ACCEPTED else "Refused",
                message=str(detail.get("message") or ""),
                at=event.recorded_at,
            )
        )
    return actions


def _event_message(event: Event) -> str:
    detail = dict(event.detail)
    words = [f"attempt {event.attempt}"] if event.attempt is not None else []
    if isinstance(detail.get("exitCode"), int):
        words.append(f"exit code {detail['exitCode']}")
    for field in ("reason", "message", "error", "job"):
        value = detail.pop(field, None)
        if value:
            words.append(str(value))
    if not words and detail:
        words.append(json.dumps(detail, sort_keys=True, default=str))
    return "; ".join(words)[:1024]
