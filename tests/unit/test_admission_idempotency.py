"""Run admission on ``spec.idempotencyKey``, as a hostile author would fill it: refused with
the field named, never passed on to the store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowforge.admission.review import AdmissionRequest, decide_run
from tests.unit.admission_fakes import NAMESPACE, RUNS, InMemoryRegistry, definition_spec, wrap


def decide(key: Any) -> tuple[bool, str]:
    registry = InMemoryRegistry()
    registry.publish(definition_spec())
    spec = {"workflow": "etl", "version": 1, "parameters": {"n": "1", "date": "d"}}
    request = AdmissionRequest(
        operation="CREATE",
        namespace=NAMESPACE,
        new_object=wrap("WorkflowRun", {**spec, "idempotencyKey": key}, name="keyed"),
        old_object=None,
        dry_run=False,
        user="mallory",
    )
    verdict = asyncio.run(decide_run(request, registry, runs=RUNS))
    return verdict.allowed, verdict.message


def test_a_release_or_a_commit_is_a_key() -> None:
    for key in ("release-2026.12.02", "git:3f9c2a1", "a", "team/app/v1_2", "x" * 253):
        assert decide(key) == (True, ""), key


@pytest.mark.parametrize(
    "key",
    ["", "x" * 254, "-leading", "trailing.", "white space", "new\nline", "ünï", 7, ["k"]],
)
def test_a_hostile_key_is_refused_naming_the_field(key: Any) -> None:
    allowed, message = decide(key)

    assert not allowed
    assert "spec.idempotencyKey" in message
