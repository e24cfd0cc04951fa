"""What ``flowforge get runs`` and ``describe run`` print: a run's rows in the store and the
outcomes its event history recorded (attempts, exit codes, reasons, durations, the rollback's
steps)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flowforge.cli.output import table
from flowforge.domain.execution import attempts_made
from flowforge.domain.history import OUTCOME_KINDS, EventKind
from flowforge.domain.projection import TOLERATED_LABEL
from flowforge.domain.states import CompensationState, TaskRole, TaskState
from flowforge.store.connection import Pool
from flowforge.store.events import Event, run_history
from flowforge.store.queries import TaskRecord, list_tasks, rollback_steps, run_progress
from flowforge.store.reuse import NamedRun

# what a run report holds: the store's rows and the outcomes its event history recorded

START_KINDS = frozenset(
    {EventKind.TASK_DISPATCHED, EventKind.COMPENSATION_STARTED, EventKind.FINALLY_STARTED}
)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def _parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None


@dataclass(frozen=True)
class AttemptReport:
    attempt: int
    outcome: str  # succeeded / failed
    exit_code: int | None
    reason: str | None
    message: str | None
    started_at: datetime | None
    finished_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "outcome": self.outcome,
            "exitCode": self.exit_code,
            "reason": self.reason,
            "message": self.message,
            "startedAt": _iso(self.started_at),
            "finishedAt": _iso(self.finished_at),
            "durationSeconds": _seconds(self.started_at, self.finished_at),
        }


@dataclass(frozen=True)
class TaskReport:
    row: TaskRecord
    attempts: Sequence[AttemptReport] = ()
    reused_from: str | None = None

    @property
    def last(self) -> AttemptReport | None:
        return self.attempts[-1] if self.attempts else None

    def to_dict(self) -> dict[str, Any]:
        row, last = self.row, self.last
        document: dict[str, Any] = {
            "key": row.task_key,
            "state": row.shown_state,
            "attempt": row.attempt,
            "maxAttempts": row.max_attempts,
            "startedAt": _iso(row.started_at),
            "finishedAt": _iso(row.finished_at),
            "durationSeconds": _seconds(row.started_at, row.finished_at),
            "exitCode": last.exit_code if last else None,
            "reason": last.reason if last else None,
            "message": (last.message if last else None) or row.last_error,
            "attempts": [attempt.to_dict() for attempt in self.attempts],
        }
        if row.compensates_key is not None:
            document["compensates"] = row.compensates_key
        else:
            document["reusedFrom"] = self.reused_from
        return document


@dataclass(frozen=True)
class RunReport:
    run: NamedRun
    counts: Mapping[str, int]
    tasks: Sequence[TaskReport] = ()
    compensation: Sequence[TaskReport] = ()  # the steps of the rollback, in running order
    finals: Sequence[TaskReport] = ()  # the finally tasks, in the order they run
    retry_of: str | None = None
    # the WorkflowRunActions applied to the run or refused: who acted, on what, and why
    actions: Sequence[Mapping[str, Any]] = ()

    @property
    def progress(self) -> str:
        return f"{self.counts.get('succeeded', 0)}/{self.counts.get('total', 0)}"

    @property
    def phase(self) -> str:
        run = self.run
        suffix = (
            " (rolling back)"
            if run.compensating
            else (" (cancel requested)" if run.cancel_requested and not run.finished else "")
        )
        return f"{run.phase}{suffix}"

    def to_dict(self) -> dict[str, Any]:
        run = self.run
        return {
            "namespace": run.namespace,
            "name": run.name,
            "uid": run.uid,
            "workflow": run.workflow,
            "version": run.version,
            "phase": str(run.phase),
            "compensating": run.compensating,
            "cancelRequested": run.cancel_requested,
            "parameters": dict(run.parameters),
            "createdAt": _iso(run.created_at),
            "finishedAt": _iso(run.finished_at),
            "durationSeconds": _seconds(run.created_at, run.finished_at),
            "prunedAt": _iso(run.pruned_at),
            "retryOf": self.retry_of,
            "progress": self.progress,
            "counts": dict(self.counts),
            "tasks": [task.to_dict() for task in self.tasks],
            "compensation": [step.to_dict() for step in self.compensation],
            "finally": [step.to_dict() for step in self.finals],
            "actions": [dict(action) for action in self.actions],
        }


def _attempts(events: Sequence[Event]) -> dict[str, list[AttemptReport]]:
    started: dict[tuple[str, int], datetime] = {}
    attempts: dict[str, list[AttemptReport]] = {}
    for event in events:
        if event.task_key is None or event.attempt is None:
            continue
        if event.kind in START_KINDS:
            started.setdefault((event.task_key, event.attempt), event.recorded_at)
        elif event.kind in OUTCOME_KINDS:
            detail = event.detail
            exit_code = detail.get("exitCode")
            attempts.setdefault(event.task_key, []).append(
                AttemptReport(
                    attempt=event.attempt,
                    outcome=TaskState.SUCCEEDED
                    if event.kind.endswith(".succeeded")
                    else TaskState.FAILED,
                    exit_code=exit_code if isinstance(exit_code, int) else None,
                    reason=detail.get("reason"),
                    message=detail.get("message") or detail.get("error"),
                    started_at=_parse_time(detail.get("startedAt"))
                    or started.get((event.task_key, event.attempt)),
                    finished_at=_parse_time(detail.get("finishedAt")) or event.recorded_at,
                )
            )
    return attempts


async def load_report(pool: Pool, run: NamedRun, *, with_tasks: bool = True) -> RunReport:
    progress = await run_progress(pool, run.id)
    counts = {
        name: getattr(progress.forward, name)
        for name in (
            "total",
            "waiting",
            "ready",
            "admitting",
            "running",
            "succeeded",
            "failed",
            "skipped",
            "cancelled",
            "tolerated",
        )
    }
    if progress.forward.condition_false:  # kept apart from a skip after a failure
        counts["skipped"] -= progress.forward.condition_false
        counts["conditionSkipped"] = progress.forward.condition_false
    if not with_tasks:
        return RunReport(run=run, counts=counts)
    rows = await list_tasks(pool, run.id)
    events = await run_history(pool, run.id)
    attempts = _attempts(events)
    retried = next((event for event in events if event.kind == EventKind.RUN_RETRY_OF), None)
    retry_of = None if retried is None else str(retried.detail.get("retryOf"))
    reused = {
        str(key): str(retry_of) for key in (retried.detail if retried else {}).get("reused", [])
    }
    reused.update(
        (event.task_key, str(event.detail["retryOf"]))
        for event in events
        if event.kind == EventKind.TASK_REUSED and event.task_key and event.detail.get("retryOf")
    )
    started_order = {
        event.task_key: event.id for event in events if event.kind == EventKind.COMPENSATION_STARTED
    }
    tasks = [
        TaskReport(
            row=row, attempts=attempts.get(row.task_key, ()), reused_from=reused.get(row.task_key)
        )
        for row in rows
        if row.role is TaskRole.FORWARD
    ]
    succeeded = {
        row.task_key
        for row in rows
        if row.role is TaskRole.FORWARD and row.state == TaskState.SUCCEEDED
    }
    # the rollback's steps: compensators of what succeeded (or was undone as attempted,
    # compensateOn), once triggered (a skipped one among them was halted by a failed step)
    steps = {step.task_key for step in await rollback_steps(pool, run.id)}
    compensators = [
        row
        for row in rows
        if (row.compensates_key in succeeded or row.task_key in steps)
        and row.state != CompensationState.NOT_TRIGGERED
    ]
    # steps that ran in the order they started; the rest in the order they would run
    last = len(events) + 1
    ordered = sorted(
        enumerate(reversed(compensators)),
        key=lambda item: (started_order.get(item[1].task_key, last), item[0]),
    )
    compensation = [
        TaskReport(row=row, attempts=attempts.get(row.task_key, ())) for _, row in ordered
    ]
    return RunReport(
        run=run,
        counts=counts,
        tasks=tasks,
        compensation=compensation,
        finals=[
            TaskReport(row=row, attempts=attempts.get(row.task_key, ()))
            for row in rows
            if row.role is TaskRole.FINALLY
        ],
        retry_of=retry_of,
        actions=_actions(events),
    )


def _actions(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The people's actions the history records (``flowforge.store.actions``)."""
    return [
        {
            "at": _iso(event.recorded_at),
            "name": event.detail.get("name"),
            "action": event.detail.get("action"),
            "target": event.task_key,
            "actor": (event.detail.get("actor") or {}).get("username"),
            "result": "Accepted" if event.kind == EventKind.ACTION_ACCEPTED else "Refused",
            "reason": event.detail.get("reason") or "",
            "message": event.detail.get("message") or "",
        }
        for event in events
        if event.kind in (EventKind.ACTION_ACCEPTED, EventKind.ACTION_REFUSED)
    ]


