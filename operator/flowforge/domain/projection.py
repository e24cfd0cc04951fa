"""The ``WorkflowRun.status`` projection: pure rules from the store's counts and rows to the
status object, its conditions and its progress text.

Its conditions follow kstatus' convention (``sigs.k8s.io/cli-utils/pkg/kstatus``, which
Flux, kpt and Helm's ``--wait`` use), so a GitOps pipeline can wait on a run: an unfinished
run has ``Reconciling=True`` (InProgress, with why: queued, admitting, compensating,
cancelling), a Succeeded one ``Ready=True`` and neither (Current), a Failed or Cancelled one
``Stalled=True`` with the run's message (Failed). ``Completed`` is True in every final phase,
so ``kubectl wait --for=condition=Completed`` returns on success and failure alike. The
abnormal-true conditions are left out while they do not hold (kstatus reads an absent one
as False); ``status.observedGeneration`` is the object's generation the status was made for.

The object stays far below etcd's size limit whatever the run's size: per-task entries are
listed only while a run has at most ``STATUS_TASK_SUMMARY_LIMIT`` tasks, the rollback's
steps are capped, and messages are truncated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flowforge.domain.for_each import PARTIAL_FAILURE
from flowforge.domain.run import (
    DEFINITION_REFUSED,
    MAX_COMPENSATION_STEPS,
    CompensationStep,
    CompensationSummary,
    Condition,
    ConditionStatus,
    DuplicateOf,
    FinallySummary,
    QueueStatus,
    RunProgress,
    RunStatus,
    TaskSummary,
)
from flowforge.domain.states import (
    TERMINAL_COMPENSATION_STATES,
    TERMINAL_RUN_PHASES,
    TERMINAL_TASK_STATES,
    CompensationState,
    RunPhase,
)

# kstatus' abnormal-true conditions, and the one every final phase sets
RECONCILING = "Reconciling"
STALLED = "Stalled"
COMPLETED = "Completed"
# approval gates wait for people: a condition, and the reason the run is not done yet
AWAITING_APPROVAL = "AwaitingApproval"
# the outcome is decided, the finally tasks run (`final_tasks.py`)
FINALIZING = "Finalizing"

# per-task entries in the status only while the run is this small; above it, counts only
STATUS_TASK_SUMMARY_LIMIT = 50
# what people are told ``TaskCounts.tolerated`` counts (the status, `flowforge describe`)
TOLERATED_LABEL = "failed within tolerateFailures"


@dataclass(frozen=True)
class TaskCounts:
    total: int = 0
    waiting: int = 0
    ready: int = 0
    # approval gates waiting for people (`approval.py`)
    awaiting: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    # running in the store, but their Jobs wait for Kueue's admission (not in ``running``)
    admitting: int = 0
    # of ``skipped``: skipped because their ``when`` is false (`expansion.py`), not a failure
    condition_false: int = 0
    # forEach items that failed within their task's ``tolerateFailures`` (`for_each.py`):
    # resolved, and no failure of the run (not in ``failed``)
    tolerated: int = 0

    @property
    def unresolved(self) -> int:
        return self.waiting + self.ready + self.awaiting + self.admitting + self.running

    def with_admitting(self, admitting: int) -> TaskCounts:
        """These counts with ``admitting`` of the running tasks counted as admitting."""
        moved = min(admitting, self.running)
        return dataclasses.replace(self, running=self.running - moved, admitting=moved)

    @property
    def resolved(self) -> int:
        return self.succeeded + self.failed + self.skipped + self.cancelled + self.tolerated


def settled_phase(*, counts: TaskCounts, cancel_requested: bool) -> RunPhase:
    """The phase of a run whose forward tasks are counted, before any compensation."""
    if counts.unresolved > 0:
        return RunPhase.RUNNING
    if cancel_requested:
        return RunPhase.CANCELLED
    if counts.failed > 0:  # a forEach past its tolerance cancels its other items: a failure
        return RunPhase.FAILED
    if counts.cancelled > 0:
        return RunPhase.CANCELLED
    return RunPhase.SUCCEEDED


def progress_text(counts: TaskCounts, *, rollback: Sequence[CompensationStep] = ()) -> str:
    """What the progress printer column shows: succeeded of total, e.g. ``3/4``; how many
    wait for Kueue's admission, e.g. ``1/6 (4 admitting)``, or for people's approval, e.g.
    ``2/4 (1 awaiting approval)``; forEach items that failed within their tolerance, e.g.
    ``3/4 (1 failed within tolerateFailures)``; while a rollback runs, how far
    it got too, e.g. ``2/3 compensating 1/2``."""
    # a task whose condition is false is not part of the run's work
    text = f"{counts.succeeded}/{counts.total - counts.condition_false}"
    if counts.tolerated:  # resolved, yet not succeeded: say why the run is not held up
        text += f" ({counts.tolerated} {TOLERATED_LABEL})"
    if counts.admitting:  # Jobs that wait for Kueue are not running: say so
        text += f" ({counts.admitting} admitting)"
    if counts.awaiting:  # approval gates wait for people
        text += f" ({counts.awaiting} awaiting approval)"
    if any(step.state not in TERMINAL_COMPENSATION_STATES for step in rollback):
        done = sum(step.state in TERMINAL_COMPENSATION_STATES for step in rollback)
        text += f" compensating {done}/{len(rollback)}"
    return text


@dataclass(frozen=True)
class StatusInput:
    phase: RunPhase
    counts: TaskCounts
    fingerprint: str
    started_at: datetime | None
    finished_at: datetime | None
    now: datetime
    cancel_requested: bool = False
    failure_message: str | None = None
    tasks: Sequence[TaskSummary] = field(default_factory=tuple)
    compensating: bool = False
    # the rollback's steps in the order it runs them (empty until one is triggered)
    compensation: Sequence[CompensationStep] = field(default_factory=tuple)
    observed_generation: int | None = None
    # when the rollback was triggered, and when a compensator failed and halted it
    rollback_started_at: datetime | None = None
    rollback_halted_at: datetime | None = None
    # while the run is Queued: the limit that holds it and its position
    queue: QueueStatus | None = None
    # a person's action that recovered the halted rollback (who, what, why), once accepted
    recovered_by: str | None = None
    # the earlier run with the same spec.idempotencyKey: this run does not execute
    duplicate_of: DuplicateOf | None = None
    # since when a person has paused it (nothing starts), and a cancel kept for its resume
    paused_at: datetime | None = None
    deferred_cancel: str | None = None
    # the approval gates that wait for people, and since when (`approval.py`)
    awaiting_approval: Sequence[tuple[str, datetime]] = field(default_factory=tuple)
    # once the outcome is decided: that phase, how the rollback ended, the finally tasks
    final: FinallySummary | None = None

    @property
    def finalizing(self) -> bool:
        return self.final is not None and self.phase not in TERMINAL_RUN_PHASES

    @property
    def paused(self) -> bool:
        return self.paused_at is not None and self.phase not in TERMINAL_RUN_PHASES


def _transition_time(status: StatusInput, *, kind: str, holds: bool) -> datetime:
    """When a condition took its current value, from the store's own times (so it is the
    same after an operator restart): a run's conditions change only when it starts, when
    its rollback starts or halts, and when it finishes."""
    started, finished = status.started_at, status.finished_at
    rollback, halted = status.rollback_started_at, status.rollback_halted_at
    since = {
        ("Ready", True): finished,
        ("Ready", False): started,
        ("Progressing", True): started,
        ("Progressing", False): finished,
        ("Failed", True): finished,
        ("Failed", False): started,
        ("Cancelled", True): finished,
        ("Cancelled", False): started,
        ("Compensating", True): rollback,
        ("Compensating", False): finished,
        ("CompensationFailed", True): halted,
        ("CompensationFailed", False): rollback,
        (RECONCILING, True): started,
        (STALLED, True): finished,
        (COMPLETED, True): finished,
        (COMPLETED, False): started,
        ("Duplicate", True): started,
    }.get((kind, holds))
    return since or status.now


def _condition(
    status: StatusInput, *, kind: str, holds: bool, reason: str, message: str
) -> Condition:
    value = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
    since = _transition_time(status, kind=kind, holds=holds)
    return Condition(
        type=kind,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=status.observed_generation,
    )


def _failed_step(steps: Sequence[CompensationStep]) -> CompensationStep | None:
    return next((step for step in steps if step.state is CompensationState.FAILED), None)


def compensation_failure(steps: Sequence[CompensationStep]) -> str | None:
    """Which compensator halted the rollback and what it left undone, or None."""
    failed = _failed_step(steps)
    if failed is None:
        return None
    halted = [step.name for step in steps if step.state is CompensationState.SKIPPED]
    text = f"compensator {failed.name} (undoing {failed.compensates}) failed"
    if failed.attempt > 1:
        text += f" after {failed.attempt} attempts"
    if failed.message:
        text += f": {failed.message}"
    if halted:
        text += f"; rollback halted, not run: {', '.join(halted)}"
    return text


def _rollback_conditions(status: StatusInput) -> list[Condition]:
    steps = status.compensation
    if not steps:
        return []
    failure = compensation_failure(steps)
    current = next((s for s in steps if s.state is CompensationState.RUNNING), None)
    done = sum(step.state is CompensationState.SUCCEEDED for step in steps)
    if status.compensating:
        reason = "RollingBack"
        message = (
            f"running {current.name} (undoing {current.compensates}), step "
            f"{steps.index(current) + 1} of {len(steps)}"
            if current is not None
            else f"{done} of {len(steps)} compensators succeeded, next one pending"
        )
    elif failure is None and status.recovered_by:
        reason = "RolledBackAfterAction"
        message = (
            f"the rollback finished after a person acted ({status.recovered_by}); "
            f"{done} of {len(steps)} compensators succeeded"
        )
    else:
        reason = "CompensationFailed" if failure else "RolledBack"
        message = failure or f"all {len(steps)} compensators succeeded"
    return [
        _condition(
            status, kind="Compensating", holds=status.compensating, reason=reason, message=message
        ),
        _condition(
            status,
            kind="CompensationFailed",
            holds=failure is not None,
            reason="CompensatorFailed" if failure else "NoCompensatorFailed",
            message=failure or f"{done} of {len(steps)} compensators succeeded",
        ),
    ]


def compensation_summary(status: StatusInput) -> CompensationSummary | None:
    steps = status.compensation
    if not steps:
        return None
    current = next((s.name for s in steps if s.state is CompensationState.RUNNING), None)
    return CompensationSummary(
        active=status.compensating, current=current, steps=list(steps[:MAX_COMPENSATION_STEPS])
    )


def reconciling_reason(status: StatusInput) -> str:
    """Why an unfinished run is not done yet, as kstatus' ``Reconciling`` reason."""
    if status.phase is RunPhase.PENDING:
        return "Pending"
    if status.phase is RunPhase.QUEUED:
        return "Queued"
    if status.paused:
        return "Paused"
    if status.finalizing:
        return FINALIZING
    if status.compensating:
        return "Compensating"
    if status.cancel_requested:
        return "Cancelling"
    counts = status.counts
    if status.awaiting_approval and not counts.running and not counts.admitting:
        return AWAITING_APPROVAL
    if counts.admitting and not counts.running:
        return "Admitting"
    return "TasksRunning"


