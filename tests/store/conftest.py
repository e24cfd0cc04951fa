"""Builders shared by the store tests: definitions, a held lease, a published run."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import pytest

from flowforge.domain.models import DefinitionSpec
from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.lease import Fence, acquire_lease
from flowforge.store.runs import RunRecord, create_run

pytestmark = pytest.mark.store

NAMESPACE = "team-a"


def definition(
    tasks: Sequence[Mapping[str, Any]],
    *,
    workflow: str = "etl",
    version: int = 1,
    description: str = "",
) -> DefinitionSpec:
    document: dict[str, Any] = {
        "workflow": workflow,
        "version": version,
        "taskTypes": {"py": {"image": "python:3.12-slim"}},
        "tasks": [{"type": "py", **task} for task in tasks],
    }
    if description:
        document["description"] = description
    return parse_definition(document)


@pytest.fixture
async def fence(store: Pool) -> Fence:
    lease = await acquire_lease(store, holder="test-operator", ttl=timedelta(minutes=5))
    assert lease is not None
    return lease.fence


@dataclasses.dataclass(frozen=True)
class StartedRun:
    run: RunRecord
    spec: DefinitionSpec


async def start_run(
    pool: Pool,
    fence: Fence,
    tasks: Sequence[Mapping[str, Any]],
    *,
    workflow: str = "etl",
) -> StartedRun:
    spec = definition(tasks, workflow=workflow)
    await publish_definition(pool, namespace=NAMESPACE, definition=spec)
    stored = await load_definition(pool, namespace=NAMESPACE, workflow=workflow, version=1)
    created = await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name=f"{workflow}-run",
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters={"date": "2026-11-30"},
    )
    return StartedRun(run=created.run, spec=spec)