# text output


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _age(moment: datetime) -> str:
    return duration_text((datetime.now(UTC) - moment).total_seconds())


def runs_table(reports: Sequence[RunReport], *, wide: bool = False) -> str:
    headers = ["NAME", "WORKFLOW", "VERSION", "PHASE", "PROGRESS", "AGE", "DURATION"]
    if wide:
        headers += ["UID", "CREATED", "FINISHED"]
    rows = []
    for report in reports:
        run = report.run
        row = [
            run.name,
            run.workflow,
            str(run.version),
            report.phase,
            report.progress,
            _age(run.created_at),
            duration_text(_seconds(run.created_at, run.finished_at)),
        ]
        if wide:
            row += [run.uid, _iso(run.created_at) or "-", _iso(run.finished_at) or "-"]
        rows.append(row)
    return table(headers, rows)


def _task_row(task: TaskReport, *, first: str, wide: bool) -> list[str]:
    row, last = task.row, task.last
    reason = (last.reason or "") if last else ""
    message = (last.message if last else None) or row.last_error or ""
    if task.reused_from:
        reason, message = "Reused", f"succeeded in {task.reused_from}"
    exit_code = "-" if last is None or last.exit_code is None else str(last.exit_code)
    detail = (f"{reason}: {message}" if reason and message else reason or message).replace(
        "\n", " "
    )
    started = row.started_at is not None and not task.reused_from
    cells = [
        first,
        row.shown_state,
        f"{attempts_made(state=row.state, attempt=row.attempt, started=started)}"
        f"/{row.max_attempts}",
        duration_text(_seconds(row.started_at, row.finished_at)),
        exit_code,
    ]
    if wide:
        return [*cells, _iso(row.started_at) or "-", _iso(row.finished_at) or "-", detail]
    return [*cells, detail[:100]]


