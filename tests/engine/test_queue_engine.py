"""The queue through the engine (real PostgreSQL, the Kubernetes fake): a freed slot starts
the next run in the handling of the outcome that freed it, the places of the runs still
waiting are re-projected soon after (folded, not one patch per hand-off), and the
reconciler's pass over an unchanged queue patches nothing."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from flowforge.domain.validation import parse_definition
from flowforge.operator import status
from flowforge.operator.runs import RunRefusedError
from flowforge.store.definitions import publish_definition
from flowforge.store.queries import find_run_id_by_uid
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store


async def start_queued(harness: Harness, count: int) -> list[str]:
    document = {
        "workflow": "line",
        "version": 1,
        "concurrency": {"maxRuns": 1},
        "taskTypes": {"py": {"image": "python:3.12-slim"}},
        "tasks": [{"key": "only", "type": "py"}],
    }
    await publish_definition(
        harness.pool, namespace=NAMESPACE, definition=parse_definition(document)
    )
    names = [f"line-{i}" for i in range(count)]
    for name in names:
        body: dict[str, Any] = {
            "apiVersion": "flowforge.io/v1alpha1",
            "kind": "WorkflowRun",
            "metadata": {"namespace": NAMESPACE, "name": name, "uid": str(uuid.uuid4())},
            "spec": {"workflow": "line", "version": 1},
        }
        harness.kube.runs[(NAMESPACE, name)] = body
        await harness.engine.start_run(body)
    return names


def position(harness: Harness, name: str) -> int | None:
    shown = harness.kube.runs[(NAMESPACE, name)].get("status") or {}
    return (shown.get("queue") or {}).get("position")


async def test_a_hand_off_starts_the_next_run_and_the_places_follow_soon(
    harness: Harness,
) -> None:
    names = await start_queued(harness, 4)
    await wait_until(lambda: position(harness, names[3]) == 3, what="the last run's place")
    assert len(harness.kube.created) == 1

    job = harness.kube.finish(harness.kube.created[0], succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    # the next run's Job is created by the handling of the outcome that freed the slot
    assert len(harness.kube.created) == 2 and names[1] in harness.kube.created[1]
    # the places behind it move without a reconciler pass, folded for a moment
    moved = time.monotonic()
    await wait_until(
        lambda: (position(harness, names[2]), position(harness, names[3])) == (1, 2),
        what="the places behind to move up",
        timeout=status.QUEUE_MOVES_SECONDS + 5,
    )
    assert time.monotonic() - moved <= status.QUEUE_MOVES_SECONDS + 3

    # a pass over the queue when nothing changed starts nothing and patches no status
    await wait_until(lambda: harness.engine.status.pending() == 0, what="status writes done")
    patched = len(harness.kube.status_patches)
    await harness.reconciler.pass_once()
    await asyncio.sleep(status.COALESCE_SECONDS * 3)
    assert len(harness.kube.created) == 2
    assert harness.kube.status_patches[patched:] == []


async def test_a_forbid_run_admitted_on_a_stale_count_is_refused_and_stays_refused(
    harness: Harness,
) -> None:
    # admission counted no run of the key: the operator had not recorded the first one yet
    # (or the two were created at once); the operator counts again under the namespace's lock
    definition = parse_definition(
        {
            "workflow": "forbid",
            "version": 1,
            "concurrency": {"maxRuns": 1, "policy": "Forbid"},
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            "tasks": [{"key": "only", "type": "py"}],
        }
    )
    await publish_definition(harness.pool, namespace=NAMESPACE, definition=definition)
    first = harness.stored_run("first", workflow="forbid")
    second = harness.stored_run("second", workflow="forbid")
    await harness.engine.start_run(first)
    with pytest.raises(RunRefusedError, match="policy Forbid"):
        await harness.engine.start_run(second)

    shown = second["status"]
    assert shown["phase"] == "Failed"
    assert {c["reason"] for c in shown["conditions"]} == {"ConcurrencyForbidden"}
    assert "RunRefused" in harness.kube.reasons()
    assert [name for name in harness.kube.created if "second" in name] == []
    assert await find_run_id_by_uid(harness.pool, namespace=NAMESPACE, uid=uid(second)) is None

    # the first run finishes: the refused run is seen again (a watch event, a restart) and
    # still never starts
    await harness.finish("only")
    await harness.reconciler.pass_once()
    with pytest.raises(RunRefusedError):
        await harness.engine.start_run(second)
    assert [name for name in harness.kube.created if "second" in name] == []
    assert await find_run_id_by_uid(harness.pool, namespace=NAMESPACE, uid=uid(second)) is None
    assert harness.kube.reasons().count("RunRefused") == 1


def uid(body: dict[str, Any]) -> str:
    return str(body["metadata"]["uid"])
