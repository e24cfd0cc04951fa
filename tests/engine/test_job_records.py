"""The Jobs one decision creates are recorded with one store statement, however wide the
fan-out (``JobLauncher.create_all`` -> ``store/dispatch.py::record_jobs_created``), and a
Pod of a Job created early waits for that record even while its siblings are created."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from flowforge.domain.history import EventKind
from flowforge.domain.states import TaskState
from flowforge.store.queries import recorded_jobs
from tests.engine.conftest import NAMESPACE, Harness, task_of_job

pytestmark = pytest.mark.store

WIDE = 100
FAN_OUT: list[dict[str, Any]] = [
    {"key": "split"},
    *({"key": f"part-{n}", "dependsOn": ["split"]} for n in range(WIDE)),
]


def records_jobs(statement: str) -> bool:
    return "INSERT INTO flowforge_event" in statement and EventKind.TASK_JOB_CREATED in statement


async def test_a_hundred_wide_hand_off_records_its_jobs_with_one_statement(
    harness: Harness, statements: list[str]
) -> None:
    run = await harness.start("wide", FAN_OUT)
    statements.clear()

    await harness.finish("split")

    assert len(harness.kube.active()) == WIDE
    assert len([s for s in statements if records_jobs(s)]) == 1
    # the whole hand-off, outcome to a hundred recorded Jobs, takes a few statements
    assert len(statements) < WIDE // 10, statements
    uids = {
        (task_of_job(job), int(job["metadata"]["labels"]["flowforge.io/attempt"])): job["metadata"][
            "uid"
        ]
        for job in harness.kube.jobs.values()
    }
    assert await recorded_jobs(harness.pool, run.run_id) == uids
    assert set((await harness.states(run)).values()) == {TaskState.SUCCEEDED, TaskState.RUNNING}


async def test_a_pod_of_a_job_created_before_its_siblings_waits_for_their_record(
    harness: Harness,
) -> None:
    """Its uid is expected from its own create response on, not from the record: a Pod that
    succeeds while a sibling's creation is slow is recorded once the record is written."""
    run = await harness.start("early", [{"key": "split"}, *FAN_OUT[1:3]])
    creations, slow, release = 0, asyncio.Event(), asyncio.Event()

    async def hold_the_second(manifest: Mapping[str, Any]) -> None:
        nonlocal creations
        creations += 1
        if creations == 2:
            slow.set()
            await release.wait()

    harness.kube.before_create = hold_the_second
    handing_off = asyncio.create_task(harness.finish("split"))
    await asyncio.wait_for(slow.wait(), timeout=10)
    [first] = harness.kube.active()
    seen = asyncio.create_task(harness.engine.on_pod_event(harness.kube.job_pod(first), "ADDED"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not seen.done()  # waiting for the store to hold the Job

    release.set()
    await asyncio.wait_for(handing_off, timeout=10)
    await asyncio.wait_for(seen, timeout=10)
    states = await harness.states(run)
    assert sorted(states.values()) == [TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.SUCCEEDED]
    assert (NAMESPACE, first) in harness.kube.jobs
