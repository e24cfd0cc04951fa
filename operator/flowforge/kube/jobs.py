"""The Job manifest for one attempt of one task: a pure function of its inputs.

The container template arrives in Kubernetes' own camelCase shape (image, command, args,
env, resources, annotations, labels, serviceAccountName, nodeSelector, tolerations and the
Pod-spec fields of `flowforge.domain.podspec_schema`), so this module does not depend on how
the domain models it. Security contexts are FlowForge's restricted defaults with the
template's own settings laid over them (the namespace policy has judged those). The run's
parameters and the task's config are files of the run's ConfigMap (`flowforge.kube.config_map`),
mounted read-only at ``/etc/flowforge``, or, when both are ``{}``, the same files from the
Pod's own annotation (`flowforge.domain.run_files`); the environment carries only small
identity variables, the ``FLOWFORGE_PARAM_<NAME>`` values and the files' paths.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowforge.domain import run_files
from flowforge.domain.api import API_VERSION, GROUP, PREFIX, RUN_KIND
from flowforge.domain.caps import parameter_env_name as parameter_env_name
from flowforge.domain.execution import config_map_name, job_name
from flowforge.domain.final_tasks import ROLLBACK_ENV, RUN_OUTCOME_ENV
from flowforge.domain.for_each import ITEM_ENV, ITEM_KEY_ENV, split_instance
from flowforge.domain.kueue import PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL, without_kueue_keys
from flowforge.domain.states import TaskRole
from flowforge.domain.tracing import TRACEPARENT_ENV
from flowforge.domain.undo import UNDO_OF_ENV

LABEL_RUN = f"{PREFIX}/run"
LABEL_TASK = f"{PREFIX}/task"
LABEL_ATTEMPT = f"{PREFIX}/attempt"
LABEL_ROLE = f"{PREFIX}/role"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "flowforge"
ANNOTATION_RUN_UID = f"{PREFIX}/run-uid"
ANNOTATION_RUN_NAME = f"{PREFIX}/run-name"
# a forEach instance (`domain/for_each.py`): its item's key, and its exact task key (the
# task label holds only a label-safe form of `task[item]`)
LABEL_ITEM = f"{PREFIX}/item"
SIMULATE_FAIL_ITEMS = f"{PREFIX}/simulate-fail-items"
SIMULATE_FAIL_ATTEMPTS = f"{PREFIX}/simulate-fail-attempts"
SIMULATE_EXIT_CODE = f"{PREFIX}/simulate-exit-code"
ANNOTATION_TASK_KEY = f"{PREFIX}/task-key"
CONTAINER_NAME = "task"
MAX_LABEL_VALUE = 63

_LABEL_INVALID = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """A valid label value for ``text``: itself when it fits, else truncated plus a hash."""
    cleaned = _LABEL_INVALID.sub("-", text).strip("-._")
    if cleaned == text and len(text) <= MAX_LABEL_VALUE:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{cleaned[: MAX_LABEL_VALUE - 11].rstrip('-._')}-{digest}"


def _env_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class ItemRef:
    """The item of a forEach instance: its forEach task (``group``), its key, its JSON."""

    group: str
    key: str
    json: str


@dataclass(frozen=True)
class JobRequest:
    """Everything that decides the Job of one attempt."""

    namespace: str
    run_name: str
    run_uid: str
    task_key: str
    attempt: int
    role: TaskRole
    template: Mapping[str, Any]
    config: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: int | None = None
    # Kueue: the LocalQueue the Job queues in (created suspended) and its priority class
    queue_name: str | None = None
    priority_class: str | None = None
    # W3C trace context of the attempt's span (domain/tracing.py), while tracing is on
    traceparent: str | None = None
    # a compensator's FLOWFORGE_UNDO_OF (flowforge.domain.undo): succeeded or attempted
    undo_of: str | None = None
    # a forEach instance's item (`domain/for_each.py`): its forEach task, key and JSON text
    item: ItemRef | None = None
    # a finally task's run outcome (`domain/final_tasks.py`): the phase, how the rollback ended
    run_outcome: tuple[str, str] | None = None

    @property
    def name(self) -> str:
        return job_name(
            run_name=self.run_name,
            run_uid=self.run_uid,
            task_key=self.task_key,
            attempt=self.attempt,
            role=self.role,
        )


def job_labels(request: JobRequest) -> dict[str, str]:
    item = {} if request.item is None else {LABEL_ITEM: label_value(request.item.key)}
    return item | {
        LABEL_RUN: label_value(request.run_name),
        LABEL_TASK: label_value(request.task_key),
        LABEL_ATTEMPT: str(request.attempt),
        LABEL_ROLE: request.role.value,
        "app.kubernetes.io/name": "flowforge",
        "app.kubernetes.io/component": "task",
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/instance": label_value(request.run_name),
    }


def _identity_environment(request: JobRequest) -> dict[str, str]:
    ours: dict[str, str] = {
        "FLOWFORGE_RUN": request.run_name,
        "FLOWFORGE_TASK": request.task_key,
        "FLOWFORGE_ATTEMPT": str(request.attempt),
        "FLOWFORGE_ROLE": request.role.value,
        **run_files.file_environment(),
    }
    if request.traceparent is not None:
        ours[TRACEPARENT_ENV] = request.traceparent
    if request.undo_of is not None:
        ours[UNDO_OF_ENV] = request.undo_of
    if request.run_outcome is not None:
        ours[RUN_OUTCOME_ENV], ours[ROLLBACK_ENV] = request.run_outcome
    if request.item is not None:
        ours[ITEM_ENV] = request.item.json
        ours[ITEM_KEY_ENV] = request.item.key
        ours[run_files.ITEMS_FILE_VARIABLE] = run_files.ITEMS_FILE_PATH
    for name in sorted(request.parameters):
        ours[parameter_env_name(name)] = _env_text(request.parameters[name])
    return ours


def template_env_positions(request: JobRequest) -> list[int]:
    """For each entry of the task container's env that comes from the template, its index in
    the template's env (entries FlowForge sets itself replace the template's)."""
    ours = _identity_environment(request)
    return [
        index
        for index, entry in enumerate(request.template.get("env") or [])
        if entry.get("name") not in ours
    ]


def _environment(request: JobRequest) -> list[dict[str, Any]]:
    ours = _identity_environment(request)
    template_env = request.template.get("env") or []
    env = [dict(template_env[index]) for index in template_env_positions(request)]
    env.extend({"name": key, "value": value} for key, value in ours.items())
    return env


# Pod Security `restricted` (https://kubernetes.io/docs/concepts/security/pod-security-standards/):
# every Pod runs as a non-root user with the runtime's seccomp profile, no privilege
# escalation and no capabilities. An image whose USER is root still starts (as TASK_USER).
TASK_USER = 65532
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": TASK_USER,
    "runAsGroup": TASK_USER,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


# Template fields that go to the task's container, and to its Pod, as they are.
CONTAINER_FIELDS = (
    "command",
    "args",
    "resources",
    "envFrom",
    "volumeMounts",
    "imagePullPolicy",
    "workingDir",
)
POD_FIELDS = (
    "serviceAccountName",
    "nodeSelector",
    "tolerations",
    "volumes",
    "imagePullSecrets",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "runtimeClassName",
    "hostNetwork",
    "hostPID",
    "hostIPC",
)


def container_security_context(own: Mapping[str, Any] | None) -> dict[str, Any]:
    """The restricted defaults with a template's container securityContext over them.
    ``capabilities.drop`` always keeps ALL (what is added is added back); a privileged
    container does not get the default allowPrivilegeEscalation: false, which the apiserver
    refuses next to privileged: true."""
    merged = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    if not own:
        return merged
    merged.update(copy.deepcopy(dict(own)))
    if own.get("privileged") is True and "allowPrivilegeEscalation" not in own:
        del merged["allowPrivilegeEscalation"]
    capabilities = dict(own.get("capabilities") or {})
    drop = ["ALL", *(item for item in capabilities.get("drop") or [] if item != "ALL")]
    merged["capabilities"] = {**capabilities, "drop": drop}
    return merged


def pod_security_context(own: Mapping[str, Any] | None) -> dict[str, Any]:
    """The restricted Pod defaults with a template's podSecurityContext over them."""
    return {**copy.deepcopy(POD_SECURITY_CONTEXT), **copy.deepcopy(dict(own or {}))}


