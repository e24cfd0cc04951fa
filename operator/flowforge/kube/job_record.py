"""What the reconciler keeps of a listed Job for the rest of its pass: a small record.

A Job is the size its creator chose (1 MiB of env is a valid Job, and anyone who may create
Jobs can label one as FlowForge's), and a pass looks at every listed Job only after every page
is read. So each Job of a page is reduced at once to a body of the same shape holding only the
fields the pass reads: whose it claims to be (``JobIdentity.of``, ``launcher.found_job``: name,
namespace, uid, FlowForge's labels and annotations, the controller ownerReference), its
outcome (``domain/execution.py::job_outcome``: conditions, start and completion times), its
Kueue admission (``domain/kueue.py::job_admission``: the queue label, ``spec.suspend``, the
``Suspended`` condition, the creation time) and whether a Pod started (``watchdog.py``: the
Pod counts). Kept values are what the Job's creator may not make large: names, uids, label
values (at most 63 characters), times, counts, FlowForge's annotations when short enough
to be its own, and the conditions the controllers write (their messages cut at 1 KiB).

A Job's Pods, which the watchdog and a failed Job's exit code read (``client.py::job_pods``),
are kept the same way: anyone who may create a Pod in the namespace can label one as the
Job's, name the Job its controller and make it fat, so the Pods are read in pages within a
byte budget (``kube/pages.py``) and each page is dropped once the Pods the Job controls are
reduced to records of what ``domain/execution.py`` reads (``not_started_outcome``,
``container_termination``: the phase, the conditions, the containers' states), the newest
``MAX_JOB_PODS`` of them kept. A FlowForge Job has ``backoffLimit: 0``: it makes one Pod, and
a replacement only when that one failed.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from typing import Any

from flowforge.domain.kueue import QUEUE_NAME_LABEL
from flowforge.kube.jobs import (
    ANNOTATION_RUN_NAME,
    ANNOTATION_RUN_UID,
    ANNOTATION_TASK_KEY,
    LABEL_ATTEMPT,
    LABEL_ITEM,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    LABEL_RUN,
    LABEL_TASK,
)

_METADATA = ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp")
_LABELS = (LABEL_RUN, LABEL_TASK, LABEL_ATTEMPT, LABEL_ROLE, LABEL_ITEM, LABEL_MANAGED_BY)
_KUEUE_LABELS = (QUEUE_NAME_LABEL,)
_ANNOTATIONS = (ANNOTATION_RUN_UID, ANNOTATION_RUN_NAME, ANNOTATION_TASK_KEY)
# a run's uid, its name (a Kubernetes name) and a task key (a label, an item key) are shorter:
# a longer value is not FlowForge's, and is dropped
MAX_ANNOTATION_VALUE = 253
_STATUS = ("startTime", "completionTime", "active", "ready", "succeeded", "failed")
_CONDITION = ("type", "status", "reason", "message", "lastTransitionTime")
_OWNER = ("apiVersion", "kind", "name", "uid", "controller")
# the Job controller and Kueue write a handful; a longer list is not theirs
MAX_CONDITIONS = 16
MAX_CONDITION_MESSAGE = 1024
MAX_JOB_PODS = 8
_POD_METADATA = ("name", "namespace", "uid", "creationTimestamp")
_POD_STATUS = ("phase", "reason", "startTime")
_CONTAINER_STATUSES = ("initContainerStatuses", "containerStatuses")
_CONTAINER_STATES = ("waiting", "running", "terminated")
_CONTAINER_STATE = ("reason", "message", "exitCode", "startedAt", "finishedAt")
# a Pod has at most a few dozen containers (the task, init containers, sidecars)
MAX_CONTAINERS = 64
# the kubelet cuts a termination message at 4096 bytes
MAX_STATE_MESSAGE = 4096


def job_record(job: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``job`` a reconciler pass reads, in the Job's own shape."""
    metadata = job.get("metadata") or {}
    status = job.get("status") or {}
    return {
        "metadata": {
            **_picked(metadata, _METADATA),
            "labels": _picked(metadata.get("labels") or {}, _LABELS + _KUEUE_LABELS),
            "annotations": {
                key: value
                for key, value in _picked(metadata.get("annotations") or {}, _ANNOTATIONS).items()
                if isinstance(value, str) and len(value) <= MAX_ANNOTATION_VALUE
            },
            "ownerReferences": [
                _picked(owner, _OWNER)
                for owner in metadata.get("ownerReferences") or []
                if isinstance(owner, Mapping) and owner.get("controller") is True
            ][:1],
        },
        "spec": {"suspend": (job.get("spec") or {}).get("suspend")},
        "status": {
            **_picked(status, _STATUS),
            "conditions": [
                _condition(condition)
                for condition in (status.get("conditions") or [])[:MAX_CONDITIONS]
                if isinstance(condition, Mapping)
            ],
        },
    }


def _picked(mapping: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: mapping[key] for key in keys if key in mapping}


def _condition(condition: Mapping[str, Any]) -> dict[str, Any]:
    kept = _picked(condition, _CONDITION)
    if isinstance(kept.get("message"), str):
        kept["message"] = kept["message"][:MAX_CONDITION_MESSAGE]
    return kept


async def controlled_pods(
    pages: AsyncIterable[list[dict[str, Any]]], *, job_uid: str
) -> list[dict[str, Any]]:
    """Of the listed ``pages``, the records of the newest ``MAX_JOB_PODS`` Pods whose
    controller ownerReference is the Job ``job_uid``, oldest first; each page is dropped
    once read."""
    kept: list[dict[str, Any]] = []
    async for page in pages:
        kept += [pod_record(pod) for pod in page if _controlled_by(pod, job_uid)]
        kept = sorted(kept, key=lambda pod: str(pod["metadata"].get("creationTimestamp") or ""))
        del kept[:-MAX_JOB_PODS]
    return kept


def _controlled_by(pod: Mapping[str, Any], job_uid: str) -> bool:
    return any(
        owner.get("uid") == job_uid and owner.get("controller") is True
        for owner in (pod.get("metadata") or {}).get("ownerReferences") or []
        if isinstance(owner, Mapping)
    )


def pod_record(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a Job's ``pod`` the watchdog and a failure's exit code read."""
    status = pod.get("status") or {}
    return {
        "metadata": _picked(pod.get("metadata") or {}, _POD_METADATA),
        "status": {
            **_picked(status, _POD_STATUS),
            "conditions": [
                _condition(condition)
                for condition in (status.get("conditions") or [])[:MAX_CONDITIONS]
                if isinstance(condition, Mapping)
            ],
            **{
                kind: [
                    _container_status(container)
                    for container in (status.get(kind) or [])[:MAX_CONTAINERS]
                    if isinstance(container, Mapping)
                ]
                for kind in _CONTAINER_STATUSES
            },
        },
    }


def _container_status(container: Mapping[str, Any]) -> dict[str, Any]:
    states = container.get("state") or {}
    kept: dict[str, Any] = {}
    for name in _CONTAINER_STATES:
        state = states.get(name)
        if isinstance(state, Mapping):
            kept[name] = _picked(state, _CONTAINER_STATE)
            if isinstance(kept[name].get("message"), str):
                kept[name]["message"] = kept[name]["message"][:MAX_STATE_MESSAGE]
    return {"name": container.get("name"), "state": kept}
