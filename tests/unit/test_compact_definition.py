"""The compact in-memory form of a definition keeps what running it needs, and only that."""

from __future__ import annotations

import pytest

from flowforge.domain.compact import RunDefinition
from flowforge.domain.validation import parse_definition

DOCUMENT = {
    "workflow": "etl",
    "version": 2,
    "taskTypes": {
        "py": {"image": "python:3.12-slim", "pendingTimeoutSeconds": 30},
        "sh": {"image": "busybox:1.36"},
    },
    "tasks": [
        {"key": "extract", "type": "py", "config": {"source": "s3://b", "paths": [1, 2]}},
        {"key": "load", "type": "sh", "dependsOn": ["extract"]},
        {"key": "undo-extract", "type": "sh", "compensateFor": "extract"},
    ],
}


def test_it_keeps_each_tasks_type_config_and_compensation() -> None:
    spec = parse_definition(DOCUMENT)

    compact = RunDefinition.of(spec, fingerprint=spec.fingerprint)

    assert compact.fingerprint == spec.fingerprint
    assert (compact.spec.workflow, compact.spec.version) == ("etl", 2)
    assert compact.spec.forward_count == len(spec.forward_tasks) == 2
    assert compact.spec.task_count == 3
    for task in spec.tasks:
        kept = compact.spec.task(task.key)
        assert (kept.type, kept.config, kept.compensate_for) == (
            task.type,
            task.config,
            task.compensate_for,
        )
    assert compact.spec.task_types["py"] == spec.task_types["py"]
    assert compact.spec.task_types["py"].pending_timeout_seconds == 30
    with pytest.raises(KeyError):
        compact.spec.task("nope")


def test_a_config_handed_out_is_a_copy() -> None:
    spec = parse_definition(DOCUMENT)
    compact = RunDefinition.of(spec, fingerprint=spec.fingerprint)

    compact.spec.task("extract").config["source"] = "changed"

    assert compact.spec.task("extract").config == {"source": "s3://b", "paths": [1, 2]}
    assert compact.spec.task("load").config == {}
