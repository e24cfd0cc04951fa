"""Task types that queue through Kueue: the definition fields, the Job manifest, how a Job's
admission is read, the admission timeout and what people see (admitting, never running)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flowforge.domain.errors import InvalidDefinitionError
from flowforge.domain.execution import OutcomeReason
from flowforge.domain.kueue import (
    admission_timeout_outcome,
    job_admission,
    queued_task_keys,
    queueing,
    shown_state,
)
from flowforge.domain.projection import StatusInput, TaskCounts, progress_text, project_status
from flowforge.domain.states import RunPhase, ShownTaskState, TaskRole
from flowforge.domain.validation import parse_definition, validate_spec
from flowforge.kube.jobs import JobRequest, build_job

IMAGE = {"image": "busybox:1.36"}
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def spec(**top: Any) -> dict[str, Any]:
    return {
        "workflow": "w",
        "version": 1,
        "taskTypes": {
            "queued": {**IMAGE, "queueName": "team-a", "workloadPriorityClass": "high"},
            "plain": dict(IMAGE),
        },
        "tasks": [
            {"key": "a", "type": "queued"},
            {"key": "b", "type": "plain"},
            {"key": "undo-a", "type": "queued", "compensateFor": "a"},
        ],
        **top,
    }


def test_a_task_type_names_its_local_queue_and_priority_class() -> None:
    definition = parse_definition(spec())
    assert queueing(definition, "queued") is not None
    queued = queueing(definition, "queued")
    assert queued is not None and queued.queue_name == "team-a"
    assert queued.priority_class == "high" and queued.admission_timeout_seconds is None
    assert queueing(definition, "plain") is None
    assert queued_task_keys(definition) == ["a", "undo-a"]


def test_the_definition_is_the_default_of_types_that_name_no_queue() -> None:
    definition = parse_definition(
        spec(queueName="shared", workloadPriorityClass="low", admissionTimeoutSeconds=60)
    )
    plain = queueing(definition, "plain")
    assert plain is not None
    assert (plain.queue_name, plain.priority_class, plain.admission_timeout_seconds) == (
        "shared",
        "low",
        60,
    )
    own = queueing(definition, "queued")
    assert own is not None and (own.queue_name, own.priority_class) == ("team-a", "high")
    assert own.admission_timeout_seconds == 60
    assert queued_task_keys(definition) == ["a", "b", "undo-a"]


def test_kueue_fields_change_the_fingerprint_and_absent_ones_do_not() -> None:
    base = parse_definition(spec()).fingerprint
    assert parse_definition(spec(queueName="shared")).fingerprint != base
    document = spec()
    document["taskTypes"]["queued"]["admissionTimeoutSeconds"] = 30
    assert parse_definition(document).fingerprint != base


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        ("queueName", "Team_A", "spec.queueName"),
        ("queueName", "x" * 64, "spec.queueName"),
        ("workloadPriorityClass", "", "spec.workloadPriorityClass"),
        ("admissionTimeoutSeconds", 0, "spec.admissionTimeoutSeconds"),
        ("admissionTimeoutSeconds", "60", "spec.admissionTimeoutSeconds"),
    ],
)
def test_a_bad_kueue_field_is_refused_naming_it(field: str, value: Any, path: str) -> None:
    errors = validate_spec(spec(**{field: value}))
    assert errors and all(error.path == path for error in errors), errors
    with pytest.raises(InvalidDefinitionError):
        parse_definition(spec(**{field: value}))
    document = spec()
    document["taskTypes"]["plain"][field] = value
    type_errors = validate_spec(document)
    assert type_errors and type_errors[0].path == f"spec.taskTypes[plain].{field}", type_errors


def job_for(**queue: str) -> dict[str, Any]:
    return build_job(
        JobRequest(
            namespace="team-a",
            run_name="r",
            run_uid="uid",
            task_key="t",
            attempt=1,
            role=TaskRole.FORWARD,
            template=IMAGE,
            timeout_seconds=30,
            **queue,  # type: ignore[arg-type]
        )
    )


def test_a_queued_job_is_created_suspended_with_kueues_labels() -> None:
    job = job_for(queue_name="team-a", priority_class="high")
    assert job["spec"]["suspend"] is True
    assert job["spec"]["podReplacementPolicy"] == "Failed"  # a Pod an eviction deletes
    assert job["spec"]["backoffLimit"] == 0  # ... is no failure; a failed Pod still is
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    # Kueue's labels belong to the Job (its Workload), not to the Pod
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert job["spec"]["activeDeadlineSeconds"] == 30  # restarts when Kueue resumes the Job


def test_a_job_that_queues_nowhere_is_unchanged() -> None:
    job = job_for()
    assert "suspend" not in job["spec"] and "podReplacementPolicy" not in job["spec"]
    assert not any(key.startswith("kueue.x-k8s.io/") for key in job["metadata"]["labels"])
    assert job_admission(job) is None


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_suspended_job_waits_since_it_was_suspended() -> None:
    job = job_for(queue_name="q")
    job["metadata"]["creationTimestamp"] = _stamp(T0)
    fresh = job_admission(job)
    assert fresh is not None and fresh.suspended and fresh.since == T0
    evicted_at = T0 + timedelta(seconds=40)
    job["status"] = {
        "conditions": [
            {"type": "Suspended", "status": "True", "lastTransitionTime": _stamp(evicted_at)}
        ]
    }
    evicted = job_admission(job)
    assert evicted is not None and evicted.suspended and evicted.since == evicted_at
    # suspended again before the Job controller noticed: since just now, not its creation
    job["status"]["conditions"][0]["status"] = "False"
    again = job_admission(job)
    assert again is not None and again.suspended and again.since is None


def test_an_admitted_job_runs_since_its_start_time() -> None:
    job = job_for(queue_name="q")
    job["spec"]["suspend"] = False
    resumed = T0 + timedelta(seconds=7)
    job["status"] = {
        "startTime": _stamp(resumed),
        "conditions": [
            {"type": "Suspended", "status": "False", "lastTransitionTime": _stamp(resumed)}
        ],
    }
    admitted = job_admission(job)
    assert admitted is not None and not admitted.suspended and admitted.since == resumed


def test_the_admission_timeout_fails_only_after_it_is_over_and_says_why() -> None:
    early = admission_timeout_outcome(
        job="j", queue="q", timeout_seconds=60, waiting_since=T0, now=T0 + timedelta(seconds=59)
    )
    assert early is None
    outcome = admission_timeout_outcome(
        job="j", queue="team-a", timeout_seconds=60, waiting_since=T0, now=T0 + timedelta(0, 61)
    )
    assert outcome is not None and not outcome.succeeded
    assert outcome.reason is OutcomeReason.ADMISSION_TIMEOUT
    assert "not admitted by Kueue (LocalQueue team-a)" in outcome.message
    assert "admissionTimeoutSeconds (60 s)" in outcome.message


def test_a_running_task_whose_job_is_not_admitted_is_shown_admitting() -> None:
    assert (
        shown_state("running", admission_required=True, admitted=False) is ShownTaskState.ADMITTING
    )
    assert shown_state("running", admission_required=True, admitted=True) is ShownTaskState.RUNNING
    assert (
        shown_state("running", admission_required=False, admitted=False) is ShownTaskState.RUNNING
    )
    assert shown_state("ready", admission_required=True, admitted=False) is ShownTaskState.READY


def test_admitting_tasks_are_counted_apart_from_running_ones() -> None:
    counts = TaskCounts(total=6, running=6).with_admitting(4)
    assert (counts.running, counts.admitting, counts.unresolved) == (2, 4, 6)
    assert progress_text(counts) == "0/6 (4 admitting)"
    status = project_status(
        StatusInput(
            phase=RunPhase.RUNNING,
            counts=counts,
            fingerprint="sha256:" + "0" * 64,
            started_at=T0,
            finished_at=None,
            now=T0,
        )
    )
    assert status["counts"]["running"] == 2 and status["counts"]["admitting"] == 4
    assert "2 running" in status["message"] and "4 admitting" in status["message"]
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert "2 running, 4 admitting" in progressing["message"]


@pytest.mark.parametrize("queue", [{}, {"queue_name": "team-a", "priority_class": "low"}])
def test_a_templates_own_kueue_labels_never_reach_the_job(queue: dict[str, str]) -> None:
    """Only queueName and workloadPriorityClass (which the namespace policy governs) say
    how a Job queues: jobMetadata cannot pick another queue, priority or Workload."""
    template = {
        **IMAGE,
        "jobMetadata": {
            "labels": {
                "kueue.x-k8s.io/queue-name": "other-team",
                "kueue.x-k8s.io/priority-class": "urgent",
                "team": "a",
            },
            "annotations": {"kueue.x-k8s.io/prebuilt-workload-name": "theirs", "note": "x"},
        },
    }
    job = build_job(
        JobRequest(
            namespace="team-a",
            run_name="r",
            run_uid="u",
            task_key="t",
            attempt=1,
            role=TaskRole.FORWARD,
            template=template,
            **queue,  # type: ignore[arg-type]
        )
    )
    labels, annotations = job["metadata"]["labels"], job["metadata"]["annotations"]
    kueue_labels = {k: v for k, v in labels.items() if k.startswith("kueue.x-k8s.io/")}
    expected = (
        {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "low"}
        if queue
        else {}
    )
    assert kueue_labels == expected
    assert labels["team"] == "a" and annotations["note"] == "x"
    assert not any(key.startswith("kueue.x-k8s.io/") for key in annotations)
