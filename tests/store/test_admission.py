"""Kueue's admission of an attempt's Job, in the store: admitted, evicted back to admitting,
never a failed attempt; a new attempt waits for its own admission; replays change nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from flowforge.cli.run_report import load_report, report_text
from flowforge.domain.decision import Decision, JobRef
from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.dispatch import dispatch_due
from flowforge.store.kueue_admission import record_admission
from flowforge.store.lease import Fence
from flowforge.store.queries import forward_counts, list_tasks, run_progress
from flowforge.store.reuse import find_run_by_name
from flowforge.store.runs import RunRecord, create_run
from tests.store.conftest import AN_HOUR, NAMESPACE, failure, kinds, record

pytestmark = pytest.mark.store

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def queued_run(pool: Pool, fence: Fence) -> RunRecord:
    spec = parse_definition(
        {
            "workflow": "kq",
            "version": 1,
            "taskTypes": {
                "queued": {"image": "python:3.12-slim", "queueName": "team-a"},
                "plain": {"image": "python:3.12-slim"},
            },
            "tasks": [
                {"key": "train", "type": "queued", "retries": 1},
                {"key": "report", "type": "plain"},
            ],
        }
    )
    await publish_definition(pool, namespace=NAMESPACE, definition=spec)
    stored = await load_definition(pool, namespace=NAMESPACE, workflow="kq", version=1)
    created = await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name="kq-run",
        uid=str(uuid.uuid4()),
        definition=stored,
    )
    await dispatch_due(pool, fence=fence, run_id=created.run.id)
    return created.run


async def admit(
    pool: Pool, fence: Fence, run: RunRecord, *, admitted: bool, attempt: int = 1
) -> Decision:
    return await record_admission(
        pool,
        fence=fence,
        run_id=run.id,
        job=JobRef("train", attempt),
        job_name=f"kq-run-train-{attempt}",
        admitted=admitted,
        at=AT,
    )


async def shown(pool: Pool, run: RunRecord) -> dict[str, str]:
    return {row.task_key: row.shown_state for row in await list_tasks(pool, run.id)}


async def test_a_queued_task_is_admitting_until_kueue_admits_its_job(
    store: Pool, fence: Fence
) -> None:
    run = await queued_run(store, fence)
    assert await shown(store, run) == {"train": "admitting", "report": "running"}
    counts = await forward_counts(store, run.id)
    assert (counts.running, counts.admitting, counts.unresolved) == (1, 1, 2)
    assert (await run_progress(store, run.id)).forward.admitting == 1
    # `flowforge runs show` says so too
    named = await find_run_by_name(store, namespace=NAMESPACE, name="kq-run")
    assert named is not None
    report = await load_report(store, named)
    assert report.counts["admitting"] == 1 and report.counts["running"] == 1
    assert {task["key"]: task["state"] for task in report.to_dict()["tasks"]} == {
        "train": "admitting",
        "report": "running",
    }
    assert "admitting" in report_text(report).split()
    # a suspended Job seen again before any admission changes nothing
    assert not (await admit(store, fence, run, admitted=False)).recorded

    admitted = await admit(store, fence, run, admitted=True)
    assert admitted.recorded and admitted.notices[0].reason == "TaskAdmitted"
    assert not (await admit(store, fence, run, admitted=True)).recorded  # a replay
    assert await shown(store, run) == {"train": "running", "report": "running"}
    assert (await forward_counts(store, run.id)).admitting == 0


async def test_an_eviction_puts_the_attempt_back_to_admitting_without_failing_it(
    store: Pool, fence: Fence
) -> None:
    run = await queued_run(store, fence)
    await admit(store, fence, run, admitted=True)
    evicted = await admit(store, fence, run, admitted=False)
    assert evicted.recorded and evicted.notices[0].reason == "TaskEvicted"
    rows = {row.task_key: row for row in await list_tasks(store, run.id)}
    assert rows["train"].shown_state == "admitting" and rows["train"].state == "running"
    assert rows["train"].attempt == 1 and rows["train"].last_error is None
    assert (await admit(store, fence, run, admitted=True)).recorded  # readmitted
    history = await kinds(store, run.id)
    assert history.count("task.admitted") == 2 and "task.evicted" in history
    assert "task.attempt_failed" not in history


async def test_a_new_attempt_waits_for_its_own_admission(store: Pool, fence: Fence) -> None:
    run = await queued_run(store, fence)
    await admit(store, fence, run, admitted=True)
    await record(store, fence, run, "train", failure(), backoff=AN_HOUR)
    assert (await shown(store, run))["train"] == "ready"
    await store_due_now(store, run)
    await dispatch_due(store, fence=fence, run_id=run.id)
    rows = {row.task_key: row for row in await list_tasks(store, run.id)}
    assert rows["train"].attempt == 2 and rows["train"].shown_state == "admitting"
    # the first attempt's admission cannot be replayed onto the second
    assert not (await admit(store, fence, run, admitted=True, attempt=1)).recorded
    assert (await admit(store, fence, run, admitted=True, attempt=2)).recorded


async def test_a_task_that_queues_nowhere_is_never_admitting(store: Pool, fence: Fence) -> None:
    run = await queued_run(store, fence)
    moved = await record_admission(
        store,
        fence=fence,
        run_id=run.id,
        job=JobRef("report", 1),
        job_name="kq-run-report-1",
        admitted=False,
        at=AT,
    )
    assert not moved.recorded
    assert (await shown(store, run))["report"] == "running"


async def store_due_now(pool: Pool, run: RunRecord) -> None:
    async with pool.connection() as connection:
        await connection.execute(
            "UPDATE flowforge_task SET not_before = now() WHERE run_id = %s", (run.id,)
        )
