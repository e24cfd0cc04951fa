"""Fuzzing the running webhook server with malformed documents inside AdmissionReviews.

Whatever the object holds (wrong types, huge strings, deep nesting, unicode, 10,000 tasks,
nothing at all), the server answers 200 with an AdmissionReview: a malformed document is
denied with a message and a 4xx code, never a 500, a hang or a crash of the server. Reviews
go straight to the server over HTTPS (trusting only the test CA), as the apiserver sends them.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowforge.domain.api import (
    REQUESTED_BY_ANNOTATION,
)
from flowforge.domain.run import RunSpec
from flowforge.domain.validation import validate_spec
from flowforge.kube.webhook_config import (
    MUTATE_RUN_HANDLER_ID,
    VALIDATE_DEFINITION_HANDLER_ID,
    VALIDATE_RUN_HANDLER_ID,
)
from tests.plugins.webhooks import WebhookHttps, WebhookServer
from tests.support.admission import admission_review, wrap

pytestmark = [pytest.mark.cluster, pytest.mark.store]

FUZZ_NAMESPACE = f"fuzz-{uuid.uuid4().hex[:8]}"
# Runs are fuzzed where nothing is ever published, so that none can be admitted.
FUZZ_RUN_NAMESPACE = f"fuzz-runs-{uuid.uuid4().hex[:8]}"
FUZZ_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def post_review(https: WebhookHttps, handler_id: str, review: bytes) -> dict[str, Any]:
    result = https.post(handler_id, review)
    assert result.status == 200, f"HTTP {result.status}: {result.body[:500]!r}"
    response: dict[str, Any] = result.json()["response"]
    return response


def assert_denied_with_message(response: dict[str, Any]) -> None:
    assert response["allowed"] is False, response
    status = response.get("status", {})
    assert status.get("message"), response
    assert 400 <= int(status.get("code", 0)) < 500, response


# --- strategies ---------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=30,
)
task_keys = st.one_of(
    st.sampled_from(["extract", "load", "a", "b"]),
    st.text(max_size=70),
    json_values,
)


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


@st.composite
def malformed_tasks(draw: st.DrawFn) -> Any:
    task = st.fixed_dictionaries(
        {"key": task_keys, "type": st.one_of(st.just("py"), json_values)},
        optional={
            "dependsOn": st.one_of(st.lists(task_keys, max_size=4), json_values),
            "compensateFor": task_keys,
            "retries": json_values,
            "timeoutSeconds": json_values,
            "config": st.one_of(json_values, st.integers(20, 200).map(lambda d: nested(d, 1))),
            draw(st.text(min_size=1, max_size=10)): json_values,
        },
    )
    return draw(st.one_of(st.lists(task, max_size=8), json_values))


valid_like_spec = st.fixed_dictionaries(
    {
        "workflow": st.one_of(st.just("etl"), st.text(max_size=80), json_values),
        "version": st.one_of(st.just(1), json_values),
        "taskTypes": st.one_of(
            st.just({"py": {"image": "python:3.12-slim"}}),
            st.dictionaries(st.text(max_size=10), json_values, max_size=3),
            json_values,
        ),
        "tasks": malformed_tasks(),
    },
    optional={
        "description": st.one_of(st.text(), st.just("é" * 70_000), json_values),
        "x-unknown-field": json_values,
    },
)

definition_specs = st.one_of(
    valid_like_spec,
    json_values,
    st.just({}),
    st.just(None),
    st.just("\U0001f4a5" * 200_000),
    st.integers(50, 300).map(lambda depth: {"tasks": nested(depth, "deep")}),
)


# --- properties ---------------------------------------------------------------------------------


@FUZZ_SETTINGS
@given(spec=definition_specs, dry_run=st.booleans(), drop=st.sampled_from([(), ("spec",)]))
def test_definition_verdicts_match_the_validator_and_never_crash(
    webhook_server: WebhookServer, webhook_https: WebhookHttps, spec: Any, dry_run: bool, drop: Any
) -> None:
    obj = wrap("WorkflowDefinition", spec, drop=drop, namespace=FUZZ_NAMESPACE)
    response = post_review(
        webhook_https,
        VALIDATE_DEFINITION_HANDLER_ID,
        admission_review(obj, dry_run=dry_run, namespace=FUZZ_NAMESPACE),
    )
    if validate_spec(obj.get("spec")):
        assert_denied_with_message(response)
    elif not response["allowed"]:
        # Valid content is only refused when it clashes with an already published version,
        # is not the next version, or nests deeper than the server's guard.
        status = response["status"]
        assert (
            status["code"] == 409
            or "a new version must be the next integer" in status["message"]
            or "levels deep" in status["message"]
        ), response


run_specs = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"workflow": st.one_of(st.just("etl"), json_values)},
        optional={
            "version": json_values,
            "parameters": json_values,
            "cancel": json_values,
            "extra": json_values,
        },
    ),
)


def _patched(response: dict[str, Any]) -> list[tuple[str, Any]]:
    operations = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
    return [(operation["path"], operation["value"]) for operation in operations]


@FUZZ_SETTINGS
@given(spec=run_specs)
def test_run_verdicts_never_crash(
    webhook_server: WebhookServer, webhook_https: WebhookHttps, spec: Any
) -> None:
    obj = wrap("WorkflowRun", spec, namespace=FUZZ_RUN_NAMESPACE)
    review = admission_review(obj, kind="WorkflowRun", namespace=FUZZ_RUN_NAMESPACE)
    mutation = post_review(webhook_https, MUTATE_RUN_HANDLER_ID, review)
    assert mutation["allowed"] is True, mutation
    # only who asks is recorded: a malformed spec is left for the validating webhook
    assert _patched(mutation) == [
        ("/metadata/annotations", {REQUESTED_BY_ANNOTATION: "fuzzer"})
    ] or _patched(mutation) == [("/metadata/annotations/flowforge.io~1requested-by", "fuzzer")], (
        mutation
    )
    validation = post_review(webhook_https, VALIDATE_RUN_HANDLER_ID, review)
    assert_denied_with_message(validation)
    shape_ok = isinstance(spec, dict)
    if shape_ok:
        try:
            RunSpec.model_validate(spec, strict=True)
        except ValueError:
            shape_ok = False
    if not shape_ok:
        assert validation["status"]["code"] == 422, validation


def test_ten_thousand_tasks_with_one_defect_are_denied(
    webhook_server: WebhookServer, webhook_https: WebhookHttps
) -> None:
    tasks: list[dict[str, Any]] = [{"key": f"t{i}", "type": "py"} for i in range(10_000)]
    for index in range(1, len(tasks)):
        tasks[index]["dependsOn"] = [f"t{index - 1}"]
    tasks[-1]["dependsOn"] = ["t-missing"]
    spec = {"workflow": "big", "version": 1, "taskTypes": {"py": {"image": "x"}}, "tasks": tasks}
    response = post_review(
        webhook_https,
        VALIDATE_DEFINITION_HANDLER_ID,
        admission_review(
            wrap("WorkflowDefinition", spec, namespace=FUZZ_NAMESPACE),
            dry_run=False,
            namespace=FUZZ_NAMESPACE,
        ),
    )
    assert_denied_with_message(response)
    assert "spec.tasks[9999].dependsOn[0]" in response["status"]["message"]


def deep_json(levels: int) -> bytes:
    """Nesting too deep for json.dumps itself to write, written by hand."""
    return b'{"n":[' * (levels // 2) + b"1" + b"]}" * (levels // 2)


@pytest.mark.parametrize("levels", [600, 2_000, 20_000])
@pytest.mark.parametrize("where", ["spec", "config"])
def test_deeply_nested_documents_are_denied(
    webhook_server: WebhookServer, webhook_https: WebhookHttps, levels: int, where: str
) -> None:
    task: dict[str, Any] = {"key": "a", "type": "py", "config": "DEEP"}
    spec: Any = (
        "DEEP"
        if where == "spec"
        else {
            "workflow": "deep",
            "version": 1,
            "taskTypes": {"py": {"image": "x"}},
            "tasks": [task],
        }
    )
    review = admission_review(
        wrap("WorkflowDefinition", spec, namespace=FUZZ_RUN_NAMESPACE), namespace=FUZZ_RUN_NAMESPACE
    )
    response = post_review(
        webhook_https,
        VALIDATE_DEFINITION_HANDLER_ID,
        review.replace(b'"DEEP"', deep_json(levels)),
    )
    assert_denied_with_message(response)
    assert "levels deep" in response["status"]["message"]
    assert response["uid"] == json.loads(review)["request"]["uid"]


def test_a_document_larger_than_aiohttps_default_limit_gets_a_verdict(
    webhook_server: WebhookServer, webhook_https: WebhookHttps
) -> None:
    spec = {
        "workflow": "large",
        "version": 1,
        "description": "\u00e9" * 1_500_000,
        "taskTypes": {"py": {"image": "x"}},
        "tasks": [{"key": "a", "type": "py"}],
    }
    response = post_review(
        webhook_https,
        VALIDATE_DEFINITION_HANDLER_ID,
        admission_review(
            wrap("WorkflowDefinition", spec, namespace=FUZZ_RUN_NAMESPACE),
            namespace=FUZZ_RUN_NAMESPACE,
        ),
    )
    assert_denied_with_message(response)
    assert "spec.description" in response["status"]["message"]


@pytest.mark.parametrize("handler_id", [VALIDATE_DEFINITION_HANDLER_ID, VALIDATE_RUN_HANDLER_ID])
def test_an_object_without_anything_is_denied(
    webhook_server: WebhookServer, webhook_https: WebhookHttps, handler_id: str
) -> None:
    kind = "WorkflowDefinition" if handler_id == VALIDATE_DEFINITION_HANDLER_ID else "WorkflowRun"
    namespace = FUZZ_RUN_NAMESPACE
    for obj in ({}, {"metadata": {"namespace": namespace}}, wrap(kind, None, namespace=namespace)):
        review = admission_review(obj, kind=kind, namespace=namespace)
        response = post_review(webhook_https, handler_id, review)
        assert_denied_with_message(response)


def test_the_server_survives_the_fuzzing(webhook_server: WebhookServer) -> None:
    webhook_server.assert_alive()
