"""Deferred work acts on its own run (real PostgreSQL, the Kubernetes fake, a fake clock).

A decision about run A can carry what the same transaction decided for run B (a slot A
freed started B). The TTL delete of A's finished Job and A's wake-up are due long after;
when they fire they must reach A, not the run that was handled last (they once captured a
variable the loop over B rebound, and A's TTL deleted B's running Job).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from flowforge.domain.validation import parse_definition
from flowforge.operator.runs import RunContext
from flowforge.store.connection import Pool
from flowforge.store.definitions import publish_definition
from tests.engine.conftest import NAMESPACE, Harness, engine_settings, open_harness
from tests.engine.fake_clock import FakeClock
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

TTL_SECONDS = 300.0


@pytest.fixture
async def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def harness(store: Pool, clock: FakeClock) -> AsyncIterator[Harness]:
    settings = engine_settings(job_ttl_seconds=TTL_SECONDS)
    async with open_harness(store, settings=settings, clock=clock) as opened:
        yield opened


async def start(harness: Harness, workflow: str, name: str) -> RunContext:
    body = harness.stored_run(name, workflow=workflow)
    await harness.engine.start_run(body)
    context = await harness.engine.runs.by_uid(namespace=NAMESPACE, uid=body["metadata"]["uid"])
    assert context is not None
    return context


async def publish(harness: Harness, document: dict[str, Any]) -> None:
    await publish_definition(
        harness.pool,
        namespace=NAMESPACE,
        definition=parse_definition(
            {"version": 1, "taskTypes": {"py": {"image": "python:3.12-slim"}}, **document}
        ),
    )


async def test_a_finished_runs_job_ttl_deletes_its_own_job_not_the_next_runs(
    harness: Harness, clock: FakeClock
) -> None:
    # one run at a time: A's end starts B, in the transaction that records A's outcome
    await publish(
        harness,
        {"workflow": "line", "concurrency": {"maxRuns": 1}, "tasks": [{"key": "a", "type": "py"}]},
    )
    run_a = await start(harness, "line", "run-a")
    run_b = await start(harness, "line", "run-b")
    job_a = harness.job_of("a")
    assert run_a.name in job_a and len(harness.kube.jobs) == 1  # B is queued

    job = harness.kube.finish(job_a, succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    job_b = next(name for (_, name) in harness.kube.jobs if run_b.name in name)
    assert (await harness.run(run_a)).phase == "Succeeded"

    clock.advance(TTL_SECONDS - 1)
    await harness.settle_background()
    assert job_a in [name for _, name in harness.kube.jobs], "deleted before its TTL"
    clock.advance(2)
    await wait_until(lambda: job_a in harness.kube.deleted, what="A's Job deleted after its TTL")
    await harness.settle_background()
    assert harness.kube.deleted == [job_a]
    assert job_b in [name for _, name in harness.kube.jobs], "B's running Job was deleted"

    # B's attempt is still running and ends normally: nothing was recorded as lost
    job = harness.kube.finish(job_b, succeeded=True)
    await harness.engine.on_job_event(job, "MODIFIED")
    assert (await harness.run(run_b)).phase == "Succeeded"
    assert await harness.states(run_b) == {"a": "succeeded"}


async def test_a_wake_up_decided_with_another_runs_start_wakes_its_own_run(
    harness: Harness, clock: FakeClock
) -> None:
    # one running task in the namespace: A's failed attempt (retried after a backoff) frees
    # the slot, which the same transaction gives to B's waiting task
    harness.kube.policies[NAMESPACE] = [
        {"metadata": {"name": "one"}, "spec": {"maxRunningTasks": 1}}
    ]
    await publish(
        harness, {"workflow": "retrying", "tasks": [{"key": "x", "type": "py", "retries": 1}]}
    )
    await publish(harness, {"workflow": "other", "tasks": [{"key": "p", "type": "py"}]})
    run_a = await start(harness, "retrying", "run-a")
    run_b = await start(harness, "other", "run-b")
    assert [name for _, name in harness.kube.jobs] == [harness.job_of("x")]

    dispatched: list[str] = []
    dispatch = harness.engine.dispatch

    async def recording(context: RunContext) -> None:
        dispatched.append(context.name)
        await dispatch(context)

    harness.engine.dispatch = recording  # type: ignore[method-assign]
    job = harness.kube.finish(harness.job_of("x"), succeeded=False)
    await harness.engine.on_job_event(job, "MODIFIED")
    assert harness.job_of("p")  # B took the freed slot
    assert await harness.states(run_a) == {"x": "ready"}

    await asyncio.sleep(0.1)  # the backoff (50 ms) is over in the database's time
    assert clock.advance(1.0) > 0
    await wait_until(lambda: bool(dispatched), what="the woken run dispatched")
    assert dispatched == [run_a.name], f"the wake-up of {run_a.name} went to {dispatched}"
    assert run_b.name not in dispatched
