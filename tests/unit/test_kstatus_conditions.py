"""The conditions kstatus (Flux, kpt, Helm's --wait) reads, per phase: Reconciling while a
run goes on (with why), Stalled when it ended badly (with the run's message), neither when
it succeeded; Completed in every final phase; the same convention for definitions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.definition_status import definition_conditions
from flowforge.domain.projection import (
    StatusInput,
    TaskCounts,
    project_status,
    refused_status,
)
from flowforge.domain.run import CompensationStep, QueueStatus, RunStatus
from flowforge.domain.states import CompensationState, RunPhase
from flowforge.operator.publishing import PublishOutcome

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STARTED = NOW - timedelta(minutes=5)


def _status(phase: RunPhase, counts: TaskCounts, **extra: Any) -> dict[str, Any]:
    finished = phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)
    body = project_status(
        StatusInput(
            phase=phase,
            counts=counts,
            fingerprint="sha256:" + "0" * 64,
            started_at=STARTED,
            finished_at=NOW if finished else None,
            now=NOW,
            observed_generation=2,
            **extra,
        )
    )
    RunStatus.model_validate(body)  # what the CRD's schema takes
    return body


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["conditions"]}


RUNNING = TaskCounts(total=3, succeeded=1, running=1, waiting=1)


@pytest.mark.parametrize(
    ("phase", "counts", "extra", "reason"),
    [
        (RunPhase.PENDING, TaskCounts(total=3, waiting=3), {}, "Pending"),
        (
            RunPhase.QUEUED,
            TaskCounts(total=3, waiting=3),
            {"queue": QueueStatus(reason="NamespaceRunLimit", position=2, message="2nd")},
            "Queued",
        ),
        (RunPhase.RUNNING, RUNNING, {}, "TasksRunning"),
        (RunPhase.RUNNING, TaskCounts(total=3, succeeded=1, admitting=2), {}, "Admitting"),
        (RunPhase.RUNNING, RUNNING, {"cancel_requested": True}, "Cancelling"),
        (
            RunPhase.RUNNING,
            TaskCounts(total=3, succeeded=2, failed=1),
            {"compensating": True, "cancel_requested": True},
            "Compensating",
        ),
    ],
)
def test_an_unfinished_run_is_reconciling_with_why_and_not_completed(
    phase: RunPhase, counts: TaskCounts, extra: dict[str, Any], reason: str
) -> None:
    body = _status(phase, counts, **extra)
    conditions = _conditions(body)
    reconciling = conditions["Reconciling"]
    assert (reconciling["status"], reconciling["reason"]) == ("True", reason)
    assert reconciling["message"] == body["message"]
    assert reconciling["lastTransitionTime"] == "2026-11-30T11:55:00Z"
    assert (conditions["Completed"]["status"], conditions["Completed"]["reason"]) == (
        "False",
        phase.value,
    )
    assert "Stalled" not in conditions
    assert conditions["Ready"]["status"] == "False"
    assert body["observedGeneration"] == 2


def test_a_succeeded_run_is_ready_and_completed_and_neither_reconciling_nor_stalled() -> None:
    conditions = _conditions(_status(RunPhase.SUCCEEDED, TaskCounts(total=3, succeeded=3)))
    assert conditions["Ready"]["status"] == "True"
    completed = conditions["Completed"]
    assert (completed["status"], completed["reason"]) == ("True", "Succeeded")
    assert completed["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    assert "Reconciling" not in conditions and "Stalled" not in conditions


@pytest.mark.parametrize("phase", [RunPhase.FAILED, RunPhase.CANCELLED])
def test_a_failed_or_cancelled_run_is_stalled_with_its_message_and_completed(
    phase: RunPhase,
) -> None:
    steps = [
        CompensationStep(
            name="undo-b", compensates="b", state=CompensationState.SUCCEEDED, attempt=1
        )
    ]
    body = _status(
        phase,
        TaskCounts(total=3, succeeded=1, failed=1, cancelled=1),
        failure_message="task c failed: exit code 3",
        compensation=steps,
        cancel_requested=phase is RunPhase.CANCELLED,
    )
    conditions = _conditions(body)
    stalled = conditions["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", phase.value)
    assert stalled["message"] == body["message"]
    assert ("task c failed" in stalled["message"]) is (phase is RunPhase.FAILED)
    assert (conditions["Completed"]["status"], conditions["Completed"]["reason"]) == (
        "True",
        phase.value,
    )
    assert conditions["Ready"]["status"] == "False"
    assert "Reconciling" not in conditions
    # the conditions users read today stay
    assert {"Progressing", "Failed", "Cancelled", "Compensating"} <= set(conditions)


def test_a_refused_run_is_failed_stalled_and_completed_with_why() -> None:
    body = refused_status(message="workflow etl has no version 9", now=NOW, generation=1)
    RunStatus.model_validate(body)
    conditions = _conditions(body)
    assert body["phase"] == "Failed" and body["observedGeneration"] == 1
    assert conditions["Ready"]["status"] == "False"
    for kind in ("Stalled", "Completed", "Failed"):
        assert conditions[kind]["status"] == "True"
        assert conditions[kind]["reason"] == "DefinitionRefused"
        assert conditions[kind]["message"] == "workflow etl has no version 9"


def test_a_published_definition_is_ready_and_a_refused_one_stalled_with_why() -> None:
    published = definition_conditions(published=True, message="published", generation=1, now=NOW)
    assert [(c["type"], c["status"], c["reason"]) for c in published] == [
        ("Ready", "True", "Published")
    ]
    refused = definition_conditions(
        published=False, message="not published: spec.tasks[0].type", generation=1, now=NOW
    )
    assert [(c["type"], c["status"], c["reason"]) for c in refused] == [
        ("Ready", "False", "NotPublished"),
        ("Stalled", "True", "NotPublished"),
    ]
    assert all(c["message"] == "not published: spec.tasks[0].type" for c in refused)


def test_a_definition_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = definition_conditions(published=True, message="published", generation=1, now=NOW)
    later = NOW + timedelta(hours=1)
    again = definition_conditions(
        published=True, message="published", generation=1, now=later, shown=first
    )
    assert again == first  # an unchanged object is not patched again
    flipped = definition_conditions(
        published=False, message="not published: x", generation=1, now=later, shown=first
    )
    assert flipped[0]["lastTransitionTime"] == "2026-11-30T13:00:00Z"


def test_the_definition_status_carries_the_conditions() -> None:
    status = PublishOutcome(definition=None, message="not published: bad").status(3)
    assert status["observedGeneration"] == 3
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Stalled"}
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