# forEach items that failed within their task's tolerance: no failure of the run
COUNT_LABELS = {"tolerated": TOLERATED_LABEL}


def other_counts(counts: Mapping[str, int]) -> str:
    """The counts besides the succeeded and the total, e.g. ``1 failed, 2 skipped`` (what
    `flowforge describe` prints after its progress, from the store or the read API)."""
    return ", ".join(
        f"{n} {COUNT_LABELS.get(state, state)}"
        for state, n in counts.items()
        if state not in ("total", "succeeded") and n
    )


def report_text(report: RunReport, *, wide: bool = False) -> str:
    run = report.run
    counts = other_counts(report.counts)
    lines = [
        f"Run:        {run.namespace}/{run.name} (uid {run.uid})",
        f"Workflow:   {run.workflow} v{run.version}",
        f"Phase:      {report.phase}",
        f"Progress:   {report.progress} succeeded" + (f", {counts}" if counts else ""),
        f"Created:    {_iso(run.created_at)}",
        f"Finished:   {_iso(run.finished_at) or '-'}  (duration "
        f"{duration_text(_seconds(run.created_at, run.finished_at))})",
    ]
    if run.parameters:
        lines.append(f"Parameters: {json.dumps(dict(run.parameters), sort_keys=True)}")
    if report.retry_of:
        lines.append(f"Retry of:   {report.retry_of}")
    if run.pruned_at is not None:
        lines.append(f"Pruned:     {_iso(run.pruned_at)} (task rows and events deleted)")
    text = "\n".join(lines) + "\n"
    headers = ["STATE", "ATTEMPTS", "DURATION", "EXIT"]
    headers += ["STARTED", "FINISHED", "REASON"] if wide else ["REASON"]
    if report.tasks:
        text += "\n" + table(
            ["TASK", *headers],
            [_task_row(task, first=task.row.task_key, wide=wide) for task in report.tasks],
        )
    if report.compensation:
        text += "\nCompensation (in the order it runs, last task first):\n" + table(
            ["STEP", "COMPENSATOR", "UNDOES", *headers],
            [
                [
                    str(number),
                    step.row.task_key,
                    str(step.row.compensates_key),
                    *_task_row(step, first="", wide=wide)[1:],
                ]
                for number, step in enumerate(report.compensation, start=1)
            ],
        )
    if report.finals:
        text += "\nFinally (once the outcome was decided, in order):\n" + table(
            ["TASK", *headers],
            [_task_row(step, first=step.row.task_key, wide=wide) for step in report.finals],
        )
    if report.actions:
        text += "\nActions (people's decisions, oldest first):\n" + table(
            ["ACTION", "TARGET", "ACTOR", "RESULT", "REASON", "MESSAGE"],
            [
                [
                    str(action["action"]),
                    str(action["target"] or "-"),
                    str(action["actor"]),
                    str(action["result"]),
                    str(action["reason"] or "-"),
                    str(action["message"]),
                ]
                for action in report.actions
            ],
        )
    return text