def _kstatus_conditions(status: StatusInput) -> list[Condition]:
    """Reconciling while the run goes on; Completed (True in every final phase); Stalled when
    it ended Failed or Cancelled, with the run's message."""
    phase = status.phase
    message = _phase_message(status)[:4096]
    if phase not in TERMINAL_RUN_PHASES:
        return [
            _condition(
                status,
                kind=RECONCILING,
                holds=True,
                reason=reconciling_reason(status),
                message=message,
            ),
            _condition(
                status,
                kind=COMPLETED,
                holds=False,
                reason=phase.value,
                message="the run has not finished",
            ),
        ]
    completed = _condition(status, kind=COMPLETED, holds=True, reason=phase.value, message=message)
    if phase is RunPhase.SUCCEEDED:
        return [completed]
    stalled = _condition(status, kind=STALLED, holds=True, reason=phase.value, message=message)
    return [stalled, completed]


def run_conditions(status: StatusInput) -> list[Condition]:
    """Ready (finished well), Progressing, Failed and Cancelled, each with a reason; once
    a rollback is triggered also Compensating and CompensationFailed; kstatus'
    Reconciling or Stalled, and Completed."""
    phase = status.phase
    finished = phase in TERMINAL_RUN_PHASES
    counts = status.counts
    if phase is RunPhase.QUEUED:
        progressing_reason = "Queued"
    elif status.paused:
        progressing_reason = "Paused"
    elif status.finalizing:
        progressing_reason = FINALIZING
    elif status.compensating:
        progressing_reason = "Compensating"
    elif status.cancel_requested and not finished:
        progressing_reason = "Cancelling"
    elif status.awaiting_approval and not finished and not counts.running:
        progressing_reason = AWAITING_APPROVAL
    else:
        progressing_reason = "Finished" if finished else "TasksRunning"
    duplicate = _phase_message(status) if status.duplicate_of is not None else None
    return [
        _condition(
            status,
            kind="Ready",
            holds=phase is RunPhase.SUCCEEDED,
            reason=phase.value,
            message=duplicate or f"{counts.succeeded} of {counts.total} tasks succeeded",
        ),
        _condition(
            status,
            kind="Progressing",
            holds=not finished,
            reason=progressing_reason,
            message=f"{counts.running} running, {counts.admitting} admitting, "
            f"{counts.ready} ready, {counts.waiting} waiting"
            + (f", {counts.awaiting} awaiting approval" if counts.awaiting else ""),
        ),
        _condition(
            status,
            kind="Failed",
            holds=phase is RunPhase.FAILED,
            reason="TaskFailed" if counts.failed else "NoTaskFailed",
            message=status.failure_message
            or duplicate
            or f"{counts.failed} tasks failed, {counts.skipped} skipped",
        ),
        _condition(
            status,
            kind="Cancelled",
            holds=phase is RunPhase.CANCELLED,
            reason="CancelRequested" if status.cancel_requested else "NotRequested",
            message="spec.cancel is true" if status.cancel_requested else "",
        ),
        *_kstatus_conditions(status),
        *_rollback_conditions(status),
        *_queue_conditions(status),
        *_duplicate_conditions(status),
        *_pause_conditions(status),
        *_approval_conditions(status),
        *(
            [
                _condition(
                    status,
                    kind=PARTIAL_FAILURE,
                    holds=True,
                    reason="FailuresTolerated",
                    message=f"{counts.tolerated} forEach items failed within their task's "
                    "tolerateFailures; its dependents ran",
                )
            ]
            if counts.tolerated
            else []
        ),
    ]


