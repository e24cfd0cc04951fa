"""Pure decisions of the run engine: Job names, retry backoff and what a finished Job means
(the status projection is ``flowforge.domain.projection``).

Nothing here talks to Kubernetes or PostgreSQL; the operator feeds plain values in.

Retry backoff (documented contract)
-----------------------------------
A task with ``retries: N`` gets at most ``N + 1`` attempts. After failed attempt ``k``
(``k = 1`` is the first attempt), the next attempt waits

    base = min(cap, first_delay * 2 ** (k - 1))
    delay = base * (1 + jitter * u),   u in [0, 1) derived from (run uid, task, attempt)

With the defaults (``first_delay = 1 s``, ``jitter = 0.5``, ``cap = 300 s``) the wait
before the second attempt is between 1.0 s and 1.5 s, before the third between 2.0 s
and 3.0 s, and so on. ``u`` is a hash, not a random draw, so an operator restarted in the
middle of a backoff computes the same moment again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from flowforge.domain.states import TaskRole

MAX_JOB_NAME_LENGTH = 63
JOB_NAME_HASH_LENGTH = 8

_DNS_INVALID = re.compile(r"[^a-z0-9-]+")
_BASE32_LOWER = "abcdefghijklmnopqrstuvwxyz234567"


def _short_hash(text: str, length: int) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    number = int.from_bytes(digest[:8], "big")
    chars = []
    for _ in range(length):
        chars.append(_BASE32_LOWER[number & 31])
        number >>= 5
    return "".join(chars)


def _dns_fragment(text: str) -> str:
    return _DNS_INVALID.sub("-", text.lower()).strip("-")


def job_name(*, run_name: str, run_uid: str, task_key: str, attempt: int, role: TaskRole) -> str:
    """The deterministic name of the Job for one attempt of one task of one run.

    ``<run>-<task>-<attempt>-<hash>`` for forward tasks, ``<run>-c-<task>-<attempt>-<hash>``
    for compensators. The hash covers the run's uid, role, task and attempt, so two runs
    whose names and keys concatenate alike never share a name, and a run recreated under
    the same name never adopts its predecessor's Jobs. When the readable part would make
    the name longer than 63 characters it is truncated; the hash keeps the name unique.
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    digest = _short_hash(f"{run_uid}/{role.value}/{task_key}/{attempt}", JOB_NAME_HASH_LENGTH)
    middle = "c-" if role is TaskRole.COMPENSATION else ""
    tail = f"-{attempt}-{digest}"
    readable = f"{_dns_fragment(run_name)}-{middle}{_dns_fragment(task_key)}"
    room = MAX_JOB_NAME_LENGTH - len(tail)
    readable = readable[:room].rstrip("-") or "ff"
    return f"{readable}{tail}"


def config_map_name(*, run_name: str, run_uid: str) -> str:
    """The deterministic name of a run's ConfigMap (its parameters and configs as files):
    ``<run>-files-<hash>``, the hash of the run's uid, truncated like a Job's name."""
    tail = f"-files-{_short_hash(f'{run_uid}/files', JOB_NAME_HASH_LENGTH)}"
    readable = _dns_fragment(run_name)[: MAX_JOB_NAME_LENGTH - len(tail)].rstrip("-") or "ff"
    return f"{readable}{tail}"


@dataclass(frozen=True)
class BackoffPolicy:
    first_delay_seconds: float = 1.0
    cap_seconds: float = 300.0
    jitter: float = 0.5


