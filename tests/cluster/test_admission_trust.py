"""Admission as an attacker meets it, through the real apiserver and straight at the server.

- A forged AdmissionReview, with the apiserver's client certificate or without one, changes
  nothing in the store (admission never writes); without a certificate the TLS handshake is
  refused; a review whose object names another namespace than the request is denied; one
  naming a user RBAC lets do nothing there is refused before anything is checked for them,
  while a user it lets publish is admitted through kubectl.
- Hostile bodies (megabytes of unterminated escapes, random bytes, deep nesting) get an answer
  and leave the server answering real admissions (timings: bench/bench_admission.py).
- Parameters and configs over the caps, colliding parameter env names and too-deep configs
  are refused at `kubectl apply`, naming the field.
"""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowforge.domain.caps import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIGS_TOTAL_BYTES,
    MAX_PARAMETERS,
)
from flowforge.kube.webhook_config import (
    MUTATE_RUN_HANDLER_ID,
    VALIDATE_DEFINITION_HANDLER_ID,
    VALIDATE_RUN_HANDLER_ID,
)
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions
from tests.plugins.webhooks import WebhookHttps, WebhookServer
from tests.support.admission import admission_review, apply, definition, names_of, run, wrap
from tests.support.rbac import grant

pytestmark = [pytest.mark.cluster, pytest.mark.store]

ATTACKER_IMAGE = "registry.example/attacker:latest"


def forged_definition(namespace: str, *, object_namespace: str | None = None) -> bytes:
    spec = definition(image=ATTACKER_IMAGE)["spec"]
    obj = wrap("WorkflowDefinition", spec, namespace=object_namespace or namespace)
    return admission_review(obj, dry_run=False, namespace=namespace)


async def test_a_forged_review_with_the_apiservers_certificate_changes_nothing(
    cluster: Cluster,
    namespace: str,
    admission_webhooks: WebhookServer,
    webhook_https: WebhookHttps,
    webhook_store: Pool,
) -> None:
    result = webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, forged_definition(namespace))
    assert result.status == 200, result.body[:300]
    # the forged user may not create Jobs there, so it is refused, naming the permission
    denied = result.json()["response"]
    assert denied["allowed"] is False
    assert "user fuzzer may not create jobs" in denied["status"]["message"]
    # forging an admin gets the content admitted (a question, not a command): nothing written
    review = json.loads(forged_definition(namespace))
    review["request"]["userInfo"] = {"username": "forged-admin", "groups": ["system:masters"]}
    result = webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, json.dumps(review).encode())
    assert result.json()["response"]["allowed"] is True
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []
    assert names_of(cluster, namespace, "workflowdefinitions") == []
    # so the victim's next unversioned run finds nothing of the attacker's to run
    refused = apply(cluster, namespace, run(name="victim-run"))
    assert refused.returncode != 0
    assert "'etl' has no published version" in refused.stderr