def _init_container(container: Mapping[str, Any]) -> dict[str, Any]:
    own = dict(container)
    own["securityContext"] = container_security_context(container.get("securityContext"))
    return own


def run_owner_reference(*, run_name: str, run_uid: str) -> dict[str, Any]:
    """The ownerReference that makes the WorkflowRun the controller of an object (deleted
    with it by the garbage collector)."""
    return {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "name": run_name,
        "uid": run_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def mounts_config_map(request: JobRequest) -> bool:
    """Whether the Job mounts the run's ConfigMap (else its files come from its Pod's own
    annotation, `run_files.mounts_config_map`)."""
    return run_files.mounts_config_map(
        parameters=request.parameters,
        config=request.config,
        has_items=request.item is not None,
        suspended=bool(request.queue_name),
    )


def run_files_volume(request: JobRequest) -> dict[str, Any]:
    """The volume of this task's two files, read-only: the run's ConfigMap showing only them,
    or, when both are ``{}``, the downward API writing them from the Pod's annotation."""
    if not mounts_config_map(request):
        return {
            "name": run_files.VOLUME_NAME,
            "downwardAPI": {"items": run_files.empty_file_items(), "defaultMode": 0o444},
        }
    return {
        "name": run_files.VOLUME_NAME,
        "configMap": {
            "name": config_map_name(run_name=request.run_name, run_uid=request.run_uid),
            "items": run_files.task_items(
                split_instance(request.task_key)[0],
                request.config,
                item_group=None if request.item is None else request.item.group,
            ),
            "defaultMode": 0o444,
        },
    }


RUN_FILES_MOUNT: Mapping[str, Any] = {
    "name": run_files.VOLUME_NAME,
    "mountPath": run_files.MOUNT_PATH,
    "readOnly": True,
}


def _pod_annotations(request: JobRequest) -> dict[str, str]:
    """The template's Pod annotations; with the local control plane's (kwok,
    `deploy/local/kwok-stages.yaml`) ``flowforge.io/simulate-fail-attempts: N`` the simulated
    exit code only on attempts 1..N, and with ``flowforge.io/simulate-fail-items`` only on
    the forward Pods of the items it names. A Job without a ConfigMap gets the annotation its
    files are read from (FlowForge's value, whatever the template says)."""
    annotations = dict(request.template.get("annotations") or {})
    if not mounts_config_map(request):
        annotations[run_files.EMPTY_FILE_ANNOTATION] = run_files.config_text({})
    attempts = annotations.get(SIMULATE_FAIL_ATTEMPTS)
    if attempts is not None:  # the first N attempts fail: a failure fixed meanwhile
        if attempts.isdigit() and request.attempt <= int(attempts):
            annotations.setdefault(SIMULATE_EXIT_CODE, "1")
        else:
            annotations.pop(SIMULATE_EXIT_CODE, None)
    named = annotations.get(SIMULATE_FAIL_ITEMS)
    if named is None:
        return annotations
    failing = {key.strip() for key in named.split(",")}
    item = request.item
    if item is not None and item.key in failing and request.role is TaskRole.FORWARD:
        annotations.setdefault(SIMULATE_EXIT_CODE, "1")
    else:
        annotations.pop(SIMULATE_EXIT_CODE, None)
    return annotations


def build_job(request: JobRequest) -> dict[str, Any]:
    """The Job manifest: one Pod, never restarted, deadline from ``timeoutSeconds``, with
    restricted security defaults; the ServiceAccount token is mounted only when the template
    asks (``automountServiceAccountToken: true``)."""
    template = request.template
    labels = job_labels(request)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": template["image"],
        "env": _environment(request),
        "securityContext": container_security_context(template.get("securityContext")),
    }
    for key in CONTAINER_FIELDS:
        if template.get(key):
            container[key] = copy.deepcopy(template[key])
    container["volumeMounts"] = [*container.get("volumeMounts", []), dict(RUN_FILES_MOUNT)]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": template.get("automountServiceAccountToken") is True,
        "securityContext": pod_security_context(template.get("podSecurityContext")),
        "containers": [container],
    }
    if template.get("initContainers"):
        pod_spec["initContainers"] = [_init_container(c) for c in template["initContainers"]]
    for key in POD_FIELDS:
        if template.get(key):
            pod_spec[key] = copy.deepcopy(template[key])
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), run_files_volume(request)]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "template": {
            "metadata": {
                "labels": {**(template.get("labels") or {}), **labels},
                "annotations": _pod_annotations(request),
            },
            "spec": pod_spec,
        },
    }
    if request.timeout_seconds is not None:
        job_spec["activeDeadlineSeconds"] = int(request.timeout_seconds)
    job_metadata: Mapping[str, Any] = template.get("jobMetadata") or {}
    metadata_labels = dict(labels)
    if request.queue_name:
        # Kueue admits the Job by unsuspending it; activeDeadlineSeconds restarts then
        job_spec["suspend"] = True
        # an eviction suspends the Job again and its Pods are deleted: only a Pod that
        # really failed (phase Failed) may count against backoffLimit 0, not a deleted one
        job_spec["podReplacementPolicy"] = "Failed"
        metadata_labels[QUEUE_NAME_LABEL] = request.queue_name
        if request.priority_class:
            metadata_labels[PRIORITY_CLASS_LABEL] = request.priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": request.name,
            "namespace": request.namespace,
            "labels": {**without_kueue_keys(job_metadata.get("labels", {})), **metadata_labels},
            "annotations": {
                **without_kueue_keys(job_metadata.get("annotations", {})),
                ANNOTATION_RUN_UID: request.run_uid,
                ANNOTATION_RUN_NAME: request.run_name,
                **(
                    {ANNOTATION_TASK_KEY: request.task_key}
                    if labels[LABEL_TASK] != request.task_key
                    else {}
                ),
            },
            "ownerReferences": [
                run_owner_reference(run_name=request.run_name, run_uid=request.run_uid)
            ],
        },
        "spec": job_spec,
    }


