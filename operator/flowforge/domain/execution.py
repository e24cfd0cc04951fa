"""Pure decisions of the run engine: Job names, retry backoff, what a finished Job means,
the phase of a run from its counts, and the rules of the ``WorkflowRun.status`` projection.

Nothing here talks to Kubernetes or PostgreSQL; the operator feeds plain values in.

Retry backoff (documented contract)
-----------------------------------
A task with ``retries: N`` gets at most ``N + 1`` attempts. After failed attempt ``k``
(``k = 1`` is the first attempt), the next attempt waits

    base = min(cap, first_delay * 2 ** (k - 1))
    delay = base * (1 + jitter * u),   u in [0, 1) derived from (run uid, task, attempt)

With the defaults (``first_delay = 1 s``, ``jitter = 0.5``, ``cap = 300 s``) the wait
before the second attempt is between 1.0 s and 1.5 s, before the third between 2.0 s
and 3.0 s, and so on. ``u`` is a hash, not a random draw, so an operator restarted in the
middle of a backoff computes the same moment again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from flowforge.domain.run import (
    MAX_COMPENSATION_STEPS,
    CompensationStep,
    CompensationSummary,
    Condition,
    ConditionStatus,
    RunProgress,
    RunStatus,
    TaskSummary,
)
from flowforge.domain.states import (
    TERMINAL_COMPENSATION_STATES,
    CompensationState,
    RunPhase,
    TaskRole,
)

MAX_JOB_NAME_LENGTH = 63
JOB_NAME_HASH_LENGTH = 8
# per-task entries in the status only while the run is this small; above it, counts only
STATUS_TASK_SUMMARY_LIMIT = 50

_DNS_INVALID = re.compile(r"[^a-z0-9-]+")
_BASE32_LOWER = "abcdefghijklmnopqrstuvwxyz234567"


def _short_hash(text: str, length: int) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    number = int.from_bytes(digest[:8], "big")
    chars = []
    for _ in range(length):
        chars.append(_BASE32_LOWER[number & 31])
        number >>= 5
    return "".join(chars)


def _dns_fragment(text: str) -> str:
    return _DNS_INVALID.sub("-", text.lower()).strip("-")


def job_name(*, run_name: str, run_uid: str, task_key: str, attempt: int, role: TaskRole) -> str:
    """The deterministic name of the Job for one attempt of one task of one run.

    ``<run>-<task>-<attempt>-<hash>`` for forward tasks, ``<run>-c-<task>-<attempt>-<hash>``
    for compensators. The hash covers the run's uid, role, task and attempt, so two runs
    whose names and keys concatenate alike never share a name, and a run recreated under
    the same name never adopts its predecessor's Jobs. When the readable part would make
    the name longer than 63 characters it is truncated; the hash keeps the name unique.
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    digest = _short_hash(f"{run_uid}/{role.value}/{task_key}/{attempt}", JOB_NAME_HASH_LENGTH)
    middle = "c-" if role is TaskRole.COMPENSATION else ""
    tail = f"-{attempt}-{digest}"
    readable = f"{_dns_fragment(run_name)}-{middle}{_dns_fragment(task_key)}"
    room = MAX_JOB_NAME_LENGTH - len(tail)
    readable = readable[:room].rstrip("-") or "ff"
    return f"{readable}{tail}"


@dataclass(frozen=True)
class BackoffPolicy:
    first_delay_seconds: float = 1.0
    cap_seconds: float = 300.0
    jitter: float = 0.5