def _pause_conditions(status: StatusInput) -> list[Condition]:
    """While a person has paused the run: ``Paused``, since when, and a cancel it keeps."""
    if not status.paused or status.paused_at is None:
        return []
    message = "paused by a WorkflowRunAction: no task or compensator starts until Resume"
    if status.deferred_cancel:
        message += f"; a cancel ({status.deferred_cancel}) is applied when it is resumed"
    return [
        Condition(
            type="Paused",
            status=ConditionStatus.TRUE,
            reason="PausedByAction",
            message=message,
            last_transition_time=status.paused_at,
            observed_generation=status.observed_generation,
        )
    ]


def _approval_conditions(status: StatusInput) -> list[Condition]:
    """While approval gates wait for people: ``AwaitingApproval`` naming them, since the
    first began to wait."""
    if not status.awaiting_approval or status.phase in TERMINAL_RUN_PHASES:
        return []
    gates = [gate for gate, _ in status.awaiting_approval]
    return [
        Condition(
            type=AWAITING_APPROVAL,
            status=ConditionStatus.TRUE,
            reason="ApprovalRequired",
            message=f"waiting for approval: {', '.join(gates)} "
            f"(flowforge approve RUN {gates[0]}, or a WorkflowRunAction Approve)",
            last_transition_time=min(since for _, since in status.awaiting_approval),
            observed_generation=status.observed_generation,
        )
    ]


