"""The states of runs, forward tasks and compensators, and which moves between them are legal.

Pure data: the PostgreSQL store mirrors these values in CHECK constraints (a store test
keeps both in sync) and performs every move as a compare-and-set on the expected state.

A run that is rolling back stays ``running`` with its ``compensating`` flag set until the
rollback settles; only then does it finish ``failed`` (or ``cancelled`` when the rollback
followed a cancel request). A run that succeeds is never compensated.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class RunPhase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TaskRole(StrEnum):
    FORWARD = "forward"
    COMPENSATION = "compensation"


class TaskState(StrEnum):
    """The state of a forward task (one row per task per run; attempts are counted on it)."""

    WAITING = "waiting"
    READY = "ready"
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
        RunPhase.PENDING: frozenset({RunPhase.RUNNING, RunPhase.FAILED, RunPhase.CANCELLED}),
        RunPhase.RUNNING: frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}),
        RunPhase.SUCCEEDED: frozenset(),
        RunPhase.FAILED: frozenset(),
        RunPhase.CANCELLED: frozenset(),
    }
)

TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = MappingProxyType(
    {
        # released on proof that every upstream succeeded; skipped when one failed for good
        TaskState.WAITING: frozenset({TaskState.READY, TaskState.SKIPPED, TaskState.CANCELLED}),
        TaskState.READY: frozenset({TaskState.RUNNING, TaskState.CANCELLED}),
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
            # skipped when its forward task never succeeded, or the rollback halted
            CompensationState.NOT_TRIGGERED: frozenset(
                {CompensationState.PENDING, CompensationState.SKIPPED}
            ),
            CompensationState.PENDING: frozenset(
                {CompensationState.RUNNING, CompensationState.SKIPPED}
            ),
            # back to pending is a retry: the attempt number grows by one
            CompensationState.RUNNING: frozenset(
                {
                    CompensationState.SUCCEEDED,
                    CompensationState.FAILED,
                    CompensationState.PENDING,
                }
            ),
            CompensationState.SUCCEEDED: frozenset(),
            CompensationState.FAILED: frozenset(),
            CompensationState.SKIPPED: frozenset(),
        }
    )
)

TERMINAL_RUN_PHASES = frozenset(phase for phase, nxt in RUN_TRANSITIONS.items() if not nxt)
TERMINAL_TASK_STATES = frozenset(state for state, nxt in TASK_TRANSITIONS.items() if not nxt)
TERMINAL_COMPENSATION_STATES = frozenset(
    state for state, nxt in COMPENSATION_TRANSITIONS.items() if not nxt
)
# forward tasks in these states still hold the run open
UNRESOLVED_TASK_STATES = frozenset(TaskState) - TERMINAL_TASK_STATES
UNRESOLVED_COMPENSATION_STATES = frozenset({CompensationState.PENDING, CompensationState.RUNNING})


def is_terminal_run_phase(phase: RunPhase) -> bool:
    return phase in TERMINAL_RUN_PHASES


def is_terminal_task_state(state: TaskState) -> bool:
    return state in TERMINAL_TASK_STATES


def is_terminal_compensation_state(state: CompensationState) -> bool:
    return state in TERMINAL_COMPENSATION_STATES


def can_move_run(current: RunPhase, target: RunPhase) -> bool:
    return target in RUN_TRANSITIONS[current]


def can_move_task(current: TaskState, target: TaskState) -> bool:
    return target in TASK_TRANSITIONS[current]


def can_move_compensation(current: CompensationState, target: CompensationState) -> bool:
    return target in COMPENSATION_TRANSITIONS[current]
