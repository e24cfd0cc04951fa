"""Acting through the read API as the signed-in user, and watching a run live: cancel and
retry are the user's own calls to the Kubernetes API (allowed in A, refused in B), a user
without ``pods/log`` cannot read logs, and the stream delivers a task's finish."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client as k8s

from flowforge.localdev.controlplane import Cluster, kubectl
from tests.plugins.api_server import (
    ApiServer,
    Tenancy,
    create_run,
    reader_token,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def _spec(tenancy: Tenancy, namespace: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = k8s.CustomObjectsApi(tenancy.api).get_namespaced_custom_object(
        "flowforge.io", "v1alpha1", namespace, "workflowruns", name
    )
    return dict(body["spec"])


async def test_cancel_as_the_user_in_a_and_refused_in_b(
    api_server: ApiServer, tenancy: Tenancy, engine: object
) -> None:
    token = tenancy.reader_token
    create_run(tenancy.api, tenancy.a, "slow-a", "slow")
    create_run(tenancy.api, tenancy.b, "slow-b", "slow")
    await wait_phase(tenancy.api, tenancy.a, "slow-a", {"Running"})
    cancelled = api_server.request(
        f"/api/v1/namespaces/{tenancy.a}/runs/slow-a/cancel", token=token, method="POST"
    )
    assert cancelled.status == 202, cancelled.body
    assert cancelled.json() == {"namespace": tenancy.a, "name": "slow-a"}
    await wait_phase(tenancy.api, tenancy.a, "slow-a", {"Cancelled"})

    refused = api_server.request(
        f"/api/v1/namespaces/{tenancy.b}/runs/slow-b/cancel", token=token, method="POST"
    )
    assert refused.status == 403, refused.body
    assert refused.json()["error"]["reason"] == "Forbidden"
    assert "reader" in refused.json()["error"]["message"]
    assert not _spec(tenancy, tenancy.b, "slow-b").get("cancel")
    gone = api_server.request(
        f"/api/v1/namespaces/{tenancy.a}/runs/no-such-run/cancel", token=token, method="POST"
    )
    assert gone.status == 404 and gone.json()["error"]["reason"] == "NotFound"


async def test_retry_as_the_user_in_a_and_refused_in_b(
    api_server: ApiServer, tenancy: Tenancy, engine: object
) -> None:
    token = tenancy.reader_token
    create_run(tenancy.api, tenancy.a, "fail-a", "failing")
    create_run(tenancy.api, tenancy.b, "fail-b", "failing")
    await wait_phase(tenancy.api, tenancy.a, "fail-a", {"Failed"})
    detail = api_server.request(f"/api/v1/namespaces/{tenancy.a}/runs/fail-a", token=token).json()
    rollback = detail["compensation"]
    assert rollback["state"] == "Completed" and rollback["triggeredBy"] == "ship"
    assert [(s["order"], s["task"], s["compensator"]) for s in rollback["steps"]] == [
        (1, "reserve", "release")
    ]
    ship = next(task for task in detail["tasks"] if task["name"] == "ship")
    assert ship["state"] == "failed" and ship["exitCode"] == 3

    retried = api_server.request(
        f"/api/v1/namespaces/{tenancy.a}/runs/fail-a/retry", token=token, method="POST"
    )
    assert retried.status == 201, retried.body
    name = retried.json()["name"]
    assert name.startswith("fail-a-retry-")
    assert _spec(tenancy, tenancy.a, name)["retryOf"] == "fail-a"
    await wait_phase(tenancy.api, tenancy.a, name, {"Failed"})
    again = api_server.request(f"/api/v1/namespaces/{tenancy.a}/runs/{name}", token=token).json()
    assert again["retryOf"] == "fail-a"

    refused = api_server.request(
        f"/api/v1/namespaces/{tenancy.b}/runs/fail-b/retry", token=token, method="POST"
    )
    assert refused.status == 403, refused.body
    listed = k8s.CustomObjectsApi(tenancy.api).list_namespaced_custom_object(
        "flowforge.io", "v1alpha1", tenancy.b, "workflowruns"
    )
    assert not [r for r in listed["items"] if r["metadata"]["name"].startswith("fail-b-retry")]


def test_logs_need_pods_log(api_server: ApiServer, tenancy: Tenancy, cluster: Cluster) -> None:
    """A user who may read runs but not ``pods/log`` gets a 403 naming it."""
    kubectl(cluster, "create", "serviceaccount", "runs-only", "-n", tenancy.a, check=False)
    kubectl(
        cluster,
        "create",
        "role",
        "runs-only-flowforge",
        "-n",
        tenancy.a,
        "--verb=get,list",
        "--resource=workflowruns.flowforge.io",
        check=False,
    )
    kubectl(
        cluster,
        "create",
        "rolebinding",
        "runs-only-flowforge",
        "-n",
        tenancy.a,
        "--role=runs-only-flowforge",
        f"--serviceaccount={tenancy.a}:runs-only",
        check=False,
    )
    token = kubectl(cluster, "create", "token", "runs-only", "-n", tenancy.a).stdout.strip()
    create_run(tenancy.api, tenancy.a, "logs-a", "slow")
    base = f"/api/v1/namespaces/{tenancy.a}/runs/logs-a"
    deadline = time.monotonic() + 30
    while api_server.request(base, token=token).status == 404 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert api_server.request(base, token=token).status == 200
    denied = api_server.request(f"{base}/tasks/wait/attempts/1/log", token=token)
    assert denied.status == 403, denied.body
    assert "pods/log" in denied.json()["error"]["message"]
    api_server.request(f"{base}/cancel", token=tenancy.reader_token, method="POST")


def _events(
    api_server: ApiServer, path: str, token: str, *, timeout: float
) -> list[tuple[str, Any]]:
    """Read the stream until it ends; [(event, data)]."""
    url = urlparse(api_server.url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
    connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert response.getheader("content-type", "").startswith("text/event-stream")
    events: list[tuple[str, Any]] = []
    kind = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = response.readline().decode()
        if not line:
            break
        if line.startswith("event: "):
            kind = line.removeprefix("event: ").strip()
        elif line.startswith("data: "):
            events.append((kind, json.loads(line.removeprefix("data: "))))
    connection.close()
    return events


async def test_the_stream_delivers_a_task_finishing(
    api_server: ApiServer, tenancy: Tenancy, engine: object, cluster: Cluster
) -> None:
    token = tenancy.reader_token
    create_run(tenancy.api, tenancy.a, "live-a", "diamond")
    path = f"/api/v1/namespaces/{tenancy.a}/runs/live-a"
    deadline = time.monotonic() + 30
    while api_server.request(path, token=token).status == 404 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    events = await asyncio.to_thread(_events, api_server, f"{path}/stream", token, timeout=60)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "snapshot" and set(kinds[1:]) == {"change"}, kinds
    snapshot = events[0][1]
    assert set(snapshot["states"]) == {"a", "b", "c", "d", "undo-a"}
    finished = [
        (key, state)
        for _, data in events[1:]
        for key, state in data["states"].items()
        if state == "succeeded"
    ]
    assert ("d", "succeeded") in finished, events
    last = events[-1][1]
    assert last["run"]["phase"] == "Succeeded"
    assert last["run"]["progress"]["succeeded"] == 4
    assert {c["type"] for c in last["run"]["conditions"]} >= {"Ready", "Progressing"}
    # a user of another namespace cannot open it
    other = reader_token(cluster, tenancy.b, account="reader-b")
    assert api_server.request(f"{path}/stream", token=other).status == 403
