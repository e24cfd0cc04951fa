"""The state machines of runs, tasks and compensators as plain data."""

from __future__ import annotations

from flowforge.domain.states import (
    COMPENSATION_TRANSITIONS,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL_COMPENSATION_STATES,
    TERMINAL_RUN_PHASES,
    TERMINAL_TASK_STATES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskState,
    sql_list,
)


def test_every_state_has_a_transition_entry() -> None:
    assert set(RUN_TRANSITIONS) == set(RunPhase)
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert set(COMPENSATION_TRANSITIONS) == set(CompensationState)


def test_terminal_states_are_exactly_those_without_a_way_out() -> None:
    assert {
        RunPhase.SUCCEEDED,
        RunPhase.FAILED,
        RunPhase.CANCELLED,
    } == TERMINAL_RUN_PHASES
    assert {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.SKIPPED,
        TaskState.CANCELLED,
    } == TERMINAL_TASK_STATES
    assert {
        CompensationState.SUCCEEDED,
        CompensationState.FAILED,
        CompensationState.SKIPPED,
    } == TERMINAL_COMPENSATION_STATES


def test_unresolved_task_states_hold_the_run_open() -> None:
    assert {
        TaskState.WAITING,
        TaskState.READY,
        TaskState.AWAITING,
        TaskState.RUNNING,
    } == UNRESOLVED_TASK_STATES


def test_a_released_task_starts_at_once_or_waits_until_dispatched() -> None:
    # the success hot path releases and dispatches in one statement: waiting -> running
    assert TaskState.RUNNING in TASK_TRANSITIONS[TaskState.WAITING]
    assert TaskState.READY in TASK_TRANSITIONS[TaskState.WAITING]
    assert TaskState.RUNNING in TASK_TRANSITIONS[TaskState.READY]


def test_only_a_task_that_has_not_run_can_be_reused() -> None:
    reusable_from = {s for s in TaskState if (TaskState.SUCCEEDED in TASK_TRANSITIONS[s])}
    # an approval gate succeeds from awaiting: people passed it
    assert reusable_from == {
        TaskState.WAITING,
        TaskState.READY,
        TaskState.AWAITING,
        TaskState.RUNNING,
    }


def test_a_retry_goes_from_running_back_to_ready() -> None:
    assert TaskState.READY in TASK_TRANSITIONS[TaskState.RUNNING]
    assert CompensationState.PENDING in COMPENSATION_TRANSITIONS[CompensationState.RUNNING]


def test_only_waiting_tasks_are_skipped() -> None:
    skippable = {s for s in TaskState if (TaskState.SKIPPED in TASK_TRANSITIONS[s])}
    assert skippable == {TaskState.WAITING}


def test_finished_runs_never_move_again() -> None:
    for finished in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED):
        assert not any((target in RUN_TRANSITIONS[finished]) for target in RunPhase)


def test_a_compensator_runs_only_once_triggered() -> None:
    assert (
        CompensationState.RUNNING not in COMPENSATION_TRANSITIONS[CompensationState.NOT_TRIGGERED]
    )
    assert CompensationState.PENDING in COMPENSATION_TRANSITIONS[CompensationState.NOT_TRIGGERED]


def test_run_phases_are_spelled_as_kubernetes_spells_them() -> None:
    assert [str(p) for p in RunPhase] == [
        "Pending",
        "Queued",
        "Running",
        "Succeeded",
        "Failed",
        "Cancelled",
    ]
    assert str(CompensationState.NOT_TRIGGERED) == "not_triggered"


def test_sql_lists_are_sorted_and_quoted() -> None:
    assert sql_list({TaskState.RUNNING, TaskState.READY}) == "('ready', 'running')"