def _queue_conditions(status: StatusInput) -> list[Condition]:
    """While the run waits: ``Queued`` with the limit that holds it as its reason, and its
    position in the message."""
    queue = status.queue
    if status.phase is not RunPhase.QUEUED or queue is None:
        return []
    return [
        Condition(
            type="Queued",
            status=ConditionStatus.TRUE,
            reason=queue.reason,
            message=queue.message,
            last_transition_time=status.started_at or status.now,
            observed_generation=status.observed_generation,
        )
    ]


def duplicate_message(original: DuplicateOf, *, finished: bool) -> str:
    """What a duplicate run says: whose result it shows, or waits for."""
    if finished:
        return (
            f"duplicate of run {original.name} (the same spec.idempotencyKey), which ended "
            f"{original.phase.value}: this run did not execute"
        )
    return (
        f"duplicate of run {original.name} (the same spec.idempotencyKey): waiting for its "
        "result; this run does not execute"
    )


def _duplicate_conditions(status: StatusInput) -> list[Condition]:
    if status.duplicate_of is None:
        return []
    return [
        _condition(
            status,
            kind="Duplicate",
            holds=True,
            reason="IdempotencyKey",
            message=_phase_message(status),
        )
    ]


def _phase_message(status: StatusInput) -> str:
    counts = status.counts
    if status.duplicate_of is not None:
        finished = status.phase in TERMINAL_RUN_PHASES
        return duplicate_message(status.duplicate_of, finished=finished)
    rollback_failure = compensation_failure(status.compensation)
    after = f"; {rollback_failure}" if rollback_failure else ""
    if status.phase is RunPhase.SUCCEEDED:
        ran = counts.total - counts.condition_false
        text = (
            f"{counts.succeeded} of {ran} tasks succeeded, {counts.tolerated} {TOLERATED_LABEL}"
            if counts.tolerated
            else f"all {ran} tasks succeeded"
        )
        if counts.condition_false:
            text += f"; {counts.condition_false} skipped (ConditionFalse)"
        return text
    if status.phase is RunPhase.FAILED:
        return (status.failure_message or f"{counts.failed} tasks failed") + after
    if status.phase is RunPhase.CANCELLED:
        return f"cancelled: {counts.succeeded} succeeded, {counts.cancelled} cancelled" + after
    if status.phase is RunPhase.QUEUED:
        return f"queued: {status.queue.message}" if status.queue else "queued"
    if status.paused:
        return f"paused: {progress_text(counts, rollback=status.compensation)}"
    if status.final is not None and status.finalizing:
        done = sum(step.state in TERMINAL_TASK_STATES for step in status.final.steps)
        return (
            f"outcome {status.final.outcome.value} decided (rollback: "
            f"{status.final.rollback}); running finally tasks {done}/{len(status.final.steps)}"
        )
    if status.compensating:
        return f"rolling back: {progress_text(counts, rollback=status.compensation)}"
    text = f"{counts.succeeded} of {counts.total} tasks succeeded, {counts.running} running"
    if status.awaiting_approval:
        gates = ", ".join(gate for gate, _ in status.awaiting_approval)
        text = f"awaiting approval of {gates}; {text}"
    if counts.admitting:
        text += f", {counts.admitting} admitting (waiting for Kueue)"
    return text


