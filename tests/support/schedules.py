"""WorkflowSchedules in cluster tests: a quick workflow, a schedule object, the runs it made."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flowforge.domain.api import API_VERSION, GROUP, RUN_PLURAL, VERSION
from flowforge.domain.schedule import KIND
from flowforge.kube.schedule_objects import NOMINAL_TIME_ANNOTATION, SCHEDULE_LABEL
from tests.plugins.operator import RunDriver

QUICK = {
    "workflow": "tick",
    "version": 1,
    "taskTypes": {
        "step": {
            "image": "busybox:1.36",
            "command": ["true"],
            "annotations": {"flowforge.io/simulate-duration": "1s"},
        }
    },
    "tasks": [{"key": "only", "type": "step"}],
}


def schedule(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"workflow": "tick", "version": 1, **spec},
    }


def runs_of(driver: RunDriver, name: str) -> dict[str, dict[str, Any]]:
    listing = driver.custom.list_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, RUN_PLURAL, label_selector=f"{SCHEDULE_LABEL}={name}"
    )
    return {item["metadata"]["name"]: item for item in listing["items"]}


def nominal(run: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(run["metadata"]["annotations"][NOMINAL_TIME_ANNOTATION])
