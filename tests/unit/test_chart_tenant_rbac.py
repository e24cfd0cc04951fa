"""The chart's tenant roles: FlowForgePolicy is read-only to tenants, `use` on ServiceAccounts
is its own role, and the webhook may review access and read policies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "flowforge" / "templates"
READ = {"get", "list", "watch"}


def _documents(name: str) -> list[dict[str, Any]]:
    """The template's plain YAML: lines of template actions dropped, names' actions blanked."""
    text = re.sub(r"\{\{-? */\*.*?\*/ *-?\}\}", "", (TEMPLATES / name).read_text(), flags=re.S)
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("{{"):
            continue
        lines.append(re.sub(r"\{\{[^}]*\}\}", "x", line))
    return [doc for doc in yaml.safe_load_all("\n".join(lines)) if doc]


def _rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc.get("rules") or [])


def test_tenants_read_policies_and_never_write_them() -> None:
    roles = _documents("tenant-rbac.yaml")
    assert {doc["metadata"]["name"] for doc in roles} == {
        "x-workflow-editor",
        "x-workflow-viewer",
        "x-serviceaccount-user",
        "x-workflow-recoverer",
    }
    for role in roles:
        for rule in _rules(role):
            if "flowforgepolicies" in rule["resources"] or "*" in rule["resources"]:
                assert set(rule["verbs"]) <= READ, (role["metadata"]["name"], rule)
    editor = next(doc for doc in roles if doc["metadata"]["name"] == "x-workflow-editor")
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"


def test_use_on_service_accounts_is_a_role_of_its_own() -> None:
    roles = {doc["metadata"]["name"]: doc for doc in _documents("tenant-rbac.yaml")}
    assert _rules(roles["x-serviceaccount-user"]) == [
        {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["use"]}
    ]
    for name in ("x-workflow-editor", "x-workflow-viewer"):
        assert all("serviceaccounts" not in rule["resources"] for rule in _rules(roles[name]))


def test_the_webhook_may_review_access_and_read_policies() -> None:
    text = (TEMPLATES / "webhook-access.yaml").read_text()
    assert '(list "workflowdefinitions" "flowforgepolicies") "verbs" (list "list")' in text
    review = text[text.index("-webhook-review") : text.index("kind: ClusterRoleBinding")]
    assert "resources: [subjectaccessreviews]\n    verbs: [create]" in review


def test_the_custom_verbs_of_run_actions_are_a_role_for_admins_and_actions_are_never_changed() -> (
    None
):
    roles = {doc["metadata"]["name"]: doc for doc in _documents("tenant-rbac.yaml")}
    recoverer = roles["x-workflow-recoverer"]
    assert _rules(recoverer) == [
        {
            "apiGroups": ["flowforge.io"],
            "resources": ["workflowruns"],
            "verbs": ["recover", "approve", "pause"],
        }
    ]
    labels = recoverer["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in labels
    for role in roles.values():
        for rule in _rules(role):
            if "workflowrunactions" in rule["resources"]:
                assert set(rule["verbs"]) <= READ | {"create"}, (role["metadata"]["name"], rule)
