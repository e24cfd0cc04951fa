"""Admission webhooks through the real apiserver, with kubectl as users run it.

The webhook server is `python -m flowforge.admission.server` (kopf) on 127.0.0.1 with
its own CA, backed by a real PostgreSQL store; the apiserver calls it because the
Validating/MutatingWebhookConfigurations built by `flowforge.kube.webhook_config` say so.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flowforge.localdev.controlplane import Cluster, kubectl_json
from flowforge.store.connection import Pool
from flowforge.store.definitions import list_versions
from tests.plugins.webhooks import WebhookServer
from tests.support.admission import apply, definition, names_of, run

pytestmark = [pytest.mark.cluster, pytest.mark.store]


INVALID_DEFINITIONS: list[tuple[str, dict[str, Any], str]] = [
    (
        "schema",
        definition(tasks=[{"key": "Not_A_Label", "type": "step"}]),
        "spec.tasks[0].key",
    ),
    (
        "duplicate-key",
        definition(tasks=[{"key": "a", "type": "step"}, {"key": "a", "type": "step"}]),
        "spec.tasks[1].key",
    ),
    (
        "unknown-task-type",
        definition(tasks=[{"key": "a", "type": "missing"}]),
        "spec.tasks[0].type",
    ),
    (
        "unknown-dependency",
        definition(tasks=[{"key": "a", "type": "step", "dependsOn": ["ghost"]}]),
        "spec.tasks[0].dependsOn[0]",
    ),
    (
        "compensation",
        definition(
            tasks=[
                {"key": "a", "type": "step"},
                {"key": "undo", "type": "step", "compensateFor": "a", "dependsOn": ["a"]},
            ]
        ),
        "spec.tasks[1]",
    ),
    (
        "cycle",
        definition(
            tasks=[
                {"key": "a", "type": "step", "dependsOn": ["b"]},
                {"key": "b", "type": "step", "dependsOn": ["a"]},
            ]
        ),
        "spec.tasks",
    ),
]


@pytest.mark.parametrize(
    ("kind", "manifest", "path"), INVALID_DEFINITIONS, ids=[case[0] for case in INVALID_DEFINITIONS]
)
async def test_invalid_definition_is_denied_with_its_field_path_and_leaves_no_trace(
    cluster: Cluster,
    namespace: str,
    admission_webhooks: WebhookServer,
    webhook_store: Pool,
    kind: str,
    manifest: dict[str, Any],
    path: str,
) -> None:
    applied = apply(cluster, namespace, manifest)
    dry_run = apply(cluster, namespace, manifest, dry_run=True)

    assert applied.returncode != 0, f"{kind}: admitted: {applied.stdout}"
    # The CRD's structural schema runs before validating webhooks and already refuses many
    # shape errors itself, in the same Kubernetes path style; graph errors reach the webhook.
    refused_by = "is invalid" if kind == "schema" else "denied the request"
    assert refused_by in applied.stderr, applied.stderr
    assert f"{path}" in applied.stderr, applied.stderr
    assert dry_run.returncode != 0
    assert dry_run.stderr.replace("(server dry run)", "") == applied.stderr.replace(
        "(server dry run)", ""
    )
    assert names_of(cluster, namespace, "workflowdefinitions") == []
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []
    admission_webhooks.assert_alive()


async def test_dry_run_admits_a_valid_definition_without_a_trace(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer, webhook_store: Pool
) -> None:
    result = apply(cluster, namespace, definition(), dry_run=True)

    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout
    assert names_of(cluster, namespace, "workflowdefinitions") == []
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []


async def test_versions_are_immutable_and_new_versions_follow_the_newest(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer, webhook_store: Pool
) -> None:
    first = apply(cluster, namespace, definition())
    assert first.returncode == 0, first.stderr
    assert "created" in first.stdout
    # admission decides and never writes: nothing is published until an operator sees it
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []

    again = apply(cluster, namespace, definition())
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout

    labelled = definition()
    labelled["metadata"]["labels"] = {"team": "data"}
    assert apply(cluster, namespace, labelled).returncode == 0

    changed = definition(image="busybox:1.37")
    as_update = apply(cluster, namespace, changed)
    assert as_update.returncode != 0
    # refused by the CRD's immutability rule before the webhook is asked; same advice
    assert "publish a new version" in as_update.stderr

    # the same version under another name, with other content: the stored object holds it
    for dry_run in (True, False):
        other_name = apply(
            cluster, namespace, definition(name="etl-copy", image="evil"), dry_run=dry_run
        )
        assert other_name.returncode != 0
        assert "version 1 is already held by another WorkflowDefinition object" in other_name.stderr
        assert "publish a new version" in other_name.stderr

    skip = apply(cluster, namespace, definition(name="etl-max", version=2**31 - 1))
    assert skip.returncode != 0
    assert "spec.version: version 2147483647 skips versions;" in skip.stderr
    assert "the newest is" not in skip.stderr  # the stored versions are not repeated

    second = apply(cluster, namespace, definition(name="etl-v2", version=2, image="busybox:1.37"))
    assert second.returncode == 0, second.stderr
    assert sorted(names_of(cluster, namespace, "workflowdefinitions")) == ["etl-v1", "etl-v2"]
    assert await list_versions(webhook_store, namespace=namespace, workflow="etl") == []


async def test_runs_must_name_a_published_version_and_get_the_newest_pinned(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    unknown = apply(cluster, namespace, run(name="too-early"))
    assert unknown.returncode != 0
    assert "'etl' has no published version" in unknown.stderr

    for version in (1, 2):
        manifest = definition(name=f"etl-v{version}", version=version, description=f"v{version}")
        assert apply(cluster, namespace, manifest).returncode == 0

    unpublished = apply(cluster, namespace, run(name="pinned-7", version=7))
    assert unpublished.returncode != 0
    assert "version 7 is not published" in unpublished.stderr
    assert "1, 2" not in unpublished.stderr  # the stored versions are not repeated

    dry = apply(cluster, namespace, run(name="newest"), dry_run=True)
    assert dry.returncode == 0, dry.stderr
    assert names_of(cluster, namespace, "workflowruns") == []

    created = apply(cluster, namespace, run(name="newest", parameters={"date": "2026-11-30"}))
    assert created.returncode == 0, created.stderr
    stored = kubectl_json(cluster, "get", "workflowrun", "newest", "-n", namespace)
    assert stored["spec"]["version"] == 2

    explicit = apply(cluster, namespace, run(name="older", version=1))
    assert explicit.returncode == 0, explicit.stderr
    stored_older = kubectl_json(cluster, "get", "workflowrun", "older", "-n", namespace)
    assert stored_older["spec"]["version"] == 1


async def test_only_cancel_may_change_on_a_stored_run(
    cluster: Cluster, namespace: str, admission_webhooks: WebhookServer
) -> None:
    assert apply(cluster, namespace, definition()).returncode == 0
    original = run(name="r", parameters={"date": "2026-11-30"})
    assert apply(cluster, namespace, original).returncode == 0

    reparametrised = copy.deepcopy(original)
    reparametrised["spec"]["parameters"] = {"date": "2026-12-01"}
    refused = apply(cluster, namespace, reparametrised)
    assert refused.returncode != 0
    assert "spec.parameters: cannot change" in refused.stderr

    cancelled = copy.deepcopy(original)
    cancelled["spec"]["cancel"] = True
    accepted = apply(cluster, namespace, cancelled)
    assert accepted.returncode == 0, accepted.stderr
    stored = kubectl_json(cluster, "get", "workflowrun", "r", "-n", namespace)
    assert stored["spec"]["cancel"] is True
    assert stored["spec"]["version"] == 1
