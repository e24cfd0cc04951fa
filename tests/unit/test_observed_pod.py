"""The rule of a Pod's success (``domain/observed_pod.py``): what the Job controller would count
for the recorded Job, and nothing else; and a Pod whose files annotation was changed."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from flowforge.domain.execution import OutcomeReason, parse_timestamp
from flowforge.domain.observed_pod import (
    JobClaim,
    PodIgnored,
    RecordedJob,
    files_forged,
    forged_files_outcome,
    job_claim,
    pod_outcome,
    pod_verdict,
)
from flowforge.domain.run_files import EMPTY_FILE_ANNOTATION
from flowforge.domain.states import TaskRole
from flowforge.kube.jobs import JobRequest, build_job

JOB = RecordedJob(namespace="team-a", name="r-a-1-x", uid="job-uid")


def pod(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "namespace": "team-a",
            "name": "r-a-1-x-abcde",
            "labels": {"batch.kubernetes.io/controller-uid": "job-uid"},
            "finalizers": ["batch.kubernetes.io/job-tracking"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "r-a-1-x",
                    "uid": "job-uid",
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
                {
                    "name": "task",
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "startedAt": "2026-12-01T10:00:00Z",
                            "finishedAt": "2026-12-01T10:00:02Z",
                        }
                    },
                },
            ],
        },
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = body
        for part in parents:
            target = target[part]
        target[leaf] = value
    return body


def verdict(body: dict[str, Any], *, tracked_before: bool = False) -> PodIgnored | None:
    claim = job_claim(body)
    if isinstance(claim, PodIgnored):
        return claim
    return pod_verdict(body, claim=claim, recorded=JOB, tracked_before=tracked_before)


def test_the_job_controllers_pod_proves_the_success() -> None:
    assert job_claim(pod()) == JobClaim(namespace="team-a", job_name="r-a-1-x", job_uid="job-uid")
    assert verdict(pod()) is None
    outcome = pod_outcome(pod())
    assert outcome.succeeded and outcome.reason is OutcomeReason.COMPLETED
    assert outcome.exit_code == 0 and outcome.message == "Pod r-a-1-x-abcde succeeded"
    assert outcome.finished_at == parse_timestamp("2026-12-01T10:00:02Z")


def test_each_difference_from_the_controllers_pod_is_named() -> None:
    not_controller = pod()
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    another_kind = pod()
    another_kind["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert verdict(not_controller) is PodIgnored.ORPHAN
    assert verdict(another_kind) is PodIgnored.ORPHAN
    assert verdict(pod(metadata__labels={})) is PodIgnored.LABEL
    assert verdict(pod(metadata__namespace="attacker")) is PodIgnored.NAMESPACE
    assert verdict(pod(metadata__finalizers=[])) is PodIgnored.UNTRACKED
    other = pod()
    other["metadata"]["ownerReferences"][0]["uid"] = "other"
    other["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = "other"
    assert verdict(other) is PodIgnored.UID
    assert {reason.forged for reason in PodIgnored} == {True, False}


def test_a_finalizer_seen_on_an_earlier_event_counts() -> None:
    """The controller removes the finalizer once it counted the Pod: a Pod seen tracked before
    (e.g. while it ran) and succeeded without it is its Pod still."""
    assert verdict(pod(metadata__finalizers=[]), tracked_before=True) is None


def test_only_a_pod_whose_task_container_exited_0_succeeded() -> None:
    failed = pod()
    failed["status"]["containerStatuses"][1]["state"]["terminated"]["exitCode"] = 1
    assert verdict(failed) is PodIgnored.NOT_SUCCEEDED
    assert verdict(pod(status__phase="Running")) is PodIgnored.NOT_SUCCEEDED
    no_task = copy.deepcopy(pod())
    no_task["status"]["containerStatuses"] = no_task["status"]["containerStatuses"][:1]
    assert verdict(no_task) is PodIgnored.NOT_SUCCEEDED
    assert not PodIgnored.NOT_SUCCEEDED.forged and not PodIgnored.UNKNOWN.forged


def made_pod(*, parameters: dict[str, Any]) -> dict[str, Any]:
    """A Pod as the Job controller makes it from FlowForge's Job: its template's metadata
    and spec (the files from a ConfigMap when the run has parameters, else the annotation)."""
    request = JobRequest(
        namespace="team-a",
        run_name="r",
        run_uid="run-uid",
        task_key="a",
        attempt=1,
        role=TaskRole.FORWARD,
        template={"image": "busybox:1.36"},
        config={},
        parameters=parameters,
    )
    return copy.deepcopy(build_job(request)["spec"]["template"])


@pytest.mark.parametrize("value", ['{"amount": 1000000}', "", "{} ", None])
def test_a_pod_whose_files_annotation_changed_is_forged(value: str | None) -> None:
    body = made_pod(parameters={})
    assert not files_forged(body)  # as FlowForge made it
    annotations = body["metadata"]["annotations"]
    if value is None:
        del annotations[EMPTY_FILE_ANNOTATION]
    else:
        annotations[EMPTY_FILE_ANNOTATION] = value
    assert files_forged(body)
    body["metadata"]["name"] = "r-a-1-x-abcde"
    outcome = forged_files_outcome(body, now=datetime(2026, 12, 1, tzinfo=UTC))
    assert not outcome.succeeded and outcome.reason is OutcomeReason.FORGED_POD
    assert "r-a-1-x-abcde" in outcome.message and outcome.retried


def test_the_annotation_of_a_pod_that_mounts_the_config_map_is_not_its_files() -> None:
    body = made_pod(parameters={"date": "2026-12-01"})
    body["metadata"].setdefault("annotations", {})[EMPTY_FILE_ANNOTATION] = '{"x": 1}'
    assert not files_forged(body)
