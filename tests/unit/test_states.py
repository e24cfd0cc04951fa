"""The state machines of runs, tasks and compensators as plain data."""

from __future__ import annotations

from flowforge.domain.states import (
    COMPENSATION_TRANSITIONS,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskState,
    can_move_compensation,
    can_move_run,
    can_move_task,
    is_terminal_compensation_state,
    is_terminal_run_phase,
    is_terminal_task_state,
)


def test_every_state_has_a_transition_entry() -> None:
    assert set(RUN_TRANSITIONS) == set(RunPhase)
    assert set(TASK_TRANSITIONS) == set(TaskState)
    assert set(COMPENSATION_TRANSITIONS) == set(CompensationState)


def test_terminal_states_are_exactly_those_without_a_way_out() -> None:
    assert {p for p in RunPhase if is_terminal_run_phase(p)} == {
        RunPhase.SUCCEEDED,
        RunPhase.FAILED,
        RunPhase.CANCELLED,
    }
    assert {s for s in TaskState if is_terminal_task_state(s)} == {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.SKIPPED,
        TaskState.CANCELLED,
    }
    assert {s for s in CompensationState if is_terminal_compensation_state(s)} == {
        CompensationState.SUCCEEDED,
        CompensationState.FAILED,
        CompensationState.SKIPPED,
    }


def test_unresolved_task_states_hold_the_run_open() -> None:
    assert {TaskState.WAITING, TaskState.READY, TaskState.RUNNING} == UNRESOLVED_TASK_STATES


def test_a_waiting_task_cannot_start_before_it_is_released() -> None:
    assert not can_move_task(TaskState.WAITING, TaskState.RUNNING)
    assert can_move_task(TaskState.WAITING, TaskState.READY)
    assert can_move_task(TaskState.READY, TaskState.RUNNING)


def test_a_retry_goes_from_running_back_to_ready() -> None:
    assert can_move_task(TaskState.RUNNING, TaskState.READY)
    assert can_move_compensation(CompensationState.RUNNING, CompensationState.PENDING)


def test_only_waiting_tasks_are_skipped() -> None:
    skippable = {s for s in TaskState if can_move_task(s, TaskState.SKIPPED)}
    assert skippable == {TaskState.WAITING}


def test_finished_runs_never_move_again() -> None:
    for finished in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED):
        assert not any(can_move_run(finished, target) for target in RunPhase)


def test_a_compensator_runs_only_once_triggered() -> None:
    assert not can_move_compensation(CompensationState.NOT_TRIGGERED, CompensationState.RUNNING)
    assert can_move_compensation(CompensationState.NOT_TRIGGERED, CompensationState.PENDING)


def test_state_values_are_the_lower_case_strings_stored_in_postgresql() -> None:
    assert [str(p) for p in RunPhase] == [
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert str(CompensationState.NOT_TRIGGERED) == "not_triggered"
