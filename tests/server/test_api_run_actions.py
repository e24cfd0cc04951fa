"""A person's WorkflowRunActions through the read API, end to end: the caller's own create
(RBAC, then the admission webhooks on the operator's store record the caller as the actor and
check the action's verb), the operator applying it, and the run's history read back as
``.../actions`` and in the run's detail. Refusals keep their cause: the server's own checks
(400 naming the field, 401, 403 naming the permission, CSRF), RBAC's and admission's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.run_actions import MAX_REASON_LENGTH, PLURAL
from flowforge.localdev.controlplane import Cluster
from tests.plugins.api_server import (
    READER_RULES,
    ApiServer,
    Tenancy,
    create_run,
    reader_token,
    wait_phase,
)
from tests.plugins.webhooks import WebhookServer, webhooks_on_store

pytestmark = pytest.mark.cluster

RUN = "hold-a"


@pytest.fixture(scope="module")
def action_webhooks(
    cluster: Cluster, tenancy: Tenancy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WebhookServer]:
    """The webhooks on the operator's store (the tenancy's definitions are published
    there), enforced by the apiserver for this module."""
    directory = tmp_path_factory.mktemp("action-webhooks")
    with webhooks_on_store(cluster, directory=directory, dsn=tenancy.admin_dsn) as server:
        yield server


@pytest.fixture(scope="module")
async def held_run(
    tenancy: Tenancy, engine: object, action_webhooks: WebhookServer
) -> AsyncIterator[str]:
    """A run of the slow workflow (one 60 s task), running; cancelled afterwards."""
    create_run(tenancy.api, tenancy.a, RUN, "slow")
    await wait_phase(tenancy.api, tenancy.a, RUN, {"Running"})
    yield RUN
    k8s.CustomObjectsApi(tenancy.api).patch_namespaced_custom_object(
        GROUP, VERSION, tenancy.a, "workflowruns", RUN, {"spec": {"cancel": True}}
    )


def _base(tenancy: Tenancy) -> str:
    return f"/api/v1/namespaces/{tenancy.a}/runs/{RUN}"


async def _actions(api_server: ApiServer, tenancy: Tenancy, count: int) -> list[dict[str, Any]]:
    """The run's actions once the history holds ``count`` of them."""
    deadline = time.monotonic() + 30
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        answer = api_server.request(f"{_base(tenancy)}/actions", token=tenancy.reader_token)
        assert answer.status == 200, answer.body
        items = answer.json()["items"]
        if len(items) >= count:
            return items
        await asyncio.sleep(0.2)
    raise AssertionError(f"the history holds {items}, not {count} actions")


async def test_pause_resume_and_a_refusal_recorded_with_the_caller_as_actor(
    api_server: ApiServer, tenancy: Tenancy, held_run: str
) -> None:
    token, base = tenancy.reader_token, _base(tenancy)
    reader = f"system:serviceaccount:{tenancy.a}:reader"
    paused = api_server.request(
        f"{base}/actions", token=token, method="POST", body={"action": "Pause"}
    )
    assert paused.status == 201, paused.body
    reference = paused.json()
    assert reference["namespace"] == tenancy.a and reference["run"] == RUN
    assert reference["name"].startswith(f"{RUN}-pause-")
    created = k8s.CustomObjectsApi(tenancy.api).get_namespaced_custom_object(
        GROUP, VERSION, tenancy.a, PLURAL, reference["name"]
    )
    assert created["spec"] == {"run": RUN, "action": "Pause"}

    (pause,) = await _actions(api_server, tenancy, 1)
    assert pause["name"] == reference["name"] and pause["result"] == "Accepted", pause
    assert pause["actor"]["username"] == reader
    assert pause["task"] is None and pause["compensator"] is None and pause["at"]
    detail = api_server.request(base, token=token).json()
    assert detail["paused"] is True and detail["actions"] == [pause]

    resumed = api_server.request(
        f"{base}/actions", token=token, method="POST", body={"action": "Resume", "reason": "go"}
    )
    assert resumed.status == 201, resumed.body
    refused = api_server.request(
        f"{base}/actions",
        token=token,
        method="POST",
        body={"action": "SkipCompensator", "compensator": "wait", "reason": "done by hand"},
    )
    assert refused.status == 201, refused.body
    _, resume, skip = await _actions(api_server, tenancy, 3)
    assert (resume["action"], resume["result"], resume["reason"]) == ("Resume", "Accepted", "go")
    assert (skip["action"], skip["result"], skip["compensator"]) == (
        "SkipCompensator",
        "Refused",
        "wait",
    )
    assert skip["reason"] == "done by hand" and "not halted" in skip["message"], skip
    assert api_server.request(base, token=token).json()["paused"] is False


def test_refusals_name_the_field_the_permission_or_the_header(
    api_server: ApiServer, tenancy: Tenancy, cluster: Cluster, held_run: str
) -> None:
    token, path = tenancy.reader_token, f"{_base(tenancy)}/actions"
    for body, fragment in (
        ({"action": "Explode"}, "action"),
        ({}, "action"),
        ({"action": "Pause", "reason": "x" * (MAX_REASON_LENGTH + 1)}, "reason"),
        ({"action": "Pause", "compensator": "wait"}, "compensator"),
        ({"action": "Reject", "task": "wait"}, "reason"),
        ({"action": "SkipCompensator", "compensator": "wait", "reason": "  "}, "reason"),
        ({"action": "RetryCompensator"}, "compensator"),
        ({"action": "Pause", "run": "another"}, "run"),
        ({"action": "Pause", "task": 7}, "task"),
        (b"{not json", "JSON"),
    ):
        answer = api_server.request(path, token=token, method="POST", body=body)
        assert answer.status == 400, (body, answer.body)
        assert answer.json()["error"]["reason"] == "BadRequest"
        assert fragment in answer.json()["error"]["message"], (body, answer.body)

    pause = {"action": "Pause"}
    assert api_server.request(path, method="POST", body=pause).status == 401
    # a form or text/plain POST from another site carries neither the header nor JSON
    forged = api_server.request(
        path,
        token=token,
        method="POST",
        body=b'{"action": "Pause"}',
        headers={"Content-Type": "text/plain"},
    )
    assert forged.status == 403 and "X-FlowForge-Request" in forged.json()["error"]["message"]
    missing = api_server.request(
        f"/api/v1/namespaces/{tenancy.a}/runs/no-such-run/actions",
        token=token,
        method="POST",
        body=pause,
    )
    assert missing.status == 404, missing.body

    other = f"/api/v1/namespaces/{tenancy.b}/runs/{RUN}/actions"
    for method in ("GET", "POST"):
        denied = api_server.request(
            other, token=token, method=method, body=pause if method == "POST" else None
        )
        assert denied.status == 403, denied.body
        assert "get on workflowruns.flowforge.io" in denied.json()["error"]["message"]

    # may read runs, may not create actions: RBAC's refusal, as the apiserver words it
    readers_only = reader_token(
        cluster,
        tenancy.a,
        account="runs-reader",
        rules=[READER_RULES[0]],
    )
    refused = api_server.request(path, token=readers_only, method="POST", body=pause)
    assert refused.status == 403, refused.body
    assert "workflowrunactions" in refused.json()["error"]["message"]
    # may create actions, not pause this run: admission's refusal names the verb
    no_verb = reader_token(
        cluster, tenancy.a, account="no-pause", rules=[READER_RULES[0], READER_RULES[2]]
    )
    refused = api_server.request(path, token=no_verb, method="POST", body=pause)
    assert refused.status == 403, refused.body
    assert "verb pause on workflowruns.flowforge.io" in refused.json()["error"]["message"]
