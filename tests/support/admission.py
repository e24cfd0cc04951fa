"""FlowForge objects and admission reviews as the cluster tests send them: a definition and a
run of the ``etl`` workflow, ``kubectl apply`` of one (refusals are answers, not errors),
and AdmissionReviews posted to the webhook server directly."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

from flowforge.domain.api import (
    DEFINITION_KIND,
    DEFINITION_PLURAL,
    GROUP,
    RUN_KIND,
    RUN_PLURAL,
    VERSION,
)
from flowforge.localdev.controlplane import Cluster, kubectl, kubectl_json


def definition(
    *, name: str = "etl-v1", version: int = 1, image: str = "busybox:1.36", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": name},
        "spec": {
            "workflow": "etl",
            "version": version,
            "taskTypes": {"step": {"image": image}},
            "tasks": [
                {"key": "extract", "type": "step"},
                {"key": "load", "type": "step", "dependsOn": ["extract"]},
            ],
            **spec,
        },
    }


def run(*, name: str = "etl-run", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowRun",
        "metadata": {"name": name},
        "spec": {"workflow": "etl", **spec},
    }


def apply(
    cluster: Cluster, namespace: str, obj: dict[str, Any], *, dry_run: bool = False
) -> subprocess.CompletedProcess[str]:
    args = ["apply", "-n", namespace, "-f", "-"]
    if dry_run:
        args.insert(1, "--dry-run=server")
    return kubectl(cluster, *args, stdin=json.dumps(obj), check=False)


def names_of(cluster: Cluster, namespace: str, resource: str) -> list[str]:
    listing = kubectl_json(cluster, "get", resource, "-n", namespace)
    return [item["metadata"]["name"] for item in listing["items"]]


_PLURALS = {DEFINITION_KIND: DEFINITION_PLURAL, RUN_KIND: RUN_PLURAL}
# who asks: someone who may make the request (`review_author` in tests/plugins/webhooks.py)
# but not create Jobs, or an administrator (so that only the webhook itself refuses)
SOMEONE = {"username": "fuzzer", "groups": ["system:authenticated"]}
ADMIN = {"username": "an-admin", "groups": ["system:masters"]}


def admission_review(
    obj: Any,
    *,
    kind: str = "WorkflowDefinition",
    operation: str = "CREATE",
    old: Any = None,
    dry_run: bool = True,
    namespace: str,
    user: dict[str, Any] = SOMEONE,
) -> bytes:
    """The AdmissionReview the apiserver would send for ``obj`` (as ``user``)."""
    group_version_kind = {"group": GROUP, "version": VERSION, "kind": kind}
    resource = {"group": GROUP, "version": VERSION, "resource": _PLURALS[kind]}
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": group_version_kind,
                "resource": resource,
                "requestKind": group_version_kind,
                "requestResource": resource,
                "name": "fuzzed",
                "namespace": namespace,
                "operation": operation,
                "userInfo": user,
                "object": obj,
                "oldObject": old,
                "dryRun": dry_run,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
            },
        },
        ensure_ascii=False,
    ).encode("utf-8")


def wrap(kind: str, spec: Any, *, namespace: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": "fuzzed", "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": spec,
    }
    for key in drop:
        obj.pop(key, None)
    return obj
