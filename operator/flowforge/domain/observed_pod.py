"""What an observed Pod of a run's Job means: a task's success read from its Pod, about a
second before the Job's status can say it (the Job controller syncs a Job at most once a
second after its Pods change: ``syncJobBatchPeriod`` in ``pkg/controller/job``).

Reading success from the Pod is as trustworthy as reading the Job's status, provided the Pod
is one the Job controller itself would count; whoever can make such a Pod can already make
the Job say it succeeded. The rule mirrors the controller:

- the Pod's controller ownerReference is a ``batch/v1`` ``Job`` (else ``ORPHAN``), and its
  ``batch.kubernetes.io/controller-uid`` label, which the Job's selector matches, names the
  same uid (else ``LABEL``);
- that uid is the one recorded when the attempt's Job was created (a Pod naming the
  attempt's Job with another uid is ``UID``; an unknown uid is ``UNKNOWN``, not a forgery:
  e.g. a Job created before this process started, which the Job watch decides);
- the Pod is in the run's namespace (else ``NAMESPACE``: ownerReferences do not cross
  namespaces, and the controller lists only its Job's namespace);
- it carries the ``batch.kubernetes.io/job-tracking`` finalizer, in this event or an earlier
  one seen of the same Pod (else ``UNTRACKED``). The controller counts a finished Pod only
  while the finalizer is on it and removes it once counted, so a Pod seen succeeded
  without it was either counted already (its Job is about to say so, and the Job watch
  records it) or never counted at all (made without it, or adopted after it finished): in
  neither case may the Pod decide. Refusing the first kind costs at most the second the
  Job path takes; accepting it could record a Pod the controller never counts. The watch
  sees the Pod while it runs (finalizer on), so its success is judged with that in mind;
- its phase is ``Succeeded`` and the task container ended with exit code 0 (else
  ``NOT_SUCCEEDED``, not a forgery: the Job watch decides every failure).

A Pod of the recorded Job whose files come from its own annotation (a Job without a ConfigMap,
``run_files.py::mounts_config_map``) is also judged while it runs: the kubelet refreshes such a
downward API volume when the annotation changes, so anyone who may ``patch pods`` in the
namespace could change a running task's ``parameters.json`` and ``config.json``. Its
annotation must be exactly the value FlowForge set (``files_forged``); any other value, or
none, fails the attempt (``forged_files_outcome``, reason ``ForgedPod``) and deletes its Job,
and no success is read from that Pod.

Pure: the operator looks up the recorded Job (``operator/launcher.py::RecordedUids``) and
acts (``operator/engine.py::on_pod_event``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from flowforge.domain.execution import AttemptOutcome, OutcomeReason, parse_timestamp
from flowforge.domain.run_files import EMPTY_FILE_ANNOTATION, VOLUME_NAME, config_text
from flowforge.domain.template_rules import TASK_CONTAINER_NAME

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
SUCCEEDED_PHASE = "Succeeded"


class PodIgnored(StrEnum):
    """Why a Pod does not decide its attempt's outcome (the forgeries are counted)."""

    ORPHAN = "orphan"
    LABEL = "label"
    UID = "uid"
    NAMESPACE = "namespace"
    UNTRACKED = "untracked"
    UNKNOWN = "unknown"  # not a forgery: a Job this process did not record
    NOT_SUCCEEDED = "not-succeeded"  # not a forgery: the Job watch decides

    @property
    def forged(self) -> bool:
        return self not in (PodIgnored.UNKNOWN, PodIgnored.NOT_SUCCEEDED)


@dataclass(frozen=True)
class JobClaim:
    """The Job a Pod names as its controller."""

    namespace: str
    job_name: str
    job_uid: str


@dataclass(frozen=True)
class RecordedJob:
    """The Job recorded for an attempt: where it is and its uid."""

    namespace: str
    name: str
    uid: str


def job_claim(pod: Mapping[str, Any]) -> JobClaim | PodIgnored:
    """The Job that controls the Pod, as its ownerReference and selector label say."""
    metadata = pod.get("metadata") or {}
    for owner in metadata.get("ownerReferences") or []:
        if (
            owner.get("controller") is True
            and owner.get("apiVersion") == "batch/v1"
            and owner.get("kind") == "Job"
            and owner.get("uid")
        ):
            uid = str(owner["uid"])
            if (metadata.get("labels") or {}).get(CONTROLLER_UID_LABEL) != uid:
                return PodIgnored.LABEL
            return JobClaim(
                namespace=str(metadata.get("namespace") or ""),
                job_name=str(owner.get("name") or ""),
                job_uid=uid,
            )
    return PodIgnored.ORPHAN


def tracked(pod: Mapping[str, Any]) -> bool:
    """Whether the Job controller's tracking finalizer is on the Pod."""
    return JOB_TRACKING_FINALIZER in ((pod.get("metadata") or {}).get("finalizers") or [])


def pod_verdict(
    pod: Mapping[str, Any], *, claim: JobClaim, recorded: RecordedJob, tracked_before: bool
) -> PodIgnored | None:
    """None when the Pod proves the success of the attempt whose Job is ``recorded`` (the
    one with the uid the Pod claims); ``tracked_before``: an earlier event of the Pod carried
    the tracking finalizer."""
    if claim.job_uid != recorded.uid:
        return PodIgnored.UID
    if claim.namespace != recorded.namespace:
        return PodIgnored.NAMESPACE
    if not (tracked_before or tracked(pod)):
        return PodIgnored.UNTRACKED
    if task_container_success(pod) is None:
        return PodIgnored.NOT_SUCCEEDED
    return None


def task_container_success(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The task container's ``terminated`` state when the Pod succeeded and it exited 0."""
    status = pod.get("status") or {}
    if status.get("phase") != SUCCEEDED_PHASE:
        return None
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated")
        if container.get("name") == TASK_CONTAINER_NAME and terminated:
            return terminated if terminated.get("exitCode") == 0 else None
    return None


def pod_outcome(pod: Mapping[str, Any]) -> AttemptOutcome:
    """The success a Pod that passed ``pod_verdict`` proves."""
    terminated = task_container_success(pod) or {}
    name = (pod.get("metadata") or {}).get("name")
    return AttemptOutcome(
        succeeded=True,
        reason=OutcomeReason.COMPLETED,
        message=f"Pod {name} succeeded",
        exit_code=0,
        started_at=parse_timestamp(terminated.get("startedAt")),
        finished_at=parse_timestamp(terminated.get("finishedAt")),
    )


def files_forged(pod: Mapping[str, Any]) -> bool:
    """Whether the Pod reads its run files from its annotation (a downward API volume) and
    that annotation is not the value FlowForge set: someone patched the Pod."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    from_annotation = any(
        isinstance(volume, Mapping)
        and volume.get("name") == VOLUME_NAME
        and volume.get("downwardAPI") is not None
        for volume in volumes
    )
    if not from_annotation:
        return False
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return annotations.get(EMPTY_FILE_ANNOTATION) != config_text({})


def forged_files_outcome(pod: Mapping[str, Any], *, now: datetime) -> AttemptOutcome:
    """The failure of an attempt whose Pod's files annotation was changed (``files_forged``):
    its task may have read the forged files, so nothing it did is taken as a success."""
    name = (pod.get("metadata") or {}).get("name")
    return AttemptOutcome(
        succeeded=False,
        reason=OutcomeReason.FORGED_POD,
        message=f"Pod {name}'s annotation {EMPTY_FILE_ANNOTATION}, which its "
        "parameters.json and config.json are read from, was changed after FlowForge made it; "
        "the attempt fails and its Job is deleted",
        finished_at=now,
    )
