"""The kinds of entries in a run's append-only history (``flowforge_event`` in the store).

One enum, so no kind is spelled as a bare string in SQL or Python; the store's CHECK
constraint only admits the shape ``area.what``. Each kind names a move of
``flowforge.domain.states`` or a fact the operator needs later (``TASK_JOB_CREATED`` tells
a Job that vanished from one that was never created).
"""

from __future__ import annotations

from enum import StrEnum

from flowforge.domain.states import RunPhase


class EventKind(StrEnum):
    RUN_CREATED = "run.created"
    RUN_RETRY_OF = "run.retry_of"
    RUN_QUEUED = "run.queued"  # a limit holds it (detail: the reason)
    RUN_ADMITTED = "run.admitted"  # it left the queue: its tasks may run
    RUN_REPLACED = "run.replaced"  # cancelled to make room for a newer run of its key
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_COMPENSATING = "run.compensating"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"

    TASK_RELEASED = "task.released"
    # an approval gate's upstreams succeeded: it waits for people (`domain/approval.py`)
    TASK_AWAITING_APPROVAL = "task.awaiting_approval"
    TASK_DISPATCHED = "task.dispatched"
    TASK_JOB_CREATED = "task.job_created"
    TASK_ADMITTED = "task.admitted"  # Kueue admitted the attempt's Job
    TASK_EVICTED = "task.evicted"  # Kueue suspended it again: back to admitting
    TASK_SUCCEEDED = "task.succeeded"
    TASK_ATTEMPT_FAILED = "task.attempt_failed"  # and a retry was scheduled
    TASK_FAILED = "task.failed"  # for good: its attempts are used up
    TASK_SKIPPED = "task.skipped"
    TASK_CANCELLED = "task.cancelled"
    TASK_REUSED = "task.reused"

    COMPENSATION_TRIGGERED = "compensation.triggered"
    COMPENSATION_STARTED = "compensation.started"
    COMPENSATION_SUCCEEDED = "compensation.succeeded"
    COMPENSATION_ATTEMPT_FAILED = "compensation.attempt_failed"
    COMPENSATION_FAILED = "compensation.failed"
    COMPENSATION_SKIPPED = "compensation.skipped"
    # a person's WorkflowRunAction (flowforge.domain.run_actions): processed once each
    ACTION_ACCEPTED = "action.accepted"
    ACTION_REFUSED = "action.refused"
    # a halted compensator run again by a person (fresh attempts), and the compensators the
    # halt skipped pending again
    COMPENSATION_RETRIED = "compensation.retried"
    COMPENSATION_RESUMED = "compensation.resumed"
    # a rollback a person recovered has settled; the run stays as it ended
    RUN_ROLLBACK_RECOVERED = "run.rollback_recovered"
    # a person paused the run (nothing new starts) and resumed it; a cancel asked while it
    # was paused waits for the resume (detail: its reason)
    RUN_PAUSED = "run.paused"
    RUN_RESUMED = "run.resumed"
    RUN_CANCEL_DEFERRED = "run.cancel_deferred"
    # the run's outcome is decided (detail: the phase, how the rollback ended): its finally
    # tasks run, one at a time, before it takes that phase (`domain/final_tasks.py`)
    RUN_FINALIZING = "run.finalizing"
    FINALLY_STARTED = "finally.started"
    FINALLY_SUCCEEDED = "finally.succeeded"
    FINALLY_ATTEMPT_FAILED = "finally.attempt_failed"
    FINALLY_FAILED = "finally.failed"
    FINALLY_SKIPPED = "finally.skipped"

    @classmethod
    def run_finished(cls, phase: RunPhase) -> EventKind:
        return _FINISHED[phase]


_FINISHED = {
    RunPhase.SUCCEEDED: EventKind.RUN_SUCCEEDED,
    RunPhase.FAILED: EventKind.RUN_FAILED,
    RunPhase.CANCELLED: EventKind.RUN_CANCELLED,
}

# the kinds that carry an attempt's outcome detail (exit code, reason, message, times)
OUTCOME_KINDS = frozenset(
    {
        EventKind.TASK_SUCCEEDED,
        EventKind.TASK_ATTEMPT_FAILED,
        EventKind.TASK_FAILED,
        EventKind.COMPENSATION_SUCCEEDED,
        EventKind.COMPENSATION_ATTEMPT_FAILED,
        EventKind.COMPENSATION_FAILED,
        EventKind.FINALLY_SUCCEEDED,
        EventKind.FINALLY_ATTEMPT_FAILED,
        EventKind.FINALLY_FAILED,
    }
)
