"""An attempt's log is read from a Pod of the Job FlowForge recorded (by uid), never from a
Pod that only carries the Job's ``job-name`` label or its controller-uid label: a tenant
who may create Pods in the namespace cannot put its own text in another task's log.

The apiserver is a small aiohttp application on 127.0.0.1 that answers the Pod list as the
real one would (the label selector applied) and each Pod's log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from flowforge.domain.observed_pod import CONTROLLER_UID_LABEL
from flowforge.kube.user_api import UserApi

NAMESPACE = "team-a"
JOB = "etl-run-ab12-extract-1"
RECORDED_UID = "11111111-1111-1111-1111-111111111111"


def pod(
    name: str,
    *,
    created: str,
    labels: dict[str, str],
    owner_uid: str | None,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    owners = (
        []
        if owner_uid is None
        else [
            {"apiVersion": "batch/v1", "kind": "Job", "name": JOB, "uid": owner_uid,
             "controller": True}
        ]
    )  # fmt: skip
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            "labels": labels,
            "ownerReferences": owners,
        }
    }


GENUINE = pod(
    "genuine",
    created="2026-12-01T10:00:00Z",
    labels={"job-name": JOB, CONTROLLER_UID_LABEL: RECORDED_UID},
    owner_uid=RECORDED_UID,
)
# newer than the genuine Pod, so "the newest Pod with the label" would pick each of them
FORGERIES = [
    # the job-name label alone (what the log endpoint used to select by)
    pod("by-name", created="2026-12-01T11:00:00Z", labels={"job-name": JOB}, owner_uid=None),
    # the recorded uid as a label, with no ownerReference
    pod(
        "by-label",
        created="2026-12-01T11:01:00Z",
        labels={"job-name": JOB, CONTROLLER_UID_LABEL: RECORDED_UID},
        owner_uid=None,
    ),
    # controlled by a Job squatting the name (another uid), labelled with the recorded uid
    pod(
        "by-squatter",
        created="2026-12-01T11:02:00Z",
        labels={"job-name": JOB, CONTROLLER_UID_LABEL: RECORDED_UID},
        owner_uid="22222222-2222-2222-2222-222222222222",
    ),
]


def selected(pods: list[dict[str, Any]], selector: str) -> list[dict[str, Any]]:
    wanted = dict(term.split("=", 1) for term in selector.split(","))
    return [p for p in pods if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    pods: list[dict[str, Any]] = []

    async def list_pods(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == "Bearer user-token"
        return web.json_response({"items": selected(pods, request.query.get("labelSelector", ""))})

    async def log(request: web.Request) -> web.Response:
        return web.Response(text=f"log of {request.match_info['name']}\n")

    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NAMESPACE}/pods", list_pods)
    app.router.add_get(f"/api/v1/namespaces/{NAMESPACE}/pods/{{name}}/log", log)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", pods
    finally:
        await runner.cleanup()


async def read_log(host: str, job_uid: str = RECORDED_UID) -> tuple[str, bool] | None:
    api = UserApi(host=host, ca_file=None, verify=False)
    try:
        return await api.job_log(
            token="user-token",
            namespace=NAMESPACE,
            job_uid=job_uid,
            container="task",
            max_bytes=1024,
        )
    finally:
        await api.close()


async def test_the_log_is_the_recorded_jobs_pods_whatever_else_claims_the_job(
    apiserver: tuple[str, list[dict[str, Any]]],
) -> None:
    host, pods = apiserver
    pods.extend([GENUINE, *FORGERIES])

    assert await read_log(host) == ("log of genuine\n", False)


async def test_only_forgeries_are_no_log(apiserver: tuple[str, list[dict[str, Any]]]) -> None:
    host, pods = apiserver
    pods.extend(FORGERIES)
    # a Pod in another namespace that names the recorded Job cannot be listed here either
    pods.append({**GENUINE, "metadata": {**GENUINE["metadata"], "namespace": "team-b"}})

    assert await read_log(host) is None
