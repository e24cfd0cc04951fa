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
"""

from __future__ import annotations

from collections.abc import Mapping
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
