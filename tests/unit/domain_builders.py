"""Small builders of WorkflowDefinition specs for the domain and CLI tests."""

from __future__ import annotations

from typing import Any


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
