"""The states of runs, forward tasks and compensators, and every move the store makes.

This module is the specification the PostgreSQL store is held to: its CHECK constraints and
every state list in its SQL are rendered from the sets here, and the model test
(``tests/store/test_run_model.py``) drives random runs through the store and checks that
each move it observes is one of the tables' moves.

Run phases follow Kubernetes convention (``Pending``, ``Running``, ``Succeeded``...), as
``status.phase`` and ``kubectl get wfr`` show them. A run that is rolling back stays
``Running`` with its ``compensating`` flag set until the rollback settles; only then does
it finish ``Failed`` (or ``Cancelled`` when the rollback followed a cancel request). A run
that succeeds is never compensated. ``Pending`` is the phase of a WorkflowRun the store does
not hold yet (the store creates a run with its whole graph at once, ``Running``, or
``Queued`` while a limit of ``flowforge.domain.queue`` holds it: no task of a queued run runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType


class RunPhase(StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


class TaskRole(StrEnum):
    FORWARD = "forward"
    COMPENSATION = "compensation"
    # a ``finally`` task: runs once the run's outcome is decided (``final_tasks.py``)
    FINALLY = "finally"


class TaskState(StrEnum):
    """The state of a forward task (one row per task per run; attempts are counted on it)."""

    WAITING = "waiting"
    READY = "ready"
    # an approval gate whose upstreams succeeded: it waits for people, never for a Job
    AWAITING = "awaiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class ShownTaskState(StrEnum):
    """A forward task's state as people see it (status, CLI): the store's state, except
    that a running task whose Job waits for Kueue's admission is ``admitting``."""

    WAITING = "waiting"
    READY = "ready"
    AWAITING = "awaiting"
    ADMITTING = "admitting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class CompensationState(StrEnum):
    """The state of a compensator: the task that undoes one succeeded forward task."""

    NOT_TRIGGERED = "not_triggered"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


RUN_TRANSITIONS: Mapping[RunPhase, frozenset[RunPhase]] = MappingProxyType(
    {
        # a WorkflowRun whose definition is refused is marked Failed on the object only
        RunPhase.PENDING: frozenset({RunPhase.QUEUED, RunPhase.RUNNING, RunPhase.FAILED}),
        # a run over a limit waits (``flowforge.domain.queue``); it leaves the queue when a
        # slot frees, or is cancelled while it waits (no task of it ever started)
        RunPhase.QUEUED: frozenset({RunPhase.RUNNING, RunPhase.CANCELLED}),
        RunPhase.RUNNING: frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}),
        RunPhase.SUCCEEDED: frozenset(),
        RunPhase.FAILED: frozenset(),
        RunPhase.CANCELLED: frozenset(),
    }
)

TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = MappingProxyType(
    {
        TaskState.WAITING: frozenset(
            {
                TaskState.READY,  # released while the run may not dispatch (cancelling)
                TaskState.RUNNING,  # released and dispatched in the same statement
                TaskState.AWAITING,  # an approval gate, released (``gates.py``)
                TaskState.SUCCEEDED,  # reused from the run a retry is a retry of
                TaskState.SKIPPED,  # an upstream failed for good
                TaskState.CANCELLED,
            }
        ),
        TaskState.READY: frozenset({TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.CANCELLED}),
        # approved by enough people; rejected or timed out; cancelled with the run
        TaskState.AWAITING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}),
        # back to ready is a retry: the attempt number grows by one
        TaskState.RUNNING: frozenset(
            {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.READY, TaskState.CANCELLED}
        ),
        TaskState.SUCCEEDED: frozenset(),
        TaskState.FAILED: frozenset(),
        TaskState.SKIPPED: frozenset(),
        TaskState.CANCELLED: frozenset(),
    }
)

COMPENSATION_TRANSITIONS: Mapping[CompensationState, frozenset[CompensationState]] = (
    MappingProxyType(
        {
            # skipped when its forward task never succeeded
            CompensationState.NOT_TRIGGERED: frozenset(
                {CompensationState.PENDING, CompensationState.SKIPPED}
            ),
            # skipped when the rollback halted, or the run's object is gone
            CompensationState.PENDING: frozenset(
                {CompensationState.RUNNING, CompensationState.SKIPPED}
            ),
            # back to pending is a retry: the attempt number grows by one
            CompensationState.RUNNING: frozenset(
                {
                    CompensationState.SUCCEEDED,
                    CompensationState.FAILED,
                    CompensationState.PENDING,
                    CompensationState.SKIPPED,
                }
            ),
            CompensationState.SUCCEEDED: frozenset(),
            CompensationState.FAILED: frozenset(),
            CompensationState.SKIPPED: frozenset(),
        }
    )
)

TERMINAL_RUN_PHASES = frozenset(phase for phase, nxt in RUN_TRANSITIONS.items() if not nxt)
ACTIVE_RUN_PHASES = frozenset(RunPhase) - TERMINAL_RUN_PHASES
TERMINAL_TASK_STATES = frozenset(state for state, nxt in TASK_TRANSITIONS.items() if not nxt)
TERMINAL_COMPENSATION_STATES = frozenset(
    state for state, nxt in COMPENSATION_TRANSITIONS.items() if not nxt
)
# forward tasks in these states still hold the run open
UNRESOLVED_TASK_STATES = frozenset(TaskState) - TERMINAL_TASK_STATES
# compensators in these states hold a triggered rollback open
UNRESOLVED_COMPENSATION_STATES = frozenset({CompensationState.PENDING, CompensationState.RUNNING})
# rows the operator still has to act on (released, running, or waiting for their turn)
ACTIVE_TASK_STATES: frozenset[StrEnum] = frozenset(
    {TaskState.READY, TaskState.RUNNING, CompensationState.PENDING}
)
# a task the store released and whose Job may be created
RELEASED_TASK_STATES = frozenset({TaskState.READY, TaskState.RUNNING})


def sql_list(values: Iterable[StrEnum]) -> str:
    """``('a', 'b')``: a set of state values as an SQL list, sorted so a query's text (and
    so its prepared plan) is the same every time. The values are this module's own
    constants, never input."""
    return "(" + ", ".join(f"'{value.value}'" for value in sorted(values)) + ")"
