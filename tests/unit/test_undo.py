"""``compensateOn: Attempted``: who is undone, why, in what order, and what the Job is told."""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.execution import AttemptOutcome, OutcomeReason, job_outcome
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.states import TaskRole, TaskState
from flowforge.domain.undo import (
    UNDO_OF_ENV,
    CompensateOn,
    UndoOf,
    container_started,
    rollback_order,
    undo_of,
    undoes_attempted,
)
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.kube.jobs import JobRequest, build_job
from tests.unit.domain_builders import spec, task


def _failed(reason: OutcomeReason, exit_code: int | None = None) -> AttemptOutcome:
    return AttemptOutcome(succeeded=False, reason=reason, exit_code=exit_code)


@pytest.mark.parametrize(
    ("outcome", "started"),
    [
        (_failed(OutcomeReason.EXIT_CODE, 3), True),
        (_failed(OutcomeReason.DEADLINE_EXCEEDED), True),
        (_failed(OutcomeReason.JOB_FAILED, 137), True),
        # a Job that failed and whose Pods no longer tell an exit code: not known to have run
        (_failed(OutcomeReason.JOB_FAILED), False),
        (_failed(OutcomeReason.IMAGE_PULL_BACK_OFF), False),
        (_failed(OutcomeReason.UNSCHEDULABLE), False),
        (_failed(OutcomeReason.POD_NOT_STARTED), False),
        (_failed(OutcomeReason.JOB_REFUSED), False),
        (_failed(OutcomeReason.ADMISSION_TIMEOUT), False),
        (_failed(OutcomeReason.LOST), False),
        (AttemptOutcome(succeeded=True, reason=OutcomeReason.COMPLETED, exit_code=0), True),
    ],
)
def test_whether_the_container_started_is_read_from_how_the_attempt_ended(
    outcome: AttemptOutcome, started: bool
) -> None:
    assert container_started(outcome) is started


def test_a_job_that_failed_with_an_exit_code_started_and_a_bare_failure_did_not() -> None:
    status = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimit"}]}
    from flowforge.domain.execution import TerminatedContainer

    ran = job_outcome(status, TerminatedContainer(exit_code=2))
    bare = job_outcome(status)
    assert ran is not None and bare is not None
    assert container_started(ran) and not container_started(bare)


@pytest.mark.parametrize(
    ("state", "started", "on", "expected"),
    [
        (TaskState.SUCCEEDED, False, CompensateOn.SUCCEEDED, UndoOf.SUCCEEDED),
        (TaskState.SUCCEEDED, False, CompensateOn.ATTEMPTED, UndoOf.SUCCEEDED),
        (TaskState.FAILED, True, CompensateOn.ATTEMPTED, UndoOf.ATTEMPTED),
        (TaskState.FAILED, True, CompensateOn.SUCCEEDED, None),
        (TaskState.FAILED, False, CompensateOn.ATTEMPTED, None),  # its Pod never started
        (TaskState.SKIPPED, False, CompensateOn.ATTEMPTED, None),
        (TaskState.CANCELLED, True, CompensateOn.ATTEMPTED, None),
    ],
)
def test_who_is_undone_and_why(
    state: TaskState, started: bool, on: CompensateOn, expected: UndoOf | None
) -> None:
    assert undo_of(forward_state=state, started=started, compensate_on=on) is expected


def test_attempted_tasks_are_undone_first_then_the_succeeded_in_reverse_order() -> None:
    graph = DependencyGraph({"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": ["d"]})
    compensators = {key: f"undo-{key}" for key in "abcde"}

    order = rollback_order(
        graph, succeeded={"a", "b", "d"}, attempted={"c", "e"}, compensators=compensators
    )

    assert order == ("undo-e", "undo-c", "undo-d", "undo-b", "undo-a")


def test_compensate_on_is_part_of_the_definition_and_its_fingerprint() -> None:
    plain = spec(task("charge"), task("refund", compensateFor="charge"))
    explicit = spec(
        task("charge"), task("refund", compensateFor="charge", compensateOn="Succeeded")
    )
    attempted = spec(
        task("charge"), task("refund", compensateFor="charge", compensateOn="Attempted")
    )

    parsed = parse_definition(attempted)
    assert undoes_attempted(parsed) == ["refund"]
    assert undoes_attempted(parse_definition(plain)) == []
    # the default spelled out changes nothing a run does, so nor the fingerprint
    assert parse_definition(explicit).fingerprint == parse_definition(plain).fingerprint
    assert parsed.fingerprint != parse_definition(plain).fingerprint
    assert parsed.to_document()["tasks"][1]["compensateOn"] == "Attempted"


@pytest.mark.parametrize(
    ("tasks", "error"),
    [
        (
            [task("charge", compensateOn="Attempted")],
            ("compensation", "spec.tasks[0].compensateOn"),
        ),
        (
            [task("charge"), task("refund", compensateFor="charge", compensateOn="Always")],
            ("schema", "spec.tasks[1].compensateOn"),
        ),
    ],
)
def test_a_misplaced_or_unknown_compensate_on_is_refused_naming_the_field(
    tasks: list[dict[str, Any]], error: tuple[str, str]
) -> None:
    verdict = [(e.kind, e.path) for e in validate_spec(spec(*tasks))]
    assert verdict == [error]


def _env(request: JobRequest) -> dict[str, str]:
    container = build_job(request)["spec"]["template"]["spec"]["containers"][0]
    return {entry["name"]: entry.get("value", "") for entry in container["env"]}


def test_a_compensator_job_is_told_what_it_undoes() -> None:
    request = JobRequest(
        namespace="team",
        run_name="pay-1",
        run_uid="uid-1",
        task_key="refund",
        attempt=1,
        role=TaskRole.COMPENSATION,
        template={"image": "busybox", "env": [{"name": UNDO_OF_ENV, "value": "forged"}]},
        undo_of=UndoOf.ATTEMPTED,
    )
    forward = JobRequest(
        namespace="team",
        run_name="pay-1",
        run_uid="uid-1",
        task_key="charge",
        attempt=1,
        role=TaskRole.FORWARD,
        template={"image": "busybox"},
    )

    assert _env(request)[UNDO_OF_ENV] == "attempted"
    assert UNDO_OF_ENV not in _env(forward)
