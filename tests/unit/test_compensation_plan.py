"""How a rollback shows in the WorkflowRun status: summary, progress column, conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowforge.domain.projection import StatusInput, TaskCounts, project_status
from flowforge.domain.run import RUN_STATUS_SCHEMA, CompensationStep, RunStatus
from flowforge.domain.states import CompensationState, RunPhase

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
COUNTS = TaskCounts(total=3, succeeded=2, failed=1)


def _step(
    name: str, compensates: str, state: CompensationState, *, attempt: int = 1, message: str = ""
) -> CompensationStep:
    return CompensationStep(
        name=name, compensates=compensates, state=state, attempt=attempt, message=message
    )


def _body(phase: RunPhase, steps: list[CompensationStep], *, compensating: bool) -> dict[str, Any]:
    return project_status(
        StatusInput(
            phase=phase,
            counts=COUNTS,
            fingerprint="sha256:" + "0" * 64,
            started_at=NOW,
            finished_at=None if compensating else NOW,
            now=NOW,
            failure_message="task ship failed",
            compensation=steps,
            compensating=compensating,
        )
    )


def _condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in body["conditions"] if c["type"] == kind)


def test_a_rollback_in_progress_shows_in_the_progress_column_and_names_the_current_step() -> None:
    body = _body(
        RunPhase.RUNNING,
        [
            _step("refund", "charge", CompensationState.SUCCEEDED),
            _step("release", "reserve", CompensationState.RUNNING),
        ],
        compensating=True,
    )
    assert body["progress"] == "2/3 compensating 1/2"
    assert body["compensation"]["active"] is True
    assert body["compensation"]["current"] == "release"
    assert [step["state"] for step in body["compensation"]["steps"]] == ["succeeded", "running"]
    compensating = _condition(body, "Compensating")
    assert (compensating["status"], compensating["reason"]) == ("True", "RollingBack")
    assert "release" in compensating["message"] and "step 2 of 2" in compensating["message"]
    assert body["message"].startswith("rolling back")
    RunStatus.model_validate(body)  # what the CRD's schema accepts
    assert "compensation" in RUN_STATUS_SCHEMA["properties"]


def test_a_halted_rollback_names_the_failed_compensator_and_what_it_left_undone() -> None:
    body = _body(
        RunPhase.FAILED,
        [
            _step("undo-c", "c", CompensationState.SUCCEEDED),
            _step("undo-b", "b", CompensationState.FAILED, attempt=2, message="exit code 3"),
            _step("undo-a", "a", CompensationState.SKIPPED, attempt=0),
        ],
        compensating=False,
    )
    assert body["progress"] == "2/3"
    failed = _condition(body, "CompensationFailed")
    assert (failed["status"], failed["reason"]) == ("True", "CompensatorFailed")
    assert failed["message"] == (
        "compensator undo-b (undoing b) failed after 2 attempts: "
        "exit code 3; rollback halted, not run: undo-a"
    )
    assert body["message"] == f"task ship failed; {failed['message']}"
    assert _condition(body, "Compensating")["reason"] == "CompensationFailed"


def test_a_run_without_a_rollback_has_no_compensation_conditions() -> None:
    body = _body(RunPhase.FAILED, [], compensating=False)
    assert "compensation" not in body
    assert {c["type"] for c in body["conditions"]} == {
        "Ready",
        "Progressing",
        "Failed",
        "Cancelled",
        "Stalled",
        "Completed",
    }
