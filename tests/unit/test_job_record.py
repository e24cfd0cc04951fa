"""The record a reconciler pass keeps of a listed Job (``kube/job_record.py``) answers every
question the pass asks as the whole Job does, and stays small however large its creator made
the Job; so do the records of a Job's Pods (the watchdog's), read a page at a time."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from flowforge.domain.execution import container_termination, job_outcome, not_started_outcome
from flowforge.domain.kueue import QUEUE_NAME_LABEL, job_admission
from flowforge.domain.observed_job import job_meaning
from flowforge.kube.job_record import (
    MAX_CONDITION_MESSAGE,
    MAX_JOB_PODS,
    controlled_pods,
    job_record,
    pod_record,
)
from flowforge.kube.jobs import (
    ANNOTATION_RUN_NAME,
    ANNOTATION_RUN_UID,
    ANNOTATION_TASK_KEY,
    LABEL_ATTEMPT,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TASK,
    MANAGED_BY,
    JobIdentity,
)
from flowforge.kube.pages import pages
from tests.unit.test_pages import BUDGET, Apiserver

RUN_UID = "0b6c2a53-95a4-4a57-8d0e-1c0f3c1e7a11"


def job(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "etl-1-extract-1",
            "namespace": "team-a",
            "uid": "5f0e1f4e-1111-4c1c-9d1a-6d1b0c1e2f33",
            "creationTimestamp": "2026-11-30T10:00:00Z",
            "labels": {
                LABEL_RUN: "etl-1",
                LABEL_TASK: "extract",
                LABEL_ATTEMPT: "1",
                LABEL_ROLE: "forward",
                LABEL_MANAGED_BY: MANAGED_BY,
            },
            "annotations": {
                ANNOTATION_RUN_UID: RUN_UID,
                ANNOTATION_RUN_NAME: "etl-1",
                ANNOTATION_TASK_KEY: "extract[eu]",
            },
            "ownerReferences": [
                {
                    "apiVersion": "flowforge.io/v1alpha1",
                    "kind": "WorkflowRun",
                    "name": "etl-1",
                    "uid": RUN_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"backoffLimit": 0, "template": {"spec": {"containers": [{"name": "task"}]}}},
        "status": status,
    }


def condition(kind: str, *, reason: str = "", at: str = "2026-11-30T10:05:00Z") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": at}


def queued(*, suspend: bool, **status: Any) -> dict[str, Any]:
    body = job(**status)
    body["metadata"]["labels"][QUEUE_NAME_LABEL] = "team-a"
    body["spec"]["suspend"] = suspend
    return body


def fat(body: dict[str, Any]) -> dict[str, Any]:
    """What anyone who may create Jobs can add: 1 MiB of env, annotations, labels, owners
    (not conditions: the Job controller writes them)."""
    body = copy.deepcopy(body)
    metadata = body["metadata"]
    metadata["annotations"] |= {f"pad.example/{i}": "x" * 1000 for i in range(200)}
    metadata["labels"] |= {f"pad.example/{i}": "x" * 63 for i in range(2000)}
    metadata["ownerReferences"] += [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": f"o{i}", "uid": str(i)}
        for i in range(1000)
    ]
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "PAD", "value": "x" * (1 << 20)}]
    return body


BODIES = {
    "running": job(active=1, ready=1, startTime="2026-11-30T10:00:01Z"),
    "pending": job(active=1),
    "complete": job(
        succeeded=1,
        startTime="2026-11-30T10:00:01Z",
        completionTime="2026-11-30T10:05:00Z",
        conditions=[condition("SuccessCriteriaMet"), condition("Complete")],
    ),
    "failed": job(failed=1, conditions=[condition("Failed", reason="BackoffLimitExceeded")]),
    "deadline": job(failed=1, conditions=[condition("Failed", reason="DeadlineExceeded")]),
    "queued": queued(suspend=True, conditions=[condition("Suspended", reason="JobSuspended")]),
    "admitted": queued(suspend=False, active=1, startTime="2026-11-30T10:01:00Z"),
    "evicted": queued(suspend=True, active=1),
}


def answers(body: dict[str, Any]) -> tuple[Any, ...]:
    identity = JobIdentity.of(body)
    return (
        job_outcome(body.get("status") or {}),
        job_admission(body),
        job_meaning(body),
        identity,
        identity and (identity.uid, identity.controller_uid),
        body["metadata"].get("creationTimestamp"),
        {key: body["status"].get(key) for key in ("ready", "succeeded", "failed")},
    )


@pytest.mark.parametrize("name", list(BODIES))
def test_the_record_answers_as_the_job_does(name: str) -> None:
    body = BODIES[name]
    assert answers(job_record(body)) == answers(body)
    assert answers(job_record(fat(body))) == answers(body)


@pytest.mark.parametrize("name", list(BODIES))
def test_the_record_of_a_fat_job_is_small(name: str) -> None:
    body = fat(BODIES[name])
    assert len(json.dumps(body)) > 1 << 20
    assert len(json.dumps(job_record(body))) < 3000


def test_an_annotation_too_long_to_be_flowforges_is_not_kept() -> None:
    body = job()
    body["metadata"]["annotations"][ANNOTATION_TASK_KEY] = "k" * 200_000
    record = job_record(body)
    assert ANNOTATION_TASK_KEY not in record["metadata"]["annotations"]
    assert record["metadata"]["annotations"][ANNOTATION_RUN_UID] == RUN_UID


def test_a_condition_message_is_cut() -> None:
    body = BODIES["failed"]
    body = copy.deepcopy(body)
    body["status"]["conditions"][0]["message"] = "m" * 100_000
    outcome = job_outcome(job_record(body)["status"])
    assert outcome is not None and outcome.message == "m" * MAX_CONDITION_MESSAGE


JOB_UID = "5f0e1f4e-1111-4c1c-9d1a-6d1b0c1e2f33"
NOW = datetime(2026, 11, 30, 10, 10, tzinfo=UTC)


def pod(index: int, *, owner: str = JOB_UID, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"etl-1-extract-1-{index:04d}",
            "namespace": "team-a",
            "uid": f"pod-{index}",
            "creationTimestamp": f"2026-11-30T10:{index // 60:02d}:{index % 60:02d}Z",
            "labels": {"job-name": "etl-1-extract-1"},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "uid": owner, "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "task", "image": "example.invalid/task:1"}]},
        "status": status,
    }


def fat_pod(body: dict[str, Any]) -> dict[str, Any]:
    """What anyone who may create Pods can add: annotations and env (the kubelet writes the
    status, and cuts a termination message at 4 KiB)."""
    body = copy.deepcopy(body)
    body["metadata"]["annotations"] = {f"pad.example/{i}": "x" * 1000 for i in range(20)}
    body["spec"]["containers"][0]["env"] = [{"name": "PAD", "value": "x" * 10_000}]
    return body


def waiting(reason: str) -> dict[str, Any]:
    return {"name": "task", "state": {"waiting": {"reason": reason, "message": "m" * 4096}}}


POD_BODIES = {
    "unschedulable": pod(
        1,
        phase="Pending",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}
        ],
    ),
    "image": pod(2, phase="Pending", containerStatuses=[waiting("ImagePullBackOff")]),
    "init": pod(3, phase="Pending", initContainerStatuses=[waiting("CreateContainerError")]),
    "running": pod(
        4, phase="Running", containerStatuses=[{"name": "task", "state": {"running": {}}}]
    ),
    "failed": pod(
        5,
        phase="Failed",
        containerStatuses=[
            {"name": "task", "state": {"terminated": {"exitCode": 3, "message": "boom"}}}
        ],
    ),
}


def pod_answers(pods: list[dict[str, Any]]) -> tuple[Any, ...]:
    return (
        not_started_outcome(pods, job="etl-1-extract-1", timeout_seconds=60, now=NOW),
        container_termination(pods, container="task"),
    )


@pytest.mark.parametrize("name", list(POD_BODIES))
def test_the_record_of_a_pod_answers_as_the_pod_does(name: str) -> None:
    body = POD_BODIES[name]
    assert pod_answers([pod_record(fat_pod(body))]) == pod_answers([body])
    assert len(json.dumps(pod_record(fat_pod(body)))) < 6000 < len(json.dumps(fat_pod(body)))


async def test_many_fat_forged_pods_of_one_job_are_read_a_page_at_a_time() -> None:
    """A tenant's 400 fat Pods claiming the Job (its labels and ownerReference) are never
    held at once: a page within its budget, a few records kept, the newest."""
    forged = [fat_pod(pod(index, phase="Pending")) for index in range(10, 410)]
    other = [fat_pod(pod(index, owner="another-job")) for index in range(410, 420)]
    apiserver = Apiserver([POD_BODIES["failed"], *forged, *other])
    kept = await controlled_pods(
        pages(apiserver.fetch, limit=20, max_bytes=BUDGET), job_uid=JOB_UID
    )
    assert len(json.dumps(apiserver.items)) > 40 * BUDGET
    assert apiserver.largest_read <= BUDGET
    assert [body["metadata"]["uid"] for body in kept] == [
        f"pod-{index}" for index in range(410 - MAX_JOB_PODS, 410)
    ]
    assert len(json.dumps(kept)) < 2 * 6000 * MAX_JOB_PODS
