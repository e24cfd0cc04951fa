"""ServiceAccounts and pods by policy, checked as the person who asked (issue 14).

Through the real apiserver with `kubectl --as`: a user bound only to flowforge.io objects
cannot get a Job running as a ServiceAccount they may not `use`, nor with a registry the
FlowForgePolicy forbids, and the denial names what is missing; a GitOps-style account with
RBAC for Jobs and `use` on the ServiceAccount can. A namespace enforcing Pod Security
`restricted` runs the examples to the end with the operator running.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.localdev.binaries import repo_root
from flowforge.localdev.controlplane import Cluster, kubectl, kubectl_json
from flowforge.store.connection import Pool
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer, start_operator
from tests.support.rbac import grant

pytestmark = [pytest.mark.cluster, pytest.mark.store]

FLOWFORGE_ONLY = [
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowdefinitions", "workflowruns", "flowforgepolicies"],
        "verbs": ["*"],
    }
]


def build_definition(
    *, name: str, workflow: str, image: str = "busybox:1.36", account: str | None = None
) -> dict[str, Any]:
    template: dict[str, Any] = {"image": image}
    if account is not None:
        template["serviceAccountName"] = account
    return {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowDefinition",
        "metadata": {"name": name},
        "spec": {
            "workflow": workflow,
            "version": 1,
            "taskTypes": {"build": template},
            "tasks": [{"key": "compile", "type": "build"}],
        },
    }


def apply_as(cluster: Cluster, namespace: str, user: str, obj: dict[str, Any]) -> Any:
    return kubectl(
        cluster, "apply", "--as", user, "-n", namespace, "-f", "-",
        stdin=json.dumps(obj), check=False,
    )  # fmt: skip


def set_policy(cluster: Cluster, namespace: str, spec: dict[str, Any]) -> None:
    policy = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "FlowForgePolicy",
        "metadata": {"name": "flowforge", "namespace": namespace},
        "spec": spec,
    }
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(policy))


def names(cluster: Cluster, namespace: str, resource: str) -> list[str]:
    listed = kubectl_json(cluster, "get", resource, "-n", namespace)
    return [item["metadata"]["name"] for item in listed["items"]]


async def test_a_flowforge_only_user_cannot_run_as_a_service_account_or_a_forbidden_registry(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    kubectl(cluster, "create", "serviceaccount", "builder", "-n", namespace)
    set_policy(
        cluster,
        namespace,
        {"serviceAccounts": ["default", "builder"], "registries": ["docker.io/library/*"]},
    )
    grant(cluster, namespace, role="flowforge-only", rules=FLOWFORGE_ONLY, subject="alice")

    as_builder = build_definition(name="build-v1", workflow="build", account="builder")
    refused = apply_as(cluster, namespace, "alice", as_builder)
    assert refused.returncode != 0
    assert (
        f"user alice may not use serviceaccount 'builder' in namespace {namespace} "
        "(verb use on serviceaccounts) (named by spec.taskTypes.build.serviceAccountName)"
    ) in refused.stderr, refused.stderr
    assert f"user alice may not create jobs in namespace {namespace}" in refused.stderr
    assert "(verb create on jobs.batch)" in refused.stderr

    # with the right to create Jobs too, a registry the policy forbids is still refused
    # (carol, not alice: alice's denial is cached for a moment, by design)
    jobs = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}
    grant(cluster, namespace, role="carol", rules=[*FLOWFORGE_ONLY, jobs], subject="carol")
    evil = build_definition(name="evil-v1", workflow="evil", image="evil.io/miner:1")
    refused = apply_as(cluster, namespace, "carol", evil)
    assert refused.returncode != 0
    assert (
        f"spec.taskTypes.build.image: registry evil.io is not allowed by policy "
        f"{namespace}/flowforge"
    ) in refused.stderr, refused.stderr
    assert "create jobs" not in refused.stderr  # that one she has
    # and the ServiceAccount still needs `use`, whatever else she holds
    assert (
        "use serviceaccount 'builder'" in apply_as(cluster, namespace, "carol", as_builder).stderr
    )
    # what she may do passes
    fine = build_definition(name="fine-v1", workflow="fine")
    assert apply_as(cluster, namespace, "carol", fine).returncode == 0
    # a ServiceAccount the policy does not list is refused even to a cluster admin
    other = build_definition(name="other-v1", workflow="other", account="deployer")
    refused = kubectl(cluster, "apply", "-n", namespace, "-f", "-",
                      stdin=json.dumps(other), check=False)  # fmt: skip
    assert "serviceaccount 'deployer' is not allowed by policy" in refused.stderr, refused.stderr
    assert names(cluster, namespace, "workflowdefinitions") == ["fine-v1"]


async def test_a_gitops_account_with_the_right_rbac_publishes_and_runs_but_alice_cannot_run(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    kubectl(cluster, "create", "serviceaccount", "builder", "-n", namespace)
    set_policy(cluster, namespace, {"serviceAccounts": ["builder"]})
    gitops = f"system:serviceaccount:{namespace}:gitops"
    rules = [
        *FLOWFORGE_ONLY,
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts"],
            "verbs": ["use"],
            "resourceNames": ["builder"],
        },
    ]
    grant(cluster, namespace, role="gitops", rules=rules, subject=gitops)
    grant(cluster, namespace, role="flowforge-only", rules=FLOWFORGE_ONLY, subject="alice")

    applied = apply_as(
        cluster, namespace, gitops, build_definition(name="build-v1", workflow="build",
                                                     account="builder")
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    run = {
        "apiVersion": "flowforge.io/v1alpha1",
        "kind": "WorkflowRun",
        "metadata": {"name": "build-1"},
        "spec": {"workflow": "build"},
    }
    refused = apply_as(cluster, namespace, "alice", run)
    assert refused.returncode != 0
    assert "use serviceaccount 'builder'" in refused.stderr, refused.stderr
    assert f"alice may not run workflow 'build' version 1 in namespace {namespace}" in (
        refused.stderr
    )
    assert names(cluster, namespace, "workflowruns") == []
    started = apply_as(cluster, namespace, gitops, run)
    assert started.returncode == 0, started.stderr
    assert names(cluster, namespace, "workflowruns") == ["build-1"]


def test_a_privileged_pod_is_refused_in_a_restricted_namespace(
    cluster: Cluster, namespace: str
) -> None:
    """The apiserver enforces Pod Security here: what the next test relies on."""
    kubectl(cluster, "label", "namespace", namespace,
            "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    }
    refused = kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(pod),
                      check=False)  # fmt: skip
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


async def test_a_restricted_namespace_runs_the_examples(
    cluster: Cluster,
    engine_namespace: str,
    admission_webhooks: WebhookServer,
    webhook_store: Pool,
    operators: Callable[..., OperatorProcess],
    kube_api: k8s.ApiClient,
) -> None:
    kubectl(cluster, "label", "namespace", engine_namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted")  # fmt: skip
    process = await start_operator(operators, webhook_store, admission_webhooks)
    for example in sorted((repo_root() / "examples").glob("*.yaml")):
        applied = kubectl(cluster, "apply", "-n", engine_namespace, "-f", str(example))
        assert "would violate PodSecurity" not in applied.stderr, applied.stderr
    driver = RunDriver(api=kube_api, namespace=engine_namespace, pool=webhook_store)
    await driver.wait_phase("etl-2026-11-30", {"Succeeded"}, timeout=120, operator=process)
    order = await driver.wait_phase("order-1001", {"Failed"}, timeout=120, operator=process)
    assert order["status"].get("compensation") or {}, order["status"]
    pods = k8s.CoreV1Api(kube_api).list_namespaced_pod(engine_namespace).items
    assert pods, "no Pod was admitted"
    for pod in pods:
        spec = pod.spec
        assert spec.security_context.run_as_non_root is True
        assert spec.automount_service_account_token is False
        assert spec.containers[0].security_context.capabilities.drop == ["ALL"]