def project_status(status: StatusInput) -> dict[str, Any]:
    """The ``WorkflowRun.status`` body (``flowforge.domain.run.RunStatus`` on the wire).

    The per-task list appears only while the run has at most ``STATUS_TASK_SUMMARY_LIMIT``
    tasks, so the object's size does not grow with the DAG; ``tasksTruncated`` says so.
    """
    counts = status.counts
    small = counts.total <= STATUS_TASK_SUMMARY_LIMIT
    model = RunStatus(
        phase=status.phase,
        observed_generation=status.observed_generation,
        started_at=status.started_at,
        finished_at=status.finished_at,
        definition_fingerprint=status.fingerprint,
        progress=progress_text(counts, rollback=status.compensation),
        counts=RunProgress(
            total=counts.total,
            waiting=counts.waiting,
            ready=counts.ready,
            admitting=counts.admitting,
            running=counts.running,
            succeeded=counts.succeeded,
            failed=counts.failed,
            tolerated=counts.tolerated,
            skipped=counts.skipped - counts.condition_false,
            condition_skipped=counts.condition_false,
            cancelled=counts.cancelled,
        ),
        conditions=run_conditions(status),
        tasks=list(status.tasks) if small else [],
        tasks_truncated=not small,
        compensation=compensation_summary(status),
        finally_=status.final,
        queue=status.queue if status.phase is RunPhase.QUEUED else None,
        duplicate_of=status.duplicate_of,
        message=_phase_message(status)[:4096],
    )
    body: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return body


def refused_status(
    *, message: str, now: datetime, generation: int | None, reason: str = DEFINITION_REFUSED
) -> dict[str, Any]:
    """The status of a WorkflowRun the store never took (its definition is missing or does
    not validate, or ``reason`` another refusal): Failed, and to kstatus Stalled with why;
    Completed, so a wait returns."""
    text = message[:4096]
    conditions = [
        Condition(
            type=kind,
            status=ConditionStatus.FALSE if kind == "Ready" else ConditionStatus.TRUE,
            reason=reason,
            message=text,
            last_transition_time=now,
            observed_generation=generation,
        )
        for kind in ("Ready", "Failed", STALLED, COMPLETED)
    ]
    model = RunStatus(
        phase=RunPhase.FAILED,
        observed_generation=generation,
        conditions=conditions,
        message=text,
    )
    body: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return body