def jitter_unit(*, run_uid: str, task_key: str, attempt: int) -> float:
    """A number in [0, 1) that is the same every time for one attempt of one task."""
    digest = hashlib.sha256(f"{run_uid}/{task_key}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def retry_delay(*, failed_attempts: int, policy: BackoffPolicy, unit: float) -> timedelta:
    """How long to wait before the next attempt after ``failed_attempts`` have failed."""
    if failed_attempts < 1:
        raise ValueError("a retry follows at least one failed attempt")
    if not 0.0 <= unit < 1.0:
        raise ValueError(f"jitter unit must be in [0, 1), got {unit}")
    exponent = min(failed_attempts - 1, 62)
    base = min(policy.cap_seconds, policy.first_delay_seconds * 2.0**exponent)
    return timedelta(seconds=base * (1.0 + policy.jitter * unit))


def may_retry(*, attempt: int, retries: int) -> bool:
    """Whether a failed ``attempt`` (1-based) leaves room for another one."""
    return attempt < retries + 1


class OutcomeReason(StrEnum):
    COMPLETED = "Completed"
    EXIT_CODE = "NonZeroExitCode"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    JOB_FAILED = "JobFailed"
    LOST = "JobVanished"
    CANCELLED = "Cancelled"
    JOB_REFUSED = "JobRefused"  # the apiserver refused the Job for good (invalid, forbidden)
    # a Job FlowForge did not create (the run is not its controller) holds the attempt's name
    JOB_NAME_TAKEN = "JobNameTaken"
    # the namespace's FlowForgePolicy, as it is when the Job is about to be made, refuses it
    POLICY_REFUSED = "PolicyRefused"
    # the Pod did not start within pendingTimeoutSeconds; the Pod's own reason
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    ERR_IMAGE_PULL = "ErrImagePull"
    INVALID_IMAGE_NAME = "InvalidImageName"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    POD_NOT_STARTED = "PodNotStarted"  # any other reason (it is in the message)
    # Kueue did not admit the attempt's Job within admissionTimeoutSeconds
    ADMISSION_TIMEOUT = "AdmissionTimeout"
    # the Pod's files annotation was changed while it ran (``observed_pod.py::files_forged``)
    FORGED_POD = "ForgedPod"
    # the namespace is being deleted: no Job can be made there again, so none is retried
    NAMESPACE_TERMINATING = "NamespaceTerminating"


# failures another attempt cannot mend: the task fails (a compensator halts the rollback)
# whatever retries are left
NEVER_RETRIED = frozenset({OutcomeReason.NAMESPACE_TERMINATING})


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    reason: OutcomeReason
    message: str = ""
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def retried(self) -> bool:
        """Whether the attempt's failure may be followed by another attempt (when the task
        has retries left)."""
        return not self.succeeded and self.reason not in NEVER_RETRIED


@dataclass(frozen=True)
class TerminatedContainer:
    """What a Pod of the Job says about how its container ended (None where unknown)."""

    exit_code: int | None
    reason: str = ""
    message: str = ""


def container_termination(
    pods: Sequence[Mapping[str, Any]], *, container: str
) -> TerminatedContainer | None:
    """How ``container`` of the newest of ``pods`` (oldest first) that tells it ended."""
    for pod in reversed(pods):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            if status.get("name") == container and terminated:
                return TerminatedContainer(
                    exit_code=terminated.get("exitCode"),
                    reason=terminated.get("reason") or "",
                    message=terminated.get("message") or "",
                )
    return None


def _condition_true(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def parse_timestamp(value: Any) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, "Z" for UTC) or a datetime; None when absent."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def job_outcome(
    job_status: Mapping[str, Any], container: TerminatedContainer | None = None
) -> AttemptOutcome | None:
    """The outcome of a finished Job, or None while it has not finished.

    ``Complete`` is success, and so is ``SuccessCriteriaMet``, which the Job controller sets
    first (before the Job's Pods have all terminated; it is never followed by ``Failed``).
    ``Failed`` with reason ``DeadlineExceeded`` is a timeout (``activeDeadlineSeconds``);
    any other ``Failed`` is a failed attempt, with the container's exit code when a Pod
    still tells it.
    """
    conditions: Sequence[Mapping[str, Any]] = job_status.get("conditions") or []
    started = parse_timestamp(job_status.get("startTime"))
    complete = _condition_true(conditions, "Complete") or _condition_true(
        conditions, "SuccessCriteriaMet"
    )
    if complete is not None:
        return AttemptOutcome(
            succeeded=True,
            reason=OutcomeReason.COMPLETED,
            message=str(complete.get("message") or ""),
            exit_code=0,
            started_at=started,
            finished_at=parse_timestamp(job_status.get("completionTime"))
            or parse_timestamp(complete.get("lastTransitionTime")),
        )
    failed = _condition_true(conditions, "Failed")
    if failed is None:
        return None
    finished = parse_timestamp(failed.get("lastTransitionTime"))
    job_message = str(failed.get("message") or "")
    if failed.get("reason") == "DeadlineExceeded":
        return AttemptOutcome(
            succeeded=False,
            reason=OutcomeReason.DEADLINE_EXCEEDED,
            message=job_message or "the attempt ran past timeoutSeconds",
            exit_code=container.exit_code if container else None,
            started_at=started,
            finished_at=finished,
        )
    if container is not None and container.exit_code not in (None, 0):
        detail = container.message or container.reason or job_message
        return AttemptOutcome(
            succeeded=False,
            reason=OutcomeReason.EXIT_CODE,
            message=f"exit code {container.exit_code}" + (f": {detail}" if detail else ""),
            exit_code=container.exit_code,
            started_at=started,
            finished_at=finished,
        )
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.JOB_FAILED,
        message=job_message or str(failed.get("reason") or "the Job failed"),
        exit_code=container.exit_code if container else None,
        started_at=started,
        finished_at=finished,
    )