def jitter_unit(*, run_uid: str, task_key: str, attempt: int) -> float:
    """A number in [0, 1) that is the same every time for one attempt of one task."""
    digest = hashlib.sha256(f"{run_uid}/{task_key}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def retry_delay(*, failed_attempts: int, policy: BackoffPolicy, unit: float) -> timedelta:
    """How long to wait before the next attempt after ``failed_attempts`` have failed."""
    if failed_attempts < 1:
        raise ValueError("a retry follows at least one failed attempt")
    if not 0.0 <= unit < 1.0:
        raise ValueError(f"jitter unit must be in [0, 1), got {unit}")
    exponent = min(failed_attempts - 1, 62)
    base = min(policy.cap_seconds, policy.first_delay_seconds * 2.0**exponent)
    return timedelta(seconds=base * (1.0 + policy.jitter * unit))


def may_retry(*, attempt: int, retries: int) -> bool:
    """Whether a failed ``attempt`` (1-based) leaves room for another one."""
    return attempt < retries + 1


class OutcomeReason(StrEnum):
    COMPLETED = "Completed"
    EXIT_CODE = "NonZeroExitCode"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    JOB_FAILED = "JobFailed"
    LOST = "JobVanished"
    CANCELLED = "Cancelled"


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    reason: OutcomeReason
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class TerminatedContainer:
    """What a Pod of the Job says about how its container ended (None where unknown)."""

    exit_code: int | None
    reason: str = ""
    message: str = ""


def _condition_true(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def job_outcome(
    job_status: Mapping[str, Any], container: TerminatedContainer | None = None
) -> AttemptOutcome | None:
    """The outcome of a finished Job, or None while it has not finished.

    ``Complete`` is success. ``Failed`` with reason ``DeadlineExceeded`` is a timeout
    (``activeDeadlineSeconds``); any other ``Failed`` is a failed attempt, with the
    container's exit code when a Pod still tells it.
    """
    conditions: Sequence[Mapping[str, Any]] = job_status.get("conditions") or []
    started = _as_datetime(job_status.get("startTime"))
    complete = _condition_true(conditions, "Complete")
    if complete is not None:
        return AttemptOutcome(
            succeeded=True,
            reason=OutcomeReason.COMPLETED,
            message=str(complete.get("message") or ""),
            exit_code=0,
            started_at=started,
            finished_at=_as_datetime(job_status.get("completionTime"))
            or _as_datetime(complete.get("lastTransitionTime")),
        )
    failed = _condition_true(conditions, "Failed")
    if failed is None:
        return None
    finished = _as_datetime(failed.get("lastTransitionTime"))
    job_message = str(failed.get("message") or "")
    if failed.get("reason") == "DeadlineExceeded":
        return AttemptOutcome(
            succeeded=False,
            reason=OutcomeReason.DEADLINE_EXCEEDED,
            message=job_message or "the attempt ran past timeoutSeconds",
            exit_code=container.exit_code if container else None,
            started_at=started,
            finished_at=finished,
        )
    if container is not None and container.exit_code not in (None, 0):
        detail = container.message or container.reason or job_message
        return AttemptOutcome(
            succeeded=False,
            reason=OutcomeReason.EXIT_CODE,
            message=f"exit code {container.exit_code}" + (f": {detail}" if detail else ""),
            exit_code=container.exit_code,
            started_at=started,
            finished_at=finished,
        )
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.JOB_FAILED,
        message=job_message or str(failed.get("reason") or "the Job failed"),
        exit_code=container.exit_code if container else None,
        started_at=started,
        finished_at=finished,
    )


def lost_outcome(*, job: str, now: datetime) -> AttemptOutcome:
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.LOST,
        message=f"Job {job} vanished before its outcome was recorded",
        finished_at=now,
    )


@dataclass(frozen=True)
class TaskCounts:
    total: int = 0
    waiting: int = 0
    ready: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0

    @property
    def unresolved(self) -> int:
        return self.waiting + self.ready + self.running

    @property
    def resolved(self) -> int:
        return self.succeeded + self.failed + self.skipped + self.cancelled


def settled_phase(*, counts: TaskCounts, cancel_requested: bool) -> RunPhase:
    """The phase of a run whose forward tasks are counted, before any compensation."""
    if counts.unresolved > 0:
        return RunPhase.RUNNING
    if cancel_requested or counts.cancelled > 0:
        return RunPhase.CANCELLED
    if counts.failed > 0:
        return RunPhase.FAILED
    return RunPhase.SUCCEEDED


