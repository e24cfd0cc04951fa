"""WorkflowRunActions applied as `kubectl apply` sends them, and their processed status."""

from __future__ import annotations

from typing import Any

import yaml

from flowforge.domain.api import API_VERSION, GROUP, VERSION
from flowforge.domain.run_actions import KIND, PLURAL
from flowforge.localdev.controlplane import Cluster, kubectl
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.waiting import wait_until


def act(cluster: Cluster, driver: RunDriver, name: str, spec: dict[str, Any]) -> None:
    """`kubectl apply` of a WorkflowRunAction (as the cluster's admin)."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": driver.namespace},
        "spec": spec,
    }
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump(document))


def action_status(driver: RunDriver, name: str) -> dict[str, Any]:
    body = driver.custom.get_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, name
    )
    return dict(body.get("status") or {})


async def processed(driver: RunDriver, name: str, operator: OperatorProcess) -> dict[str, Any]:
    status: dict[str, Any] = await wait_until(
        lambda: action_status(driver, name) if action_status(driver, name).get("result") else None,
        timeout=60,
        what=f"action {name} processed",
        operator=operator,
    )
    return status
