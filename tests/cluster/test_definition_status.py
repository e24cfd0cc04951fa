"""A WorkflowDefinition's status shows what the operator made of it: its task count (the
TASKS column of `kubectl get wfd`) and fingerprint, or why it could not be published."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowforge.domain.api import API_VERSION, DEFINITION_KIND, DEFINITION_PLURAL, GROUP, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.store.definitions import list_versions
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

SPEC: dict[str, Any] = {
    "workflow": "shown",
    "version": 1,
    "taskTypes": {"step": {"image": "busybox:1.36"}},
    "tasks": [
        {"key": "a", "type": "step"},
        {"key": "b", "type": "step", "dependsOn": ["a"]},
        {"key": "undo-a", "type": "step", "compensateFor": "a"},
    ],
}


async def _status_when(driver: RunDriver, name: str, field: str) -> dict[str, Any]:
    status: dict[str, Any] = {}

    async def shown() -> dict[str, Any] | None:
        nonlocal status
        body = await asyncio.to_thread(
            driver.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            driver.namespace,
            DEFINITION_PLURAL,
            name,
        )
        status = body.get("status") or {}
        return status if field in status else None

    found: dict[str, Any] = await wait_until(
        shown, timeout=30, what=lambda: f"status.{field} of {name}, its status: {status}"
    )
    return found


def _create(driver: RunDriver, name: str, spec: dict[str, Any]) -> None:
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


async def test_a_definition_shows_its_task_count_and_fingerprint(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    _create(driver, "shown-v1", SPEC)
    status = await _status_when(driver, "shown-v1", "taskCount")
    assert status["taskCount"] == 3
    assert status["fingerprint"] == parse_definition(SPEC).fingerprint
    assert status["message"] == "published"
    assert await list_versions(driver.pool, namespace=driver.namespace, workflow="shown") == [1]


async def test_an_unusable_definition_says_why_and_is_not_published(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    # No admission webhook here, as for a definition stored before the webhook existed.
    cyclic = {
        **SPEC,
        "workflow": "cyclic",
        "tasks": [
            {"key": "a", "type": "step", "dependsOn": ["b"]},
            {"key": "b", "type": "step", "dependsOn": ["a"]},
        ],
    }
    _create(driver, "cyclic-v1", cyclic)
    status = await _status_when(driver, "cyclic-v1", "message")
    assert status["message"].startswith("not published:")
    assert "a -> b -> a" in status["message"] or "b -> a -> b" in status["message"]
    assert "taskCount" not in status
    assert await list_versions(driver.pool, namespace=driver.namespace, workflow="cyclic") == []