def refused_outcome(
    *, job: str, message: str, now: datetime, namespace_terminating: bool = False
) -> AttemptOutcome:
    """The apiserver refused to create the attempt's Job, and sending it again will not help;
    ``namespace_terminating``: because the namespace is being deleted, which no later attempt
    outlives either (a retry loop would hold a deleted run's finalizer, and with it the
    namespace, Terminating for as long as the backoff lasts)."""
    return AttemptOutcome(
        succeeded=False,
        reason=(
            OutcomeReason.NAMESPACE_TERMINATING
            if namespace_terminating
            else OutcomeReason.JOB_REFUSED
        ),
        message=f"Job {job} was refused: {message}",
        finished_at=now,
    )


def name_taken_outcome(*, job: str, now: datetime) -> AttemptOutcome:
    """The attempt's Job name is held by a Job the run does not control. It is never adopted
    nor deleted (it is someone else's), and waiting for the name could be forever: the attempt
    fails, and a retry's Job has another name (the attempt is part of it)."""
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.JOB_NAME_TAKEN,
        message=f"a Job named {job} that the run does not control already exists; "
        "it was left alone and this attempt's Job was not created",
        finished_at=now,
    )


def policy_refused_outcome(*, job: str, message: str, now: datetime) -> AttemptOutcome:
    """The namespace's policy refuses the attempt's Job now (it was tightened after the run
    was admitted): the Job is never created."""
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.POLICY_REFUSED,
        message=f"Job {job} was not created: {message}",
        finished_at=now,
    )


def _container_waiting(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    status = pod.get("status") or {}
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason and reason != "PodInitializing":
            return reason, str(waiting.get("message") or "")
    return None


def pod_started(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod got as far as running a container (it is, or did)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any(
        (container.get("state") or {}).get(state) is not None
        for container in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        for state in ("running", "terminated")
    )


def not_started_outcome(
    pods: Sequence[Mapping[str, Any]], *, job: str, timeout_seconds: float, now: datetime
) -> AttemptOutcome | None:
    """The outcome of an attempt whose Job's Pods (those it controls) have not started within
    ``timeout_seconds``: the newest Pod's own reason (``Unschedulable`` from its PodScheduled
    condition, or a container's waiting reason) and message; None when one has started."""
    if any(pod_started(pod) for pod in pods):
        return None
    reason, message = "", ""
    newest = sorted(pods, key=lambda pod: str(pod["metadata"].get("creationTimestamp") or ""))
    for pod in reversed(newest):
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if scheduled is not None and scheduled.get("status") == "False":
            reason = str(scheduled.get("reason") or "Unschedulable")
            message = str(scheduled.get("message") or "")
            break
        waiting = _container_waiting(pod)
        if waiting is not None:
            reason, message = waiting
            break
    known = {member.value: member for member in OutcomeReason}
    kind = known.get(reason, OutcomeReason.POD_NOT_STARTED)
    if kind not in _POD_REASONS:
        kind = OutcomeReason.POD_NOT_STARTED
    what = f"the Pod of Job {job} did not start within {timeout_seconds:g} s"
    if not pods:
        detail = "no Pod was created"
    else:
        detail = (f"{reason}: " if kind is OutcomeReason.POD_NOT_STARTED and reason else "") + (
            message or reason or "no reason given"
        )
    return AttemptOutcome(
        succeeded=False, reason=kind, message=f"{what}: {detail}", finished_at=now
    )


_POD_REASONS = frozenset(
    {
        OutcomeReason.UNSCHEDULABLE,
        OutcomeReason.IMAGE_PULL_BACK_OFF,
        OutcomeReason.ERR_IMAGE_PULL,
        OutcomeReason.INVALID_IMAGE_NAME,
        OutcomeReason.CREATE_CONTAINER_CONFIG_ERROR,
        OutcomeReason.CREATE_CONTAINER_ERROR,
    }
)


def lost_outcome(*, job: str, now: datetime) -> AttemptOutcome:
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.LOST,
        message=f"Job {job} vanished before its outcome was recorded",
        finished_at=now,
    )


def attempts_made(*, state: str, attempt: int, started: bool) -> int:
    """How many attempts a task (or compensator) has really made: 0 for one that never
    ran (waiting, skipped, reused, cancelled before it started); one less than the attempt
    number while a retry waits for its backoff (``ready``/``pending`` after running)."""
    if not started:
        return 0
    if state in ("ready", "pending"):
        return attempt - 1
    return attempt
