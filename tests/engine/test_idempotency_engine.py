"""spec.idempotencyKey through the engine (real PostgreSQL, the Kubernetes fake): a run
re-created with the key of an earlier one (Argo CD's self-heal) creates no Job; its status
names that run and shows its result, at once or when it arrives."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

KEY = "git-3f9c2a1"


def shown(harness: Harness, name: str) -> dict[str, Any]:
    return dict(harness.kube.runs[(NAMESPACE, name)].get("status") or {})


def keyed(harness: Harness, name: str) -> dict[str, Any]:
    body = harness.stored_run(name, workflow="deploy")
    body["spec"]["idempotencyKey"] = KEY
    return body


async def test_a_recreated_run_creates_no_job_and_shows_the_result_it_waited_for(
    harness: Harness,
) -> None:
    original = await harness.unstarted("deploy", [{"key": "only"}])
    original["spec"]["idempotencyKey"] = KEY
    await harness.engine.start_run(original)
    assert len(harness.kube.created) == 1

    # re-created while the first still runs: queued for its result, no Job
    waiting = keyed(harness, "deploy-again")
    await harness.engine.start_run(waiting)
    await wait_until(
        lambda: shown(harness, "deploy-again").get("phase") == "Queued",
        what="the duplicate shows it waits",
    )
    status = shown(harness, "deploy-again")
    assert status["queue"]["reason"] == "IdempotencyKey"
    assert status["duplicateOf"]["name"] == "deploy"
    assert len(harness.kube.created) == 1

    job = harness.kube.finish(harness.kube.created[0], succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    await wait_until(
        lambda: shown(harness, "deploy-again").get("phase") == "Succeeded",
        what="the duplicate shows the original's result",
    )
    status = shown(harness, "deploy-again")
    assert status["duplicateOf"] == {
        "name": "deploy",
        "uid": original["metadata"]["uid"],
        "phase": "Succeeded",
    }
    conditions = {condition["type"]: condition for condition in status["conditions"]}
    assert conditions["Duplicate"]["status"] == "True"
    assert conditions["Duplicate"]["reason"] == "IdempotencyKey"
    assert conditions["Completed"]["status"] == "True"
    assert "did not execute" in status["message"]

    # and once more, after the original finished: Succeeded at once, still no Job
    await harness.engine.start_run(keyed(harness, "deploy-third"))
    await wait_until(
        lambda: shown(harness, "deploy-third").get("phase") == "Succeeded",
        what="a duplicate of a finished run shows its result",
    )
    assert len(harness.kube.created) == 1
