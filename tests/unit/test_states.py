"""The state machines of runs, tasks and compensators as plain data."""

from __future__ import annotations

from flowforge.domain.states import (
    COMPENSATION_TRANSITIONS,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    TERMINAL_COMPENSATION_STATES,
    TERMINAL_TASK_STATES,
    UNRESOLVED_TASK_STATES,
    CompensationState,
    RunPhase,
    TaskState,
    can_move_compensation,
    can_move_run,
    can_move_task,
    is_terminal_run_phase,
    sql_list,
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
    assert {TaskState.WAITING, TaskState.READY, TaskState.RUNNING} == UNRESOLVED_TASK_STATES


def test_a_released_task_starts_at_once_or_waits_until_dispatched() -> None:
    # the success hot path releases and dispatches in one statement: waiting -> running
    assert can_move_task(TaskState.WAITING, TaskState.RUNNING)
    assert can_move_task(TaskState.WAITING, TaskState.READY)
    assert can_move_task(TaskState.READY, TaskState.RUNNING)


def test_only_a_task_that_has_not_run_can_be_reused() -> None:
    reusable_from = {s for s in TaskState if can_move_task(s, TaskState.SUCCEEDED)}
    assert reusable_from == {TaskState.WAITING, TaskState.READY, TaskState.RUNNING}


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


def test_run_phases_are_spelled_as_kubernetes_spells_them() -> None:
    assert [str(p) for p in RunPhase] == ["Pending", "Running", "Succeeded", "Failed", "Cancelled"]
    assert str(CompensationState.NOT_TRIGGERED) == "not_triggered"


def test_sql_lists_are_sorted_and_quoted() -> None:
    assert sql_list({TaskState.RUNNING, TaskState.READY}) == "('ready', 'running')"