def progress_text(counts: TaskCounts, *, rollback: Sequence[CompensationStep] = ()) -> str:
    """What the progress printer column shows: succeeded of total, e.g. ``3/4``; while a
    rollback runs, how far it got too, e.g. ``2/3 compensating 1/2``."""
    text = f"{counts.succeeded}/{counts.total}"
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
    previous_conditions: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


def _condition(
    status: StatusInput, *, kind: str, holds: bool, reason: str, message: str
) -> Condition:
    """A condition keeps its lastTransitionTime while its status does not change."""
    value = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
    since = status.now
    for previous in status.previous_conditions:
        if previous.get("type") == kind and previous.get("status") == value.value:
            since = _as_datetime(previous.get("lastTransitionTime")) or status.now
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
    else:
        reason = "CompensationFailed" if failure else "RolledBack"
        message = failure or f"all {len(steps)} compensators succeeded"
    return [
        _condition(status, kind="Compensating", holds=status.compensating, reason=reason,
                   message=message),
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


def run_conditions(status: StatusInput) -> list[Condition]:
    """Ready (finished well), Progressing, Failed and Cancelled, each with a reason; once
    a rollback is triggered also Compensating and CompensationFailed."""
    phase = status.phase
    finished = phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)
    counts = status.counts
    if status.compensating:
        progressing_reason = "Compensating"
    elif status.cancel_requested and not finished:
        progressing_reason = "Cancelling"
    else:
        progressing_reason = "Finished" if finished else "TasksRunning"
    return [
        _condition(
            status,
            kind="Ready",
            holds=phase is RunPhase.SUCCEEDED,
            reason="Succeeded" if phase is RunPhase.SUCCEEDED else phase.value.capitalize(),
            message=f"{counts.succeeded} of {counts.total} tasks succeeded",
        ),
        _condition(
            status,
            kind="Progressing",
            holds=not finished,
            reason=progressing_reason,
            message=f"{counts.running} running, {counts.ready} ready, {counts.waiting} waiting",
        ),
        _condition(
            status,
            kind="Failed",
            holds=phase is RunPhase.FAILED,
            reason="TaskFailed" if counts.failed else "NoTaskFailed",
            message=status.failure_message
            or f"{counts.failed} tasks failed, {counts.skipped} skipped",
        ),
        _condition(
            status,
            kind="Cancelled",
            holds=phase is RunPhase.CANCELLED,
            reason="CancelRequested" if status.cancel_requested else "NotRequested",
            message="spec.cancel is true" if status.cancel_requested else "",
        ),
        *_rollback_conditions(status),
    ]


def _phase_message(status: StatusInput) -> str:
    counts = status.counts
    rollback_failure = compensation_failure(status.compensation)
    after = f"; {rollback_failure}" if rollback_failure else ""
    if status.phase is RunPhase.SUCCEEDED:
        return f"all {counts.total} tasks succeeded"
    if status.phase is RunPhase.FAILED:
        return (status.failure_message or f"{counts.failed} tasks failed") + after
    if status.phase is RunPhase.CANCELLED:
        return f"cancelled: {counts.succeeded} succeeded, {counts.cancelled} cancelled" + after
    if status.compensating:
        return f"rolling back: {progress_text(counts, rollback=status.compensation)}"
    return f"{counts.succeeded} of {counts.total} tasks succeeded, {counts.running} running"


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
            running=counts.running,
            succeeded=counts.succeeded,
            failed=counts.failed,
            skipped=counts.skipped,
            cancelled=counts.cancelled,
        ),
        conditions=run_conditions(status),
        tasks=list(status.tasks) if small else [],
        tasks_truncated=not small,
        compensation=compensation_summary(status),
        message=_phase_message(status)[:4096],
    )
    body: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return body
