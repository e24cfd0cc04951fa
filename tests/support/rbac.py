"""RBAC for tests that act as a user with `kubectl --as`: a Role bound to one user, in force."""

from __future__ import annotations

import json
from typing import Any

from flowforge.localdev.controlplane import Cluster, kubectl
from tests.support.waiting import wait_until_blocking


def grant(
    cluster: Cluster,
    namespace: str | None,
    *,
    role: str,
    rules: list[dict[str, Any]],
    subject: str,
) -> None:
    """A Role and a RoleBinding of it to one user (namespace None: a ClusterRole and a
    ClusterRoleBinding), then wait until RBAC answers for it."""
    kind = "Role" if namespace else "ClusterRole"
    metadata = {"name": role, "namespace": namespace} if namespace else {"name": role}
    objects = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": metadata,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": f"{kind}Binding",
            "metadata": metadata,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": subject}
            ],
        },
    ]
    kubectl(
        cluster,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"kind": "List", "apiVersion": "v1", "items": objects}),
    )
    rule = rules[-1]
    resource = rule["resources"][0]
    group = rule["apiGroups"][0]
    verb = rule["verbs"][0] if rule["verbs"][0] != "*" else "create"
    target = f"{resource}.{group}" if group else resource
    if rule.get("resourceNames"):
        target += f"/{rule['resourceNames'][0]}"

    def allowed() -> bool:
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        answer = kubectl(
            cluster, "auth", "can-i", verb, target, *where, "--as", subject, check=False
        )
        return answer.stdout.strip() == "yes"

    wait_until_blocking(allowed, timeout=30, what=f"RBAC to allow {subject} {verb} {target}")
