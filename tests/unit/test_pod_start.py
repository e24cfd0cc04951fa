"""Why an attempt's Pod did not start, and which Job creations are tried again."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowforge.domain.execution import (
    BackoffPolicy,
    OutcomeReason,
    not_started_outcome,
    pod_started,
)
from flowforge.kube.errors import KubernetesRefusal, KubernetesUnavailable
from flowforge.operator.creation_delays import (
    DELAY_NOTICE_INTERVAL_SECONDS,
    CreationDelays,
    transient,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def pod(status: dict[str, Any], *, created: str = "2026-12-01T10:00:00Z") -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "status": status}


def waiting(
    reason: str, message: str = "", *, init: bool = False, created: str = "2026-12-01T10:00:00Z"
) -> dict[str, Any]:
    key = "initContainerStatuses" if init else "containerStatuses"
    return pod(
        {"phase": "Pending", key: [{"state": {"waiting": {"reason": reason, "message": message}}}]},
        created=created,
    )


def outcome(*pods: dict[str, Any]) -> Any:
    return not_started_outcome(list(pods), job="j", timeout_seconds=5, now=NOW)


def test_the_schedulers_reason_and_message() -> None:
    unschedulable = pod(
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available",
                }
            ],
        }
    )
    result = outcome(unschedulable)
    assert result.reason is OutcomeReason.UNSCHEDULABLE and not result.succeeded
    assert result.message == "the Pod of Job j did not start within 5 s: 0/3 nodes are available"


def test_a_containers_waiting_reason() -> None:
    assert outcome(waiting("ErrImagePull", "not found")).reason is OutcomeReason.ERR_IMAGE_PULL
    config = outcome(waiting("CreateContainerConfigError", 'secret "s" not found', init=True))
    assert config.reason is OutcomeReason.CREATE_CONTAINER_CONFIG_ERROR
    assert config.message.endswith('secret "s" not found')
    assert outcome(waiting("ContainerCreating")).reason is OutcomeReason.POD_NOT_STARTED
    assert "ContainerCreating" in outcome(waiting("ContainerCreating")).message


def test_the_newest_pod_speaks_and_any_started_pod_means_started() -> None:
    old = waiting("ImagePullBackOff", created="2026-12-01T10:00:00Z")
    new = waiting("ErrImagePull", created="2026-12-01T10:00:09Z")
    assert outcome(new, old).reason is OutcomeReason.ERR_IMAGE_PULL
    running = pod({"phase": "Pending", "containerStatuses": [{"state": {"running": {}}}]})
    assert pod_started(running) and not pod_started(old)
    assert outcome(old, running) is None
    assert outcome(pod({"phase": "Failed"})) is None


def test_no_pod_at_all() -> None:
    result = outcome()
    assert result.reason is OutcomeReason.POD_NOT_STARTED and "no Pod was created" in result.message


def test_quota_and_unavailability_are_transient_other_refusals_are_not() -> None:
    quota = 'jobs.batch "x" is forbidden: exceeded quota: jobs, requested: count/jobs.batch=1'
    assert transient(KubernetesRefusal(quota, status=403, reason="Forbidden"))
    assert transient(KubernetesUnavailable("too many requests", status=429, reason=""))
    assert transient(KubernetesUnavailable("cannot reach", status=None, reason=""))
    assert not transient(KubernetesRefusal("violates PodSecurity", status=403, reason=""))
    assert not transient(KubernetesRefusal("Invalid value", status=422, reason=""))


def test_delays_double_to_the_cap_and_notify_rarely() -> None:
    now = [0.0]
    delays = CreationDelays(
        policy=BackoffPolicy(first_delay_seconds=1, cap_seconds=4), clock=lambda: now[0]
    )
    key = (1, "a", 1)
    answers = [delays.delayed(key, "full") for _ in range(4)]
    assert answers == [(1.0, True), (2.0, False), (4.0, False), (4.0, False)]
    now[0] = DELAY_NOTICE_INTERVAL_SECONDS
    assert delays.delayed(key, "full")[1] is True
    assert delays.messages(1) == {("a", 1): "Job creation delayed (5 tries): full"}
    assert delays.messages(2) == {}
    delays.cleared(key)
    assert delays.messages(1) == {} and delays.delayed(key, "full") == (1.0, True)
