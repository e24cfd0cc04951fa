"""Small builders of WorkflowDefinition specs (and a run's status) for the domain and CLI
tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flowforge.domain.projection import StatusInput, TaskCounts, project_status
from flowforge.domain.states import RunPhase


def task(key: str, *depends_on: str, **fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {"key": key, "type": fields.pop("type", "py")}
    if depends_on:
        document["dependsOn"] = list(depends_on)
    document.update(fields)
    return document


def spec(*tasks: dict[str, Any], **fields: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "workflow": "etl",
        "version": 3,
        "taskTypes": {"py": {"image": "python:3.12-slim", "command": ["python", "-m", "steps"]}},
        "tasks": list(tasks) or [task("extract")],
    }
    document.update(fields)
    return document


def succeeded_status(counts: TaskCounts) -> dict[str, Any]:
    """The status body of a run that succeeded with ``counts``."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    return project_status(
        StatusInput(
            phase=RunPhase.SUCCEEDED,
            counts=counts,
            fingerprint="sha256:x",
            started_at=now,
            finished_at=now,
            now=now,
        )
    )
