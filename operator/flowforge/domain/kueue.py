"""Task types that queue their Jobs through Kueue (https://kueue.sigs.k8s.io): pure rules.

A task type (or the definition, as the default of its types) names a Kueue ``LocalQueue``
(``queueName``) and optionally a ``WorkloadPriorityClass``. Its Jobs are created suspended
with Kueue's labels; Kueue admits a Job by unsuspending it and evicts it by suspending it
again. While the attempt's Job is suspended the task is ``admitting``, never running: its
``timeoutSeconds`` (the Job's ``activeDeadlineSeconds``, which Kubernetes restarts on every
resume) and ``pendingTimeoutSeconds`` count from admission, and ``admissionTimeoutSeconds``
fails an attempt that waits longer than that for admission. An eviction puts the attempt
back to admitting: the same Job, the same attempt, not a failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from flowforge.domain.execution import AttemptOutcome, OutcomeReason, parse_timestamp
from flowforge.domain.models import ContainerTemplate, DefinitionSpec
from flowforge.domain.states import ShownTaskState, TaskState

KUEUE_PREFIX = "kueue.x-k8s.io/"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"


@dataclass(frozen=True)
class Queueing:
    """How the Jobs of one task type queue through Kueue."""

    queue_name: str
    priority_class: str | None = None
    admission_timeout_seconds: int | None = None


class QueueDefaults(Protocol):
    """A definition as far as queueing goes: its task types and its Kueue defaults (the
    full ``DefinitionSpec`` or the operator's compact form)."""

    @property
    def task_types(self) -> Mapping[str, ContainerTemplate]: ...
    @property
    def queue_name(self) -> str | None: ...
    @property
    def workload_priority_class(self) -> str | None: ...
    @property
    def admission_timeout_seconds(self) -> int | None: ...


def queueing(spec: QueueDefaults, type_name: str) -> Queueing | None:
    """The Kueue queueing of a task type: its own fields, else the definition's defaults;
    None when neither names a queue."""
    template = spec.task_types[type_name]
    queue = template.queue_name or spec.queue_name
    if queue is None:
        return None
    return Queueing(
        queue_name=queue,
        priority_class=template.workload_priority_class or spec.workload_priority_class,
        admission_timeout_seconds=template.admission_timeout_seconds
        or spec.admission_timeout_seconds,
    )


def without_kueue_keys(mapping: Mapping[str, str]) -> dict[str, str]:
    """A template's own Job labels or annotations without Kueue's keys: only ``queueName`` and
    ``workloadPriorityClass``, which the namespace policy governs, may say how a Job queues
    (a ``kueue.x-k8s.io/queue-name`` or ``prebuilt-workload-name`` of the template's would
    pick a queue or Workload the policy never saw)."""
    return {key: value for key, value in mapping.items() if not key.startswith(KUEUE_PREFIX)}


def queued_task_keys(spec: DefinitionSpec) -> list[str]:
    """The tasks (forward, compensators and finally) whose Jobs queue through Kueue."""
    return [
        task.key
        for task in (*spec.tasks, *spec.finally_tasks)
        if task.type is not None and queueing(spec, task.type) is not None
    ]


def shown_state(state: str, *, admission_required: bool, admitted: bool) -> ShownTaskState:
    """What people see of a forward task: ``admitting`` while it runs unadmitted."""
    if state == TaskState.RUNNING and admission_required and not admitted:
        return ShownTaskState.ADMITTING
    return ShownTaskState(state)


@dataclass(frozen=True)
class JobAdmission:
    """What a Kueue Job says about its admission: suspended (waiting for Kueue, since
    ``since``) or admitted (since ``since``); ``since`` is None while the Job controller has
    not yet noted the change (it happened just now)."""

    suspended: bool
    since: datetime | None


def _suspended_condition(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Suspended":
            return condition  # type: ignore[no-any-return]
    return None


def job_admission(job: Mapping[str, Any]) -> JobAdmission | None:
    """The admission of a Job that queues through Kueue (None for any other Job). A
    suspended Job waits since its ``Suspended`` condition became true (its creation, for
    one the Job controller has not seen yet; None, just now, for one suspended again whose
    condition still says resumed); an admitted one runs since its ``startTime`` (which the
    Job controller resets on every resume)."""
    metadata = job.get("metadata") or {}
    if not (metadata.get("labels") or {}).get(QUEUE_NAME_LABEL):
        return None
    condition = _suspended_condition(job)
    changed = None if condition is None else parse_timestamp(condition.get("lastTransitionTime"))
    if (job.get("spec") or {}).get("suspend") is True:
        if condition is None:  # created suspended, not seen by the Job controller yet
            since = parse_timestamp(metadata.get("creationTimestamp"))
        elif condition.get("status") == "True":
            since = changed
        else:  # suspended again just now: the Job controller has not said so yet
            since = None
        return JobAdmission(suspended=True, since=since)
    started = parse_timestamp((job.get("status") or {}).get("startTime"))
    return JobAdmission(suspended=False, since=started or changed)


def admission_timeout_outcome(
    *, job: str, queue: str, timeout_seconds: float, waiting_since: datetime, now: datetime
) -> AttemptOutcome | None:
    """The failed outcome of an attempt whose Job has waited for Kueue's admission longer
    than ``timeout_seconds``; None while it has not."""
    waited = (now - waiting_since).total_seconds()
    if waited < timeout_seconds:
        return None
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.ADMISSION_TIMEOUT,
        message=(
            f"Job {job} was not admitted by Kueue (LocalQueue {queue}) within "
            f"admissionTimeoutSeconds ({timeout_seconds:g} s); it waited {waited:.0f} s"
        ),
        finished_at=now,
    )
