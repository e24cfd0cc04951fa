"""Reuse for a retried run (``store.reuse`` inside ``runs.create_run(retry_of=...)``): which
tasks of the old run the new one reuses, and how it starts, in the transaction creating it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from flowforge.cli.main import main
from flowforge.domain.decision import Decision
from flowforge.domain.execution import AttemptOutcome
from flowforge.domain.history import EventKind
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.store.cancel import cancel_run
from flowforge.store.connection import Pool
from flowforge.store.definitions import StoredDefinition, load_definition, publish_definition
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import find_run_by_name, list_runs_by_namespace, reusable_tasks
from flowforge.store.runs import RunRecord, create_run, get_run
from tests.store.conftest import NAMESPACE, SUCCESS, definition, failure, finish, roll_back

pytestmark = pytest.mark.store

DIAMOND: list[dict[str, Any]] = [
    {"key": "a"},
    {"key": "b", "dependsOn": ["a"]},
    {"key": "c", "dependsOn": ["a"]},
    {"key": "d", "dependsOn": ["b", "c"]},
]
# provision has no compensator, deploy has one; report ran on top of deploy
SAGA: list[dict[str, Any]] = [
    {"key": "provision"},
    {"key": "deploy", "dependsOn": ["provision"]},
    {"key": "report", "dependsOn": ["deploy"]},
    {"key": "verify", "dependsOn": ["report"]},
    {"key": "undeploy", "compensateFor": "deploy"},
]
HALT: list[dict[str, Any]] = [
    {"key": "one"},
    {"key": "two", "dependsOn": ["one"]},
    {"key": "three", "dependsOn": ["two"]},
    {"key": "undo-one", "compensateFor": "one"},
    {"key": "undo-two", "compensateFor": "two"},
]


async def _publish(
    store: Pool, tasks: Sequence[Mapping[str, Any]], *, workflow: str, version: int = 1
) -> StoredDefinition:
    await publish_definition(
        store, namespace=NAMESPACE, definition=definition(tasks, workflow=workflow, version=version)
    )
    return await load_definition(store, namespace=NAMESPACE, workflow=workflow, version=version)


async def _create(
    store: Pool,
    fence: Fence,
    stored: StoredDefinition,
    name: str,
    *,
    retry_of: str | None = None,
    uid: str | None = None,
    namespace_uid: str | None = None,
) -> RunRecord:
    created = await create_run(
        store,
        fence=fence,
        namespace=NAMESPACE,
        name=name,
        uid=uid or str(uuid.uuid4()),
        definition=stored,
        parameters={"date": "2026-11-30"},
        retry_of=retry_of,
        namespace_uid=namespace_uid,
    )
    return created.run


async def _finish(store: Pool, fence: Fence, run: RunRecord, key: str, *, ok: bool) -> Decision:
    outcome: AttemptOutcome = SUCCESS if ok else failure("exit code 3")
    return await finish(store, fence, run, key, outcome)


async def _until_three_fails(
    store: Pool, fence: Fence, workflow: str
) -> tuple[RunRecord, Decision]:
    """A run of HALT named ``<workflow>-1`` where one and two succeeded and three failed."""
    stored = await _publish(store, HALT, workflow=workflow)
    old = await _create(store, fence, stored, f"{workflow}-1")
    await _finish(store, fence, old, "one", ok=True)
    await _finish(store, fence, old, "two", ok=True)
    return old, await _finish(store, fence, old, "three", ok=False)


async def _states(store: Pool, run_id: int) -> dict[str, tuple[str, int]]:
    return {
        task.task_key: (task.state, task.pending_dependencies)
        for task in await list_tasks(store, run_id)
    }


async def test_diamond_retry_reuses_what_succeeded_and_waits_only_for_the_rest(
    store: Pool, fence: Fence
) -> None:
    stored = await _publish(store, DIAMOND, workflow="diamond")
    old = await _create(store, fence, stored, "diamond-1")
    await _finish(store, fence, old, "a", ok=True)
    await _finish(store, fence, old, "b", ok=True)
    await _finish(store, fence, old, "c", ok=False)
    assert (await get_run(store, old.id)).phase is RunPhase.FAILED
    assert await reusable_tasks(store, namespace=NAMESPACE, run_name="diamond-1") == {"a", "b"}

    new = await _create(store, fence, stored, "diamond-1-retry-1", retry_of="diamond-1")

    assert await _states(store, new.id) == {
        "a": (TaskState.SUCCEEDED, 0),
        "b": (TaskState.SUCCEEDED, 0),
        "c": (TaskState.READY, 0),
        "d": (TaskState.WAITING, 1),
    }
    history = await run_history(store, new.id)
    assert [(e.kind, e.task_key) for e in history] == [
        (EventKind.RUN_RETRY_OF, None),
        (EventKind.RUN_CREATED, None),
        (EventKind.TASK_REUSED, "a"),
        (EventKind.TASK_REUSED, "b"),
    ]
    assert dict(history[0].detail) == {
        "retryOf": "diamond-1",
        "reused": ["a", "b"],
        "requestedBy": None,
    }
    assert [dict(e.detail) for e in history[2:]] == [{"retryOf": "diamond-1"}] * 2

    released = await _finish(store, fence, new, "c", ok=True)
    assert [d.task_key for d in released.create_jobs] == ["d"]
    done = await _finish(store, fence, new, "d", ok=True)
    assert done.phase is RunPhase.SUCCEEDED


async def test_compensated_work_and_what_ran_on_top_of_it_run_again(
    store: Pool, fence: Fence
) -> None:
    stored = await _publish(store, SAGA, workflow="saga")
    old = await _create(store, fence, stored, "saga-1")
    for key in ("provision", "deploy", "report"):
        await _finish(store, fence, old, key, ok=True)
    failed = await _finish(store, fence, old, "verify", ok=False)
    assert await roll_back(store, fence, old, failed) == ["undeploy"]
    assert (await get_run(store, old.id)).phase is RunPhase.FAILED
    assert (await _states(store, old.id))["undeploy"][0] == CompensationState.SUCCEEDED

    assert await reusable_tasks(store, namespace=NAMESPACE, run_name="saga-1") == {"provision"}
    new = await _create(store, fence, stored, "saga-1-retry-1", retry_of="saga-1")
    states = await _states(store, new.id)
    assert states["provision"] == (TaskState.SUCCEEDED, 0)
    assert states["deploy"] == (TaskState.READY, 0)
    assert states["report"] == (TaskState.WAITING, 1)
    assert states["undeploy"] == (CompensationState.NOT_TRIGGERED, 0)


async def test_a_halted_rollback_leaves_the_untouched_work_reusable(
    store: Pool, fence: Fence
) -> None:
    old, failed = await _until_three_fails(store, fence, "halt")
    # undo-two runs first and fails for good: undo-one is skipped, "one" still stands
    assert await roll_back(store, fence, old, failed, failing="undo-two") == ["undo-two"]
    states = await _states(store, old.id)
    assert (states["undo-two"][0], states["undo-one"][0]) == (
        CompensationState.FAILED,
        CompensationState.SKIPPED,
    )
    assert await reusable_tasks(store, namespace=NAMESPACE, run_name="halt-1") == {"one"}


async def test_work_whose_undo_was_cut_short_by_a_deletion_is_not_reused(
    store: Pool, fence: Fence
) -> None:
    """The object was deleted while undo-two ran: its Job was removed half-way, so "two"
    may be half undone; it (and what ran on it) runs again, "one" was never touched."""
    old, failed = await _until_three_fails(store, fence, "cut")
    assert [d.task_key for d in failed.create_jobs] == ["undo-two"]

    await cancel_run(store, fence=fence, run_id=old.id, reason="deleted", rollback=False)

    states = await _states(store, old.id)
    assert (states["undo-two"][0], states["undo-one"][0]) == (
        CompensationState.SKIPPED,
        CompensationState.SKIPPED,
    )
    assert await reusable_tasks(store, namespace=NAMESPACE, run_name="cut-1") == {"one"}


async def test_retrying_a_run_whose_every_task_is_reused_finishes_at_creation(
    store: Pool, fence: Fence
) -> None:
    stored = await _publish(store, DIAMOND, workflow="done")
    old = await _create(store, fence, stored, "done-1")
    for key in ("a", "b", "c", "d"):
        await _finish(store, fence, old, key, ok=True)

    new = await _create(store, fence, stored, "done-1-retry-1", retry_of="done-1")

    run = await get_run(store, new.id)
    assert (run.phase, run.finished_at is not None) == (RunPhase.SUCCEEDED, True)
    assert new.phase is RunPhase.SUCCEEDED  # create_run returns the finished run
    assert (await run_history(store, new.id))[-1].kind == EventKind.RUN_SUCCEEDED


async def test_nothing_is_reused_across_definition_versions_or_without_a_source(
    store: Pool, fence: Fence
) -> None:
    v1 = await _publish(store, DIAMOND, workflow="versions")
    v2 = await _publish(store, DIAMOND, workflow="versions", version=2)
    old = await _create(store, fence, v1, "versions-1")
    await _finish(store, fence, old, "a", ok=True)
    await _finish(store, fence, old, "b", ok=False)
    await _finish(store, fence, old, "c", ok=True)

    other_version = await _create(store, fence, v2, "versions-1-retry-1", retry_of="versions-1")
    assert (await _states(store, other_version.id))["a"] == (TaskState.READY, 0)
    history = await run_history(store, other_version.id)
    assert [e.kind for e in history] == [EventKind.RUN_RETRY_OF, EventKind.RUN_CREATED]
    assert history[0].detail["reused"] == []

    unknown = await _create(store, fence, v1, "versions-x", retry_of="no-such-run")
    assert (await _states(store, unknown.id))["a"] == (TaskState.READY, 0)
    assert [e.kind for e in await run_history(store, unknown.id)] == [EventKind.RUN_CREATED]
    assert await reusable_tasks(store, namespace=NAMESPACE, run_name="no-such-run") == set()


async def test_nothing_is_reused_from_a_run_of_an_earlier_namespace_of_the_same_name(
    store: Pool, fence: Fence
) -> None:
    """Migration 15: the namespace was deleted and re-created (another uid); a retry naming
    a run of the old one (same definition content, same parameters) reuses none of its work,
    while a retry within one namespace, or of a run from before uids, still does."""
    stored = await _publish(store, DIAMOND, workflow="moved")

    async def failed_run(name: str, namespace_uid: str | None) -> None:
        old = await _create(store, fence, stored, name, namespace_uid=namespace_uid)
        await _finish(store, fence, old, "a", ok=True)
        await _finish(store, fence, old, "b", ok=False)

    await failed_run("old-owner", "uid-old")
    await failed_run("legacy", None)
    await failed_run("same-owner", "uid-new")
    reused = {}
    for source in ("old-owner", "legacy", "same-owner"):
        retry = await _create(
            store, fence, stored, f"{source}-retry", retry_of=source, namespace_uid="uid-new"
        )
        reused[source] = (await _states(store, retry.id))["a"][0]

    assert reused == {
        "old-owner": TaskState.READY,
        "legacy": TaskState.SUCCEEDED,
        "same-owner": TaskState.SUCCEEDED,
    }


async def test_creating_the_retry_again_changes_nothing(store: Pool, fence: Fence) -> None:
    stored = await _publish(store, DIAMOND, workflow="again")
    old = await _create(store, fence, stored, "again-1")
    await _finish(store, fence, old, "a", ok=True)
    await _finish(store, fence, old, "b", ok=False)
    await _finish(store, fence, old, "c", ok=True)
    uid = str(uuid.uuid4())
    first = await _create(store, fence, stored, "again-2", retry_of="again-1", uid=uid)
    await _finish(store, fence, first, "b", ok=True)

    second = await _create(store, fence, stored, "again-2", retry_of="again-1", uid=uid)

    assert second.id == first.id
    assert (await _states(store, first.id))["b"] == (TaskState.SUCCEEDED, 0)
    reused = [e for e in await run_history(store, first.id) if e.kind == EventKind.TASK_REUSED]
    assert sorted(event.task_key or "" for event in reused) == ["a", "c"]


async def test_runs_are_found_by_name_newest_first(store: Pool, fence: Fence) -> None:
    stored = await _publish(store, DIAMOND, workflow="names")
    first = await _create(store, fence, stored, "same-name")
    second = await _create(store, fence, stored, "same-name")  # the object was recreated
    other = await _create(store, fence, stored, "other-name")
    found = await find_run_by_name(store, namespace=NAMESPACE, name="same-name")
    assert found is not None and found.id == second.id != first.id
    assert (found.workflow, found.version, found.phase) == ("names", 1, RunPhase.RUNNING)
    assert await find_run_by_name(store, namespace=NAMESPACE, name="missing") is None
    listed = await list_runs_by_namespace(store, namespace=NAMESPACE)
    assert [run.id for run in listed] == [other.id, second.id, first.id]
    assert await list_runs_by_namespace(store, namespace="elsewhere") == []


async def test_runs_show_lists_attempts_and_the_rollback_in_the_order_it_ran(
    store: Pool, store_dsn: str, fence: Fence, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks: list[dict[str, Any]] = [*HALT, {"key": "undo-three", "compensateFor": "three"}]
    stored = await _publish(store, tasks, workflow="show")
    run = await _create(store, fence, stored, "show-1")
    await _finish(store, fence, run, "one", ok=True)
    await _finish(store, fence, run, "two", ok=True)
    failed = await _finish(store, fence, run, "three", ok=False)
    await roll_back(store, fence, run, failed)

    capsys.readouterr()
    argv = ["runs", "show", "show-1", "--dsn", store_dsn, "-n", NAMESPACE, "-o", "json"]
    assert await asyncio.to_thread(main, argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["phase"] == RunPhase.FAILED and shown["progress"] == "2/3"
    assert [
        (step["key"], step["compensates"], step["state"]) for step in shown["compensation"]
    ] == [
        ("undo-two", "two", CompensationState.SUCCEEDED),
        ("undo-one", "one", CompensationState.SUCCEEDED),
    ]
    three = next(task for task in shown["tasks"] if task["key"] == "three")
    assert three["state"] == TaskState.FAILED and three["message"] == "exit code 3"
    assert [attempt["outcome"] for attempt in three["attempts"]] == ["failed"]

    assert await asyncio.to_thread(main, argv[:-2]) == 0
    text = capsys.readouterr().out
    steps = text.split("Compensation (in the order it runs, last task first):\n")[1]
    assert [line.split()[:4] for line in steps.splitlines()[1:]] == [
        ["1", "undo-two", "two", CompensationState.SUCCEEDED],
        ["2", "undo-one", "one", CompensationState.SUCCEEDED],
    ]