@dataclass(frozen=True)
class JobIdentity:
    """Which attempt a Job claims to run, read back from its labels and annotations.

    Labels and annotations are only a claim: anyone who may create a Job can copy them.
    ``uid`` (the Job's own) and ``controller_uid`` (the uid of the WorkflowRun that is its
    controller owner, if one is) are what the operator checks before it believes the claim.
    """

    namespace: str
    name: str
    run_uid: str
    task_key: str
    attempt: int
    role: TaskRole
    uid: str | None = field(default=None, compare=False)
    controller_uid: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, job: Mapping[str, Any]) -> JobIdentity | None:
        metadata = job.get("metadata") or {}
        labels = metadata.get("labels") or {}
        annotations = metadata.get("annotations") or {}
        try:
            return cls(
                namespace=metadata["namespace"],
                name=metadata["name"],
                run_uid=annotations[ANNOTATION_RUN_UID],
                task_key=annotations.get(ANNOTATION_TASK_KEY) or labels[LABEL_TASK],
                attempt=int(labels[LABEL_ATTEMPT]),
                role=TaskRole(labels[LABEL_ROLE]),
                uid=metadata.get("uid"),
                controller_uid=cls.run_controller(metadata),
            )
        except (KeyError, ValueError):
            return None

    @staticmethod
    def run_controller(metadata: Mapping[str, Any]) -> str | None:
        """The uid of the WorkflowRun that controls the object (its ownerReference with
        ``controller: true``), or None when no WorkflowRun does."""
        for owner in metadata.get("ownerReferences") or []:
            group = str(owner.get("apiVersion") or "").partition("/")[0]
            if owner.get("controller") is True and owner.get("kind") == RUN_KIND and group == GROUP:
                uid = owner.get("uid")
                return str(uid) if uid else None
        return None


@dataclass(frozen=True)
class CreatedJob:
    """The Job a creation left in place: the one just created (``created``), or the one that
    already had the name, whose controller (``controller_uid``, the WorkflowRun's uid or
    None) the caller checks before it takes the Job for its own."""

    uid: str
    created: bool
    controller_uid: str | None
