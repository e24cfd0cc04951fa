"""The chart's ValidatingAdmissionPolicies on the real apiserver, tried as an attacker would
with `kubectl --as`: the webhook's ServiceAccount creates a Job only as a dry-run; a tenant
whom RBAC lets create Jobs and Pods cannot create a Job or a Pod that claims to be
FlowForge's; the operator's ServiceAccount can, and the Job controller then
makes its Pod; an unlabelled Job is nobody's business but RBAC's."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from flowforge.localdev.controlplane import Cluster, kubectl
from tests.plugins.helm import CHART, KUBE_VERSION, RELEASE_NAMESPACE, Helm
from tests.support.rbac import grant

pytestmark = pytest.mark.cluster


@pytest.fixture
def release_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"ffp-{uuid.uuid4().hex[:8]}"
    kubectl(cluster, "create", "namespace", name)
    yield name
    kubectl(cluster, "delete", "namespace", name, "--wait=false", check=False)


MANAGED_BY = {"app.kubernetes.io/managed-by": "flowforge"}
TENANT = "mallory"


def job(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "task", "image": "busybox:1.36"}],
                },
            },
        },
    }


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "task", "image": "busybox:1.36"}]},
    }


def create(
    cluster: Cluster, namespace: str, obj: dict[str, Any], *, user: str | None, dry: bool = False
) -> Any:
    return kubectl(
        cluster,
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        *(["--as", user] if user else []),
        *(["--dry-run=server"] if dry else []),
        stdin=json.dumps(obj),
        check=False,
    )


def test_default_values_render_both_policies_for_a_current_cluster(helm: Helm) -> None:
    rendered = helm.template({})
    names = {m["metadata"]["name"] for m in rendered if m["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [m for m in rendered if m["kind"] == "ValidatingAdmissionPolicyBinding"]
    prefix = f"ff-flowforge-{RELEASE_NAMESPACE}"
    assert names == {f"{prefix}-webhook-dry-run-only", f"{prefix}-labels"}
    assert {b["spec"]["policyName"] for b in bindings} == names
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    off = helm.template({"rbac": {"admissionPolicies": False}})
    assert not [m for m in off if m["kind"].startswith("ValidatingAdmissionPolicy")]
    old = helm.run(  # a cluster without admissionregistration.k8s.io/v1 policies
        "template", "ff", str(CHART), "--kube-version", "1.29.0", "-n", RELEASE_NAMESPACE
    ).stdout
    assert "ValidatingAdmissionPolicy" not in old and KUBE_VERSION >= "1.30"


def test_only_the_operator_creates_flowforge_jobs_and_the_webhook_only_dry_runs(
    helm: Helm,
    cluster: Cluster,
    release_namespace: str,
) -> None:
    release = f"ff{uuid.uuid4().hex[:6]}"
    # the fixture names this control plane's controller manager's user in
    # rbac.jobControllerUsers (it runs as the admin: test_helm_chart.job_controllers)
    helm.run("install", release, str(CHART), "-n", release_namespace, kubeconfig=cluster.kubeconfig)
    namespace = release_namespace
    # a tenant whom RBAC lets create Jobs and Pods in the namespace
    grant(
        cluster,
        namespace,
        role="workloads",
        rules=[{"apiGroups": ["", "batch"], "resources": ["pods", "jobs"], "verbs": ["create"]}],
        subject=TENANT,
    )
    webhook = f"system:serviceaccount:{namespace}:{release}-flowforge-webhook"
    operator = f"system:serviceaccount:{namespace}:{release}-flowforge-operator"
    try:
        # the apiserver enforces a new policy once its informer has it: ask until it does
        deadline = time.monotonic() + 60
        while True:
            attempt = create(cluster, namespace, job(f"w-{uuid.uuid4().hex[:6]}", {}), user=webhook)
            if attempt.returncode != 0:
                break
            assert time.monotonic() < deadline, "the webhook's real create was never refused"
            time.sleep(0.5)
        assert "may create Jobs and Pods only as dry-runs" in attempt.stderr, attempt.stderr
        assert (
            create(cluster, namespace, job("w-dry", MANAGED_BY), user=webhook, dry=True).returncode
            == 0
        )

        deadline = time.monotonic() + 60
        while True:
            forged = create(
                cluster, namespace, job(f"f-{uuid.uuid4().hex[:6]}", MANAGED_BY), user=TENANT
            )
            if forged.returncode != 0:
                break
            assert time.monotonic() < deadline, "a labelled Job by a tenant was never refused"
            time.sleep(0.5)
        assert "only FlowForge's operator creates Jobs and Pods" in forged.stderr, forged.stderr
        forged_pod = create(cluster, namespace, pod("forged-pod", MANAGED_BY), user=TENANT)
        assert forged_pod.returncode != 0 and "may not" in forged_pod.stderr
        assert create(cluster, namespace, job("plain", {}), user=TENANT).returncode == 0

        made = create(cluster, namespace, job("ours", MANAGED_BY), user=operator)
        assert made.returncode == 0, made.stderr
        deadline = time.monotonic() + 60
        while True:  # the Job controller may make the labelled Pod
            pods = json.loads(
                kubectl(
                    cluster, "get", "pods", "-n", namespace, "-l", "job-name=ours", "-o", "json"
                ).stdout
            )["items"]
            if pods:
                break
            assert time.monotonic() < deadline, "the Job controller never made the Job's Pod:\n" + (
                kubectl(cluster, "get", "events", "-n", namespace, check=False).stdout
            )
            time.sleep(0.5)
        assert pods[0]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "flowforge"
    finally:
        kubectl(cluster, "delete", "jobs", "--all", "-n", namespace, "--wait=false", check=False)
        helm.run("uninstall", release, "-n", namespace, "--wait", kubeconfig=cluster.kubeconfig)
