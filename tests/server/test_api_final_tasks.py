"""A run's ``finally`` tasks through the read API on the real control plane: while they run
the detail says so with the outcome they were told (the run still Running), afterwards it
keeps that outcome with each step's state and attempts; they stay out of the DAG's tasks, the
graph and the stream's states, and a finally attempt's log is found by its own Job."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from flowforge.domain.execution import job_name
from flowforge.domain.states import TaskRole
from flowforge.domain.validation import parse_definition
from flowforge.store.definitions import publish_definition
from tests.plugins.api_server import (
    FAIL,
    QUICK,
    ApiServer,
    Tenancy,
    create_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster

RUN = "closing-a"
CLOSING: dict[str, Any] = {
    "workflow": "closing",
    "version": 1,
    "taskTypes": {"quick": QUICK, "fail": FAIL},
    "tasks": [
        {"key": "build", "type": "quick"},
        {"key": "deploy", "type": "fail", "dependsOn": ["build"]},
        {"key": "unbuild", "type": "quick", "compensateFor": "build"},
    ],
    "finally": [
        {"key": "notify", "type": "fail"},
        {"key": "release-lock", "type": "quick"},
    ],
}


@pytest.fixture(scope="module")
async def seen(
    tenancy: Tenancy, engine: object, api_server: ApiServer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's detail once while its finally tasks ran, and once it was final."""
    await publish_definition(
        tenancy.pool, namespace=tenancy.a, definition=parse_definition(CLOSING)
    )
    created = create_run(tenancy.api, tenancy.a, RUN, "closing")
    path = f"/api/v1/namespaces/{tenancy.a}/runs/{RUN}"
    deadline = time.monotonic() + 90
    detail: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = api_server.request(path, token=tenancy.reader_token)
        detail = answer.json() if answer.status == 200 else {}
        if (detail.get("finally") or {}).get("finalizing"):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"the detail never showed the finally tasks running: {detail}")
    await wait_phase(tenancy.api, tenancy.a, RUN, {"Failed"}, timeout=90)
    final = api_server.request(path, token=tenancy.reader_token).json()
    return detail, {**final, "uid": created["metadata"]["uid"]}


def test_while_they_run_the_run_is_running_with_the_outcome_decided(
    seen: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    during, _ = seen
    assert during["phase"] == "Running"
    final = during["finally"]
    assert (final["outcome"], final["rollback"]) == ("Failed", "Completed")
    assert [step["name"] for step in final["steps"]] == ["notify", "release-lock"]
    assert final["steps"][1]["state"] in {"waiting", "ready", "running"}


def test_afterwards_each_step_shows_its_state_attempts_and_the_outcome_stays(
    seen: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, done = seen
    final = done["finally"]
    assert (final["outcome"], final["rollback"], final["finalizing"]) == (
        "Failed",
        "Completed",
        False,
    )
    notify, release = final["steps"]
    assert (notify["name"], notify["type"], notify["state"]) == ("notify", "fail", "failed")
    assert (notify["attempts"], notify["exitCode"]) == (1, 3)
    (attempt,) = notify["attemptHistory"]
    assert attempt["state"] == "failed" and attempt["exitCode"] == 3 and attempt["jobName"]
    assert attempt["startedAt"] and attempt["finishedAt"]
    assert (release["state"], release["attempts"], release["exitCode"]) == ("succeeded", 1, 0)
    assert release["durationSeconds"] is not None
    # not tasks of the DAG
    assert [task["name"] for task in done["tasks"]] == ["build", "deploy"]
    assert [step["compensator"] for step in done["compensation"]["steps"]] == ["unbuild"]


def test_the_graph_the_stream_and_the_task_endpoint_leave_them_out(
    api_server: ApiServer, tenancy: Tenancy, seen: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    token, path = tenancy.reader_token, f"/api/v1/namespaces/{tenancy.a}/runs/{RUN}"
    graph = api_server.request(f"{path}/graph", token=token).json()
    assert {node["id"] for node in graph["nodes"]} == {"build", "deploy"}
    # a final run's stream is its snapshot, then the end
    stream = api_server.request(f"{path}/stream", token=token).body.decode()
    assert stream.startswith("event: snapshot\n"), stream
    assert '"notify"' not in stream and '"release-lock"' not in stream
    assert '"unbuild"' in stream
    assert api_server.request(f"{path}/tasks/notify", token=token).status == 404


def test_a_finally_attempt_s_log_is_looked_up_by_its_own_job(
    api_server: ApiServer, tenancy: Tenancy, seen: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    _, done = seen
    token, path = tenancy.reader_token, f"/api/v1/namespaces/{tenancy.a}/runs/{RUN}"
    (attempt,) = done["finally"]["steps"][0]["attemptHistory"]
    job = job_name(
        run_name=RUN, run_uid=done["uid"], task_key="notify", attempt=1, role=TaskRole.FINALLY
    )
    assert attempt["jobName"] == job
    log = api_server.request(f"{path}/tasks/notify/attempts/1/log", token=token)
    # the Job recorded for it was found and its Pod asked (a simulated node serves no log)
    answer = log.body.decode()
    assert log.status == 200 or (job in answer and "was recorded" not in answer), answer
    missing = api_server.request(f"{path}/tasks/notify/attempts/2/log", token=token)
    assert missing.status == 404 and "no Job of attempt 2" in missing.json()["error"]["message"]