def test_who_asks_is_judged_by_the_apiserver_before_anything_is_read(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer, webhook_https: WebhookHttps
) -> None:
    # a user the cluster's RBAC lets publish is admitted as before, through kubectl
    rules = [
        {"apiGroups": ["flowforge.io"], "resources": ["workflowdefinitions"], "verbs": ["*"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
    ]
    grant(cluster, namespace, role="publisher", rules=rules, subject="dana")
    applied = kubectl(
        cluster, "apply", "--as", "dana", "-n", namespace, "-f", "-",
        stdin=json.dumps(definition()), check=False,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    # a forged review naming a user it lets do nothing there is refused naming the permission
    review = json.loads(forged_definition(namespace))
    review["request"]["userInfo"] = {"username": "stranger", "groups": ["system:authenticated"]}
    response = webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, json.dumps(review).encode())
    denied = response.json()["response"]
    assert denied["allowed"] is False and denied["status"]["code"] == 403
    assert (
        f"user stranger may not create workflowdefinitions in namespace {namespace} "
        "(verb create on workflowdefinitions.flowforge.io)"
    ) in denied["status"]["message"]
    assert "create jobs" not in denied["status"]["message"]  # nothing else was checked


async def test_a_review_naming_two_namespaces_is_denied(
    namespace: str, webhook_https: WebhookHttps, webhook_store: Pool
) -> None:
    body = forged_definition("attacker-ns", object_namespace=namespace)
    response = webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, body).json()["response"]
    assert response["allowed"] is False
    assert f"{namespace!r} is not the namespace of the request" in response["status"]["message"]
    for where in (namespace, "attacker-ns"):
        assert await list_versions(webhook_store, namespace=where, workflow="etl") == []


@pytest.mark.parametrize(
    "handler_id", [VALIDATE_DEFINITION_HANDLER_ID, VALIDATE_RUN_HANDLER_ID, MUTATE_RUN_HANDLER_ID]
)
async def test_without_a_client_certificate_the_handshake_is_refused(
    namespace: str,
    webhook_server: WebhookServer,
    anonymous_https: WebhookHttps,
    webhook_store: Pool,
    handler_id: str,
) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        anonymous_https.post(handler_id, forged_definition(namespace), timeout=10)
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []
    webhook_server.assert_alive()


# --- hostile bodies -----------------------------------------------------------------------------

UNDER_THE_BODY_LIMIT = 8 * 1024 * 1024 - 64


def unterminated_escapes(size: int) -> bytes:
    return b'{"request":{"uid":"' + b'\\"' * ((size - 19) // 2)


HOSTILE_BODIES = {
    "64KiB-unterminated-escapes": unterminated_escapes(64 * 1024),
    "8MiB-unterminated-escapes": unterminated_escapes(UNDER_THE_BODY_LIMIT),
    "8MiB-brackets": b"[" * UNDER_THE_BODY_LIMIT,
    "8MiB-objects": b'{"a":' * (UNDER_THE_BODY_LIMIT // 5),
    "over-the-body-limit": b" " * (8 * 1024 * 1024 + 1),
}


def assert_refused(result: Any) -> None:
    if result.status == 200:
        response = result.json()["response"]
        assert response["allowed"] is False, response
        assert response["status"]["message"]
    else:
        assert result.status in (400, 413), (result.status, result.body[:200])


def assert_real_admission_passes(cluster: Cluster, namespace: str) -> None:
    good = apply(cluster, namespace, definition(), dry_run=True)
    assert good.returncode == 0, good.stderr
    bad = apply(cluster, namespace, definition(tasks=[{"key": "a", "type": "nope"}]), dry_run=True)
    assert bad.returncode != 0 and "spec.tasks[0].type" in bad.stderr, bad.stderr


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_bodies_are_refused_and_admission_goes_on(
    cluster: Cluster,
    namespace: str,
    admission_webhooks: WebhookServer,
    webhook_https: WebhookHttps,
    name: str,
) -> None:
    assert_refused(webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, HOSTILE_BODIES[name]))
    admission_webhooks.assert_alive()
    assert_real_admission_passes(cluster, namespace)


hostile_fragments = st.one_of(
    st.binary(max_size=2048),
    st.sampled_from([b'\\"', b"\\", b'"', b"[", b"{", b'{"a":', b"\\u12", b"\xff", b","]).map(
        lambda fragment: fragment * 4096
    ),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fragments=st.lists(hostile_fragments, min_size=1, max_size=6))
def test_fuzzed_hostile_bodies_always_get_an_answer(
    admission_webhooks: WebhookServer, webhook_https: WebhookHttps, fragments: list[bytes]
) -> None:
    body = b'{"apiVersion":"admission.k8s.io/v1","request":' + b"".join(fragments)
    assert_refused(webhook_https.post(VALIDATE_DEFINITION_HANDLER_ID, body))


def test_the_server_still_admits_after_the_fuzzing(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    admission_webhooks.assert_alive()
    assert_real_admission_passes(cluster, namespace)


# --- caps at kubectl apply ----------------------------------------------------------------------


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


def json_nested(levels: int) -> str:
    """Deeper than json.dumps can write: by hand."""
    return '{"n":' * (levels - 1) + '{"leaf":1}' + "}" * (levels - 1)


def apply_text(cluster: Cluster, namespace: str, text: str) -> Any:
    return kubectl(cluster, "apply", "-n", namespace, "-f", "-", stdin=text, check=False)


@pytest.mark.parametrize(
    ("parameters", "field", "words"),
    [
        ({"batch-size": "1", "batch_size": "2"}, "spec.parameters[batch_size]", "FLOWFORGE_PARAM_"),
        ({f"p{i}": "x" for i in range(MAX_PARAMETERS + 1)}, "spec.parameters", "64"),
        ({"big": "x" * 5000}, "spec.parameters[big]", "4096"),
        ({f"p{i}": "x" * 4000 for i in range(5)}, "spec.parameters", "16384"),
    ],
    ids=["colliding-env-names", "count", "value", "total"],
)
def test_parameters_over_the_caps_are_refused_at_apply(
    cluster: Cluster,
    namespace: str,
    admission_webhooks: WebhookServer,
    parameters: dict[str, str],
    field: str,
    words: str,
) -> None:
    assert apply(cluster, namespace, definition()).returncode == 0
    refused = apply(cluster, namespace, run(name="capped", version=1, parameters=parameters))
    assert refused.returncode != 0
    assert field in refused.stderr and words in refused.stderr, refused.stderr
    assert names_of(cluster, namespace, "workflowruns") == []


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (json.dumps({"blob": "x" * (MAX_CONFIG_BYTES + 1)}), f"at most {MAX_CONFIG_BYTES}"),
        (json.dumps(nested(MAX_CONFIG_DEPTH + 1)), f"more than {MAX_CONFIG_DEPTH} levels"),
        (json_nested(3_000), "levels deep"),
    ],
    ids=["too-large", "too-deep", "3000-deep"],
)
def test_configs_over_the_caps_are_refused_at_apply(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer, config: str, words: str
) -> None:
    manifest = definition(tasks=[{"key": "a", "type": "step", "config": "CONFIG"}])
    text = json.dumps(manifest).replace('"CONFIG"', config)
    for dry_run in (True, False):
        args = ["apply", "-n", namespace, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        refused = kubectl(cluster, *args, stdin=text, check=False)
        assert refused.returncode != 0
        assert "spec.tasks[0].config" in refused.stderr and words in refused.stderr, refused.stderr[
            :2000
        ]
    assert names_of(cluster, namespace, "workflowdefinitions") == []
    admission_webhooks.assert_alive()


def test_configs_over_the_definitions_total_are_refused_at_apply(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    """Each config under its own cap, together over what a run's ConfigMap may hold."""
    near = {"blob": "x" * (MAX_CONFIG_BYTES - 100)}
    count = MAX_CONFIGS_TOTAL_BYTES // MAX_CONFIG_BYTES + 1
    tasks = [{"key": f"t{index}", "type": "step", "config": near} for index in range(count)]
    # create, not apply: kubectl apply would keep a copy in an annotation (at most 256 KiB)
    for dry_run in (True, False):
        args = ["create", "-n", namespace, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        text = json.dumps(definition(tasks=tasks))
        refused = kubectl(cluster, *args, stdin=text, check=False)
        assert refused.returncode != 0
        assert "spec.tasks: task configs total" in refused.stderr, refused.stderr[:2000]
        assert f"at most {MAX_CONFIGS_TOTAL_BYTES}" in refused.stderr, refused.stderr[:2000]
    assert names_of(cluster, namespace, "workflowdefinitions") == []
