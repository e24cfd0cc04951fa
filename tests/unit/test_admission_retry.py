"""Run admission's decisions on ``spec.retryOf`` and on who asked, without a cluster."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from flowforge.admission.review import (
    AdmissionRequest,
    JsonPatchOperation,
    decide_run,
    decide_run_mutation,
)
from flowforge.domain.api import REQUESTED_BY_ANNOTATION, RETRY_OF_ANNOTATION
from tests.unit.admission_fakes import (
    NAMESPACE,
    RUNS,
    InMemoryRegistry,
    definition_spec,
    update,
    wrap,
)


def registry() -> InMemoryRegistry:
    found = InMemoryRegistry()
    found.publish(definition_spec())
    return found


def request(retry_of: str, *, user: str = "alice", **metadata: Any) -> AdmissionRequest:
    spec = {"workflow": "etl", "version": 1, "parameters": {"n": "1", "date": "d"}}
    return AdmissionRequest(
        operation="CREATE",
        namespace=NAMESPACE,
        new_object=wrap("WorkflowRun", {**spec, "retryOf": retry_of}, name="new", **metadata),
        old_object=None,
        dry_run=False,
        user=user,
    )


def decide(req: AdmissionRequest) -> tuple[bool, str]:
    verdict = asyncio.run(decide_run(req, registry(), runs=RUNS))
    return verdict.allowed, verdict.message


def test_a_retry_of_a_failed_or_cancelled_run_with_the_same_parameters_is_admitted() -> None:
    assert decide(request("old")) == (True, "")  # parameters in another key order
    assert decide(request("stopped")) == (True, "")


def test_a_retry_is_refused_with_the_field_named() -> None:
    for name, words in [
        ("missing", "no run named 'missing' in namespace"),
        ("busy", "is not Failed or Cancelled"),
        ("done", "is not Failed or Cancelled"),
        ("other", "runs another workflow than spec.workflow"),
        ("new", "cannot retry itself"),
    ]:
        allowed, message = decide(request(name))
        assert not allowed and message.startswith("spec.retryOf: ") and words in message, name
        # the named run's stored phase and workflow are never repeated
        assert "Running" not in message and "Succeeded" not in message, name
        assert "billing" not in message, name


def test_other_parameters_are_refused() -> None:
    req = request("old")
    assert req.new_object is not None

    def with_parameters(parameters: dict[str, str]) -> tuple[bool, str]:
        assert req.new_object is not None
        spec = {**req.new_object["spec"], "parameters": parameters}
        return decide(dataclasses.replace(req, new_object={**req.new_object, "spec": spec}))

    allowed, message = with_parameters({"date": "d", "n": "2"})
    assert not allowed and "spec.retryOf" in message and "(these differ: n)" in message
    # the old run's stored values are never repeated to whoever asks
    assert '"1"' not in message and "n=1" not in message
    # nor the names of parameters only the old run was given
    allowed, message = with_parameters({"date": "d"})
    assert not allowed and "ran with other parameters;" in message and "differ" not in message


def test_a_retry_no_webhook_can_check_is_refused() -> None:
    verdict = asyncio.run(decide_run(request("old"), registry()))
    assert not verdict.allowed and "spec.retryOf" in verdict.message


def test_the_retired_annotation_and_a_forged_requester_are_refused() -> None:
    allowed, message = decide(request("old", annotations={RETRY_OF_ANNOTATION: "old"}))
    assert not allowed and "spec.retryOf" in message and RETRY_OF_ANNOTATION in message
    forged = request("old", annotations={REQUESTED_BY_ANNOTATION: "bob"})
    allowed, message = decide(forged)
    assert not allowed and REQUESTED_BY_ANNOTATION in message and "'alice'" in message
    assert decide(request("old", annotations={REQUESTED_BY_ANNOTATION: "alice"}))[0]


def test_the_mutating_webhook_records_the_requester_whatever_the_object_says() -> None:
    forged = request("old", annotations={REQUESTED_BY_ANNOTATION: "bob"})
    verdict = asyncio.run(decide_run_mutation(forged, registry()))
    path = "/metadata/annotations/flowforge.io~1requested-by"
    assert verdict.patch == (JsonPatchOperation(op="add", path=path, value="alice"),)


def test_who_asked_cannot_change_afterwards() -> None:
    old = wrap("WorkflowRun", {"workflow": "etl", "version": 1})
    old["metadata"]["annotations"] = {REQUESTED_BY_ANNOTATION: "alice"}
    new = {**old, "metadata": {**old["metadata"], "annotations": {REQUESTED_BY_ANNOTATION: "x"}}}
    verdict = asyncio.run(decide_run(update(old, new), registry()))
    assert not verdict.allowed and REQUESTED_BY_ANNOTATION in verdict.message
    assert asyncio.run(decide_run(update(old, old), registry())).allowed
