"""The reconciler's Job listings on the real apiserver: ``status.successful`` selects the
Jobs on their count of succeeded Pods, so the listing of every pass (``UNSUCCEEDED``) holds
a running, a suspended and a failed Job and never a succeeded one, and the TTL backstop's
(``SUCCEEDED``) only the succeeded one (the Job controller counts kwok's completed Pods)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flowforge.domain.execution import job_outcome
from flowforge.kube.client import KubeClient
from flowforge.kube.jobs import LABEL_MANAGED_BY, MANAGED_BY
from flowforge.kube.pages import PAGE_BYTES
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.operator.reconciler import SUCCEEDED, UNSUCCEEDED
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

MANAGED = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def job(name: str, *, annotations: dict[str, str], suspend: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {
            "backoffLimit": 0,
            "suspend": suspend,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "task", "image": "example.invalid/task:1"}],
                },
            },
        },
    }


async def names(kube: KubeClient, namespace: str, field_selector: str | None) -> list[str]:
    found: list[str] = []
    token: str | None = None
    while True:  # pages of one, so the selector holds across continue tokens too
        page = await kube.list_jobs(
            namespace=namespace,
            label_selector=MANAGED,
            limit=1,
            continue_token=token,
            max_bytes=PAGE_BYTES,
            field_selector=field_selector,
        )
        found += [item["metadata"]["name"] for item in page.items]
        if page.continue_token is None:
            return sorted(found)
        token = page.continue_token


async def outcome(kube: KubeClient, namespace: str, name: str) -> bool | None:
    """Whether the Job succeeded, or None while it has not finished."""
    body = await kube.read_job(namespace=namespace, name=name)
    found = None if body is None else job_outcome(body.get("status") or {})
    return None if found is None else found.succeeded


async def test_the_field_selector_lists_only_unsucceeded_or_succeeded_jobs(
    cluster: Cluster, namespace: str
) -> None:
    manifests = [
        job("done", annotations={}),
        job("failing", annotations={"flowforge.io/simulate-exit-code": "3"}),
        job("running", annotations={"flowforge.io/simulate-duration": "600s"}),
        job("suspended", annotations={}, suspend=True),
    ]
    for manifest in manifests:
        kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    kube = KubeClient.connect(kubeconfig=str(cluster.kubeconfig), threads=2)
    try:

        async def recorded() -> bool:  # the Job controller records kwok's ended Pods
            return [await outcome(kube, namespace, name) for name in ("done", "failing")] == [
                True,
                False,
            ]

        await wait_until(recorded, timeout=90, what="the Jobs' outcomes recorded")
        assert await names(kube, namespace, None) == ["done", "failing", "running", "suspended"]
        assert await names(kube, namespace, UNSUCCEEDED) == ["failing", "running", "suspended"]
        assert await names(kube, namespace, SUCCEEDED) == ["done"]
    finally:
        kube.close()
