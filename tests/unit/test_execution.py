"""Pure decisions of the run engine: names, backoff, outcomes, phases, status projection."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from flowforge.domain.execution import (
    BackoffPolicy,
    OutcomeReason,
    TerminatedContainer,
    attempts_made,
    config_map_name,
    jitter_unit,
    job_name,
    job_outcome,
    lost_outcome,
    may_retry,
    refused_outcome,
    retry_delay,
)
from flowforge.domain.projection import (
    STATUS_TASK_SUMMARY_LIMIT,
    StatusInput,
    TaskCounts,
    progress_text,
    project_status,
    settled_phase,
)
from flowforge.domain.run import TaskSummary
from flowforge.domain.states import RunPhase, TaskRole, TaskState
from flowforge.kube.jobs import (
    JobIdentity,
    JobRequest,
    build_job,
    label_value,
    parameter_env_name,
)

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_job_name_is_readable_for_short_names() -> None:
    name = job_name(
        run_name="etl-1", run_uid="u1", task_key="extract", attempt=2, role=TaskRole.FORWARD
    )
    assert name.startswith("etl-1-extract-2-")
    compensation = job_name(
        run_name="etl-1", run_uid="u1", task_key="extract", attempt=1, role=TaskRole.COMPENSATION
    )
    assert compensation.startswith("etl-1-c-extract-1-")


def test_job_names_differ_where_concatenations_collide() -> None:
    one = job_name(run_name="a-b", run_uid="u", task_key="c", attempt=1, role=TaskRole.FORWARD)
    other = job_name(run_name="a", run_uid="u", task_key="b-c", attempt=1, role=TaskRole.FORWARD)
    assert one != other


def test_a_recreated_run_gets_new_job_names() -> None:
    first = job_name(run_name="r", run_uid="uid-1", task_key="t", attempt=1, role=TaskRole.FORWARD)
    second = job_name(run_name="r", run_uid="uid-2", task_key="t", attempt=1, role=TaskRole.FORWARD)
    assert first != second


@given(
    run_name=st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", fullmatch=True),
    task_key=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?", fullmatch=True),
    attempt=st.integers(min_value=1, max_value=1000),
    role=st.sampled_from(list(TaskRole)),
)
def test_job_names_are_dns_labels_within_63_characters(
    run_name: str, task_key: str, attempt: int, role: TaskRole
) -> None:
    name = job_name(run_name=run_name, run_uid="uid", task_key=task_key, attempt=attempt, role=role)
    assert len(name) <= 63
    assert DNS_1123_LABEL.match(name), name
    assert name == job_name(
        run_name=run_name, run_uid="uid", task_key=task_key, attempt=attempt, role=role
    )


def test_first_retry_waits_between_one_and_one_and_a_half_seconds() -> None:
    policy = BackoffPolicy()
    assert retry_delay(failed_attempts=1, policy=policy, unit=0.0) == timedelta(seconds=1)
    assert retry_delay(failed_attempts=1, policy=policy, unit=0.999) < timedelta(seconds=1.5)
    assert retry_delay(failed_attempts=2, policy=policy, unit=0.0) == timedelta(seconds=2)
    assert retry_delay(failed_attempts=40, policy=policy, unit=0.0) == timedelta(seconds=300)


@given(failed=st.integers(min_value=1, max_value=200), unit=st.floats(0.0, 0.999999))
def test_backoff_grows_and_stays_within_cap_plus_jitter(failed: int, unit: float) -> None:
    policy = BackoffPolicy(first_delay_seconds=0.5, cap_seconds=60, jitter=0.5)
    delay = retry_delay(failed_attempts=failed, policy=policy, unit=unit)
    following = retry_delay(failed_attempts=failed + 1, policy=policy, unit=unit)
    assert timedelta(seconds=0.5) <= delay <= following <= timedelta(seconds=90)


def test_jitter_is_the_same_for_the_same_attempt() -> None:
    first = jitter_unit(run_uid="u", task_key="t", attempt=1)
    assert first == jitter_unit(run_uid="u", task_key="t", attempt=1)
    assert 0.0 <= first < 1.0
    assert first != jitter_unit(run_uid="u", task_key="t", attempt=2)


def test_retries_count_extra_attempts() -> None:
    assert not may_retry(attempt=1, retries=0)
    assert may_retry(attempt=1, retries=2)
    assert may_retry(attempt=2, retries=2)
    assert not may_retry(attempt=3, retries=2)


def test_a_refusal_in_a_terminating_namespace_is_never_retried() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    refused = refused_outcome(job="j", message="forbidden", now=now)
    assert refused.reason is OutcomeReason.JOB_REFUSED and refused.retried
    ending = refused_outcome(job="j", message="terminated", now=now, namespace_terminating=True)
    assert ending.reason is OutcomeReason.NAMESPACE_TERMINATING and not ending.retried


def test_unfinished_job_has_no_outcome() -> None:
    assert job_outcome({"active": 1}) is None
    assert job_outcome({"conditions": [{"type": "Failed", "status": "False"}]}) is None


def test_complete_job_is_success() -> None:
    outcome = job_outcome(
        {
            "startTime": "2026-11-30T12:00:00Z",
            "completionTime": "2026-11-30T12:00:03Z",
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True"},
                {"type": "Complete", "status": "True"},
            ],
        }
    )
    assert outcome is not None and outcome.succeeded
    assert outcome.reason is OutcomeReason.COMPLETED
    assert outcome.exit_code == 0
    assert outcome.finished_at == NOW + timedelta(seconds=3)


def test_deadline_is_a_timeout() -> None:
    outcome = job_outcome(
        {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ]
        }
    )
    assert outcome is not None and not outcome.succeeded
    assert outcome.reason is OutcomeReason.DEADLINE_EXCEEDED


def test_failed_job_carries_the_container_exit_code() -> None:
    outcome = job_outcome(
        {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]},
        TerminatedContainer(exit_code=3, reason="Error"),
    )
    assert outcome is not None
    assert outcome.reason is OutcomeReason.EXIT_CODE
    assert outcome.exit_code == 3
    assert "exit code 3" in outcome.message
    without_pod = job_outcome(
        {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    )
    assert without_pod is not None and without_pod.reason is OutcomeReason.JOB_FAILED


def test_lost_outcome_has_its_own_reason() -> None:
    outcome = lost_outcome(job="j-1", now=NOW)
    assert not outcome.succeeded and outcome.reason is OutcomeReason.LOST
    assert "j-1" in outcome.message


def test_phase_from_counts() -> None:
    running = TaskCounts(total=4, running=1, succeeded=3)
    assert settled_phase(counts=running, cancel_requested=False) is RunPhase.RUNNING
    assert settled_phase(counts=running, cancel_requested=True) is RunPhase.RUNNING
    done = TaskCounts(total=4, succeeded=4)
    assert settled_phase(counts=done, cancel_requested=False) is RunPhase.SUCCEEDED
    failed = TaskCounts(total=4, succeeded=2, failed=1, skipped=1)
    assert settled_phase(counts=failed, cancel_requested=False) is RunPhase.FAILED
    cancelled = TaskCounts(total=4, succeeded=1, cancelled=3)
    assert settled_phase(counts=cancelled, cancel_requested=True) is RunPhase.CANCELLED
    assert progress_text(failed) == "2/4"


def _status(task_count: int) -> StatusInput:
    tasks = [
        TaskSummary(name=f"t{i}", state=TaskState.SUCCEEDED, attempt=1, job_name=f"j{i}")
        for i in range(task_count)
    ]
    return StatusInput(
        phase=RunPhase.SUCCEEDED,
        counts=TaskCounts(total=task_count, succeeded=task_count),
        fingerprint="sha256:" + "0" * 64,
        started_at=NOW,
        finished_at=NOW + timedelta(seconds=5),
        now=NOW,
        tasks=tasks,
    )


def test_status_projection_of_a_small_run_lists_tasks() -> None:
    body = project_status(_status(4))
    assert body["phase"] == "Succeeded"
    assert body["progress"] == "4/4"
    assert body["counts"]["succeeded"] == 4
    assert body["startedAt"] == "2026-11-30T12:00:00Z"
    assert body["definitionFingerprint"].startswith("sha256:")
    assert body["tasksTruncated"] is False
    assert body["tasks"][0]["jobName"] == "j0"
    assert len(body["tasks"]) == 4
    ready = next(c for c in body["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Succeeded"


def test_status_projection_stays_small_for_a_huge_run() -> None:
    small = project_status(_status(STATUS_TASK_SUMMARY_LIMIT))
    assert len(small["tasks"]) == STATUS_TASK_SUMMARY_LIMIT
    huge = project_status(_status(10_000))
    assert huge["tasks"] == [] and huge["tasksTruncated"] is True
    assert huge["counts"]["total"] == 10_000
    assert len(json.dumps(huge)) < 4_000


def test_job_manifest() -> None:
    request = JobRequest(
        namespace="ns",
        run_name="etl-1",
        run_uid="uid-1",
        task_key="extract",
        attempt=1,
        role=TaskRole.FORWARD,
        template={
            "image": "busybox",
            "command": ["sh"],
            "env": [{"name": "A", "value": "1"}],
            "annotations": {"flowforge.io/simulate-exit-code": "3"},
            "labels": {"team": "data"},
            "serviceAccountName": "runner",
        },
        config={"source": "s3://b"},
        parameters={"date": "2026-11-30", "n": 3},
        timeout_seconds=60,
    )
    job = build_job(request)
    metadata = job["metadata"]
    assert metadata["name"] == request.name
    assert metadata["labels"]["flowforge.io/run"] == "etl-1"
    assert metadata["labels"]["flowforge.io/attempt"] == "1"
    assert metadata["labels"]["flowforge.io/role"] == "forward"
    assert metadata["labels"]["app.kubernetes.io/managed-by"] == "flowforge"
    owner = metadata["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["controller"] and owner["blockOwnerDeletion"]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 60
    pod = spec["template"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == "runner"
    assert pod["metadata"]["annotations"]["flowforge.io/simulate-exit-code"] == "3"
    assert pod["metadata"]["labels"]["team"] == "data"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["A"] == "1"
    assert env["FLOWFORGE_TASK"] == "extract" and env["FLOWFORGE_ATTEMPT"] == "1"
    assert env["FLOWFORGE_PARAM_DATE"] == "2026-11-30" and env["FLOWFORGE_PARAM_N"] == "3"
    # the config and the parameters are files of the run's ConfigMap, not env blobs
    assert "FLOWFORGE_CONFIG" not in env and "FLOWFORGE_PARAMETERS" not in env
    assert env["FLOWFORGE_CONFIG_FILE"] == "/etc/flowforge/config.json"
    assert env["FLOWFORGE_PARAMETERS_FILE"] == "/etc/flowforge/parameters.json"
    container = pod["spec"]["containers"][0]
    assert container["volumeMounts"] == [
        {"name": "flowforge-run-files", "mountPath": "/etc/flowforge", "readOnly": True}
    ]
    (volume,) = pod["spec"]["volumes"]
    assert volume["name"] == "flowforge-run-files"
    assert volume["configMap"]["name"] == config_map_name(run_name="etl-1", run_uid="uid-1")
    assert volume["configMap"]["items"] == [
        {"key": "parameters.json", "path": "parameters.json"},
        {"key": "config.extract.json", "path": "config.json"},
    ]


def test_label_values_fit() -> None:
    assert label_value("etl-1") == "etl-1"
    long_value = label_value("r" * 200)
    assert len(long_value) <= 63
    assert label_value("r" * 200) != label_value("r" * 199)
    assert parameter_env_name("batch-size") == "FLOWFORGE_PARAM_BATCH_SIZE"


def _projected(phase: RunPhase, *, now: datetime, **times: Any) -> dict[str, Any]:
    return project_status(
        StatusInput(
            phase=phase,
            counts=TaskCounts(total=2, succeeded=1, failed=1)
            if phase is RunPhase.FAILED
            else TaskCounts(total=2, succeeded=2),
            fingerprint="sha256:" + "0" * 64,
            started_at=NOW,
            finished_at=times.get("finished_at"),
            now=now,
            failure_message="task b failed" if phase is RunPhase.FAILED else None,
            rollback_started_at=times.get("rollback_started_at"),
            rollback_halted_at=times.get("rollback_halted_at"),
        )
    )


def _condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in body["conditions"] if c["type"] == kind)


def test_condition_times_come_from_the_runs_own_times_not_from_when_it_was_projected() -> None:
    finished = NOW + timedelta(minutes=5)
    once = _projected(RunPhase.SUCCEEDED, now=finished, finished_at=finished)
    # projected again an hour later (an operator restart): the same transition times
    again = _projected(RunPhase.SUCCEEDED, now=finished + timedelta(hours=1), finished_at=finished)

    assert once["conditions"] == again["conditions"]
    assert _condition(once, "Ready")["lastTransitionTime"] == "2026-11-30T12:05:00Z"
    assert _condition(once, "Failed")["lastTransitionTime"] == "2026-11-30T12:00:00Z"
    running = _projected(RunPhase.RUNNING, now=finished)
    assert _condition(running, "Progressing")["lastTransitionTime"] == "2026-11-30T12:00:00Z"


def test_a_halted_rollback_dates_its_conditions_from_the_rollback() -> None:
    rollback, halted = NOW + timedelta(minutes=1), NOW + timedelta(minutes=2)
    finished = NOW + timedelta(minutes=3)
    body = _projected(
        RunPhase.FAILED,
        now=finished + timedelta(hours=1),
        finished_at=finished,
        rollback_started_at=rollback,
        rollback_halted_at=halted,
    )

    ready = _condition(body, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Failed"
    assert _condition(body, "Failed")["lastTransitionTime"] == "2026-11-30T12:03:00Z"
    assert body["message"] == "task b failed"


def test_a_jobs_identity_is_read_back_from_its_manifest() -> None:
    request = JobRequest(
        namespace="ns",
        run_name="etl-1",
        run_uid="uid-1",
        task_key="undo-load",
        attempt=3,
        role=TaskRole.COMPENSATION,
        template={"image": "busybox"},
        config={},
        parameters={},
        timeout_seconds=None,
    )

    identity = JobIdentity.of(build_job(request))

    assert identity == JobIdentity(
        namespace="ns",
        name=request.name,
        run_uid="uid-1",
        task_key="undo-load",
        attempt=3,
        role=TaskRole.COMPENSATION,
    )


def test_a_job_without_our_labels_has_no_identity() -> None:
    assert JobIdentity.of({"metadata": {"namespace": "ns", "name": "other"}}) is None
    assert (
        JobIdentity.of(
            {
                "metadata": {
                    "namespace": "ns",
                    "name": "x",
                    "annotations": {"flowforge.io/run-uid": "u"},
                    "labels": {
                        "flowforge.io/task": "t",
                        "flowforge.io/attempt": "one",
                        "flowforge.io/role": "forward",
                    },
                }
            }
        )
        is None
    )


def test_attempts_made_counts_only_attempts_that_ran() -> None:
    assert attempts_made(state="waiting", attempt=1, started=False) == 0
    assert attempts_made(state="skipped", attempt=1, started=False) == 0
    assert attempts_made(state="running", attempt=1, started=True) == 1
    assert attempts_made(state="ready", attempt=2, started=True) == 1  # a retry waits
    assert attempts_made(state="failed", attempt=3, started=True) == 3


def test_simulate_fail_attempts_fails_only_the_first_attempts() -> None:
    def exit_code(attempt: int, annotations: dict[str, str]) -> str | None:
        job = build_job(
            JobRequest(
                namespace="team-a",
                run_name="pay-1",
                run_uid="uid-1",
                task_key="refund",
                attempt=attempt,
                role=TaskRole.COMPENSATION,
                template={"image": "busybox:1.36", "annotations": annotations},
            )
        )
        found: str | None = job["spec"]["template"]["metadata"]["annotations"].get(
            "flowforge.io/simulate-exit-code"
        )
        return found

    fixed_after_two = {"flowforge.io/simulate-fail-attempts": "2"}
    assert [exit_code(n, fixed_after_two) for n in (1, 2, 3)] == ["1", "1", None]
    own_code = {**fixed_after_two, "flowforge.io/simulate-exit-code": "7"}
    assert [exit_code(n, own_code) for n in (2, 3)] == ["7", None]
    assert exit_code(1, {"flowforge.io/simulate-fail-attempts": "x"}) is None
