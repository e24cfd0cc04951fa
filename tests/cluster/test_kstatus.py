"""kstatus itself (sigs.k8s.io/cli-utils/pkg/kstatus, what Flux, kpt and Helm's --wait use;
a small reader built from the Go module proxy) over live objects of every phase on the
local control plane, and `kubectl wait --for=condition=Completed` on a run that succeeded
and one that failed: one operator and one namespace. And the chart's argocd value renders
the Argo CD keys deploy/argocd/ ships (helm, built with the control plane)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml

from flowforge.domain.api import (
    API_VERSION,
    DEFINITION_KIND,
    DEFINITION_PLURAL,
    FORCE_DELETE_ANNOTATION,
    GROUP,
    RUN_PLURAL,
    VERSION,
)
from flowforge.localdev.controlplane import Cluster, kubectl
from tests.plugins.helm import Helm
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.sagas import HANG, OK, ORDER_SAGA, SLOW, delete_mid_rollback, wait_gone
from tests.support.waiting import wait_until
from tests.tools.argocd_files import customizations
from tests.tools.go_tools import kstatus

pytestmark = pytest.mark.cluster


def _one_task(workflow: str, step: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": step},
        "tasks": [{"key": "a", "type": "step"}],
        **extra,
    }


def _definition(driver: RunDriver, name: str, spec: dict[str, Any]) -> None:
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        DEFINITION_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": DEFINITION_KIND,
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def _get_definition(driver: RunDriver, name: str) -> dict[str, Any]:
    body: dict[str, Any] = driver.custom.get_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, DEFINITION_PLURAL, name
    )
    return body


async def _definition_with_conditions(driver: RunDriver, name: str) -> dict[str, Any]:
    body: dict[str, Any] = {}

    def with_conditions() -> dict[str, Any] | None:
        nonlocal body
        body = _get_definition(driver, name)
        return body if (body.get("status") or {}).get("conditions") else None

    found: dict[str, Any] = await wait_until(
        with_conditions, timeout=30, what=lambda: f"{name}'s conditions: {body.get('status')}"
    )
    return found


async def test_kstatus_reads_live_runs_and_definitions_of_every_phase(
    cluster: Cluster, operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(_one_task("quick", OK))
    await driver.publish(ORDER_SAGA)  # ship fails; refund and release roll it back
    await driver.publish(_one_task("slow", SLOW, concurrency={"maxRuns": 1, "policy": "Queue"}))
    await driver.publish(_one_task("linger", SLOW))
    driver.create_run("ok", workflow="quick")
    driver.create_run("bad", workflow="order")
    driver.create_run("slow-1", workflow="slow")
    await driver.wait_phase("slow-1", {"Running"}, operator=operator)
    driver.create_run("slow-2", workflow="slow")
    driver.create_run("cancelled", workflow="linger")
    _definition(driver, "pub-v1", _one_task("pub", OK))
    cyclic = _one_task("cyclic", OK)
    cyclic["tasks"] = [
        {"key": "a", "type": "step", "dependsOn": ["b"]},
        {"key": "b", "type": "step", "dependsOn": ["a"]},
    ]
    _definition(driver, "cyclic-v1", cyclic)

    # kubectl wait returns on success and on failure alike (discovery refetched first: the
    # CRDs may be newer than kubectl's cache)
    await asyncio.to_thread(kubectl, cluster, "api-resources", f"--api-group={GROUP}")
    for name in ("ok", "bad"):  # a status to wait on
        await driver.wait_phase(name, {"Running", "Succeeded", "Failed"}, operator=operator)
    waited = await asyncio.to_thread(
        kubectl,
        cluster,
        "wait",
        "--for=condition=Completed",
        "-n",
        driver.namespace,
        "workflowrun/ok",
        "workflowrun/bad",
        "--timeout=120s",
        timeout=130,
    )
    assert waited.returncode == 0, waited.stderr
    await driver.wait_phase("cancelled", {"Running"}, operator=operator)
    driver.cancel("cancelled")
    await driver.wait_phase("cancelled", {"Cancelled"}, operator=operator)
    await driver.wait_phase("slow-2", {"Queued"}, operator=operator)
    # a deletion that waits for its rollback (a compensator that takes ten minutes)
    await delete_mid_rollback(operator, driver, "deleting", undo=HANG)

    runs = ["ok", "bad", "slow-1", "slow-2", "cancelled", "deleting"]
    objects = [driver.run(name) for name in runs] + [
        await _definition_with_conditions(driver, name) for name in ("pub-v1", "cyclic-v1")
    ]
    try:
        verdicts = await asyncio.to_thread(kstatus, objects)
        seen = {v["name"]: v["status"] for v in verdicts}
        assert seen == {
            "ok": "Current",
            "bad": "Failed",
            "slow-1": "InProgress",
            "slow-2": "InProgress",
            "cancelled": "Failed",
            "deleting": "Terminating",
            "pub-v1": "Current",
            "cyclic-v1": "Failed",
        }, verdicts
        message = {v["name"]: v["message"] for v in verdicts}
        assert message["bad"].startswith("task ship failed"), message
        assert message["slow-2"].startswith("queued:"), message
        assert message["cyclic-v1"].startswith("not published:"), message
        cancelled = objects[runs.index("cancelled")]
        assert cancelled["metadata"]["generation"] == 2  # spec.cancel, observed
        assert cancelled["status"]["observedGeneration"] == 2
        reasons = {
            c["type"]: c["reason"] for c in objects[runs.index("slow-2")]["status"]["conditions"]
        }
        assert reasons["Reconciling"] == "Queued"
    finally:  # let the namespace go: skip the ten-minute compensator, stop the slow runs
        driver.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            driver.namespace,
            RUN_PLURAL,
            "deleting",
            {"metadata": {"annotations": {FORCE_DELETE_ANNOTATION: "true"}}},
        )
        for name in ("slow-1", "slow-2"):
            driver.cancel(name)
        await wait_gone(operator, driver, "deleting", timeout=30)


def test_the_chart_renders_the_argocd_keys_deploy_argocd_ships(helm: Helm) -> None:
    def argocd_cm(values: dict[str, Any]) -> list[dict[str, Any]]:
        return [m for m in helm.template(values) if m["metadata"]["name"] == "argocd-cm"]

    assert argocd_cm({}) == []  # off by default: argocd-cm is Argo CD's
    on = {"argocd": {"resourceCustomizations": {"enabled": True, "namespace": "gitops"}}}
    [config_map] = argocd_cm(on)
    assert config_map["metadata"]["namespace"] == "gitops"
    shipped = customizations()
    assert set(config_map["data"]) == set(shipped)
    for key, text in shipped.items():  # Lua for health, YAML around Lua for the actions
        if ".actions." in key:
            assert yaml.safe_load(config_map["data"][key]) == yaml.safe_load(text), key
        else:
            assert config_map["data"][key].rstrip() == text.rstrip(), key


async def test_a_run_deleted_and_reapplied_with_its_idempotency_key_creates_no_job(
    cluster: Cluster, operator: OperatorProcess, driver: RunDriver
) -> None:
    """Argo CD's self-heal, by hand: `kubectl apply` a run with a key, delete it once it
    succeeded, apply the same file again: the new object is a duplicate with no Job."""
    await driver.publish(_one_task("once", OK))
    manifest = yaml.safe_dump(
        {
            "apiVersion": API_VERSION,
            "kind": "WorkflowRun",
            "metadata": {"name": "migrate-2026-11", "namespace": driver.namespace},
            "spec": {"workflow": "once", "idempotencyKey": "migrate-2026-11"},
        }
    )
    await asyncio.to_thread(kubectl, cluster, "apply", "-f", "-", stdin=manifest)
    await driver.wait_phase("migrate-2026-11", {"Succeeded"}, operator=operator)
    first_uid = driver.run("migrate-2026-11")["metadata"]["uid"]
    assert len(driver.jobs("migrate-2026-11")) == 1

    await asyncio.to_thread(
        kubectl, cluster, "delete", "-n", driver.namespace, "workflowrun/migrate-2026-11"
    )
    await wait_gone(operator, driver, "migrate-2026-11", timeout=60)
    await asyncio.to_thread(kubectl, cluster, "apply", "-f", "-", stdin=manifest)
    await driver.wait_phase("migrate-2026-11", {"Succeeded"}, operator=operator)

    again = driver.run("migrate-2026-11")
    assert again["metadata"]["uid"] != first_uid
    assert again["status"]["duplicateOf"] == {
        "name": "migrate-2026-11",
        "uid": first_uid,
        "phase": "Succeeded",
    }
    owners = [
        reference.uid
        for job in driver.jobs("migrate-2026-11")
        for reference in job.metadata.owner_references or []
    ]
    assert again["metadata"]["uid"] not in owners
    reasons = {c["type"]: c["reason"] for c in again["status"]["conditions"]}
    assert reasons["Duplicate"] == "IdempotencyKey"
