"""A run with a ``forEach`` (``domain/for_each.py``): ``create_run`` writes one row per item
(``task[itemKey]``, its item and group recorded) in its one transaction, each item with its
own attempts; dependents wait for every item; ``flowforge plan -p`` prints the same run."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from flowforge.cli.run_report import load_report, report_text
from flowforge.domain.for_each import NO_ITEMS
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.planning import plan
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.domain.validation import parse_definition
from flowforge.server import views
from flowforge.store import browse
from flowforge.store.browse import creation_skips
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.items import run_items, task_item
from flowforge.store.lease import Fence
from flowforge.store.queries import list_tasks
from flowforge.store.retention import prune
from flowforge.store.reuse import NamedRun, find_run_by_name
from flowforge.store.runs import RunRecord, create_run, get_run
from tests.store.conftest import NAMESPACE, failure, finish, roll_back, states, stored_edges

pytestmark = pytest.mark.store

PARAMETERS: list[dict[str, Any]] = [
    {"name": "regions", "type": "array", "items": {"type": "string"}, "default": ["eu", "us"]},
]
# migrate -> deploy (per region) -> verify; undo-deploy compensates deploy
TASKS: list[dict[str, Any]] = [
    {"key": "migrate"},
    {
        "key": "deploy",
        "dependsOn": ["migrate"],
        "retries": 1,
        "forEach": {"items": "params.regions"},
    },
    {"key": "verify", "dependsOn": ["deploy"]},
    {"key": "undo-deploy", "compensateFor": "deploy"},
]


def fanned(**for_each: Any) -> DefinitionSpec:
    tasks = [dict(task) for task in TASKS]
    tasks[1]["forEach"] = {**tasks[1]["forEach"], **for_each}
    return parse_definition(
        {
            "workflow": "fanned",
            "version": 1,
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            "parameters": PARAMETERS,
            "tasks": [{"type": "py", **task} for task in tasks],
        }
    )


async def create(
    pool: Pool,
    fence: Fence,
    parameters: dict[str, Any],
    *,
    retry_of: str | None = None,
    definition: DefinitionSpec | None = None,
) -> RunRecord:
    await publish_definition(pool, namespace=NAMESPACE, definition=definition or fanned())
    stored = await load_definition(pool, namespace=NAMESPACE, workflow="fanned", version=1)
    created = await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name=f"fanned-{uuid.uuid4().hex[:8]}",
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters=parameters,
        retry_of=retry_of,
    )
    return created.run


async def test_each_item_is_a_row_with_its_item_and_the_dependents_wait_for_all(
    store: Pool, fence: Fence
) -> None:
    run = await create(store, fence, {"regions": ["eu", "us", "Asia Pacific"]})
    tasks = {task.task_key: task for task in await list_tasks(store, run.id)}
    hashed = next(key for key in tasks if key.startswith("deploy[h-"))
    assert {key: task.state for key, task in tasks.items()} == {
        "migrate": TaskState.READY,
        "deploy[eu]": TaskState.WAITING,
        "deploy[us]": TaskState.WAITING,
        hashed: TaskState.WAITING,
        "verify": TaskState.WAITING,
        "undo-deploy[eu]": CompensationState.NOT_TRIGGERED,
        "undo-deploy[us]": CompensationState.NOT_TRIGGERED,
        "undo-" + hashed: CompensationState.NOT_TRIGGERED,
    }
    assert tasks["verify"].pending_dependencies == 3
    assert tasks["deploy[us]"].max_attempts == 2
    assert await task_item(store, run_id=run.id, task_key="deploy[us]") == ("deploy", "us", '"us"')
    assert await task_item(store, run_id=run.id, task_key="undo-deploy[us]") == (
        "deploy",
        "us",
        '"us"',
    )
    assert await task_item(store, run_id=run.id, task_key="migrate") is None
    assert await run_items(store, run.id) == {
        "deploy": {"eu": "eu", "us": "us", hashed.removeprefix("deploy[")[:-1]: "Asia Pacific"}
    }


async def test_every_item_has_its_own_attempts_and_the_dependent_runs_after_all(
    store: Pool, fence: Fence
) -> None:
    run = await create(store, fence, {})
    await finish(store, fence, run, "migrate")
    await finish(store, fence, run, "deploy[eu]")
    assert (await states(store, run.id))["verify"] == TaskState.WAITING
    await finish(store, fence, run, "deploy[us]", failure())  # retried: retries 1
    tasks = {task.task_key: task for task in await list_tasks(store, run.id)}
    assert tasks["deploy[us]"].attempt == 2 and tasks["deploy[eu]"].attempt == 1
    await finish(store, fence, run, "deploy[us]")
    assert (await states(store, run.id))["verify"] in (TaskState.READY, TaskState.RUNNING)
    await finish(store, fence, run, "verify")
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED


async def test_an_empty_list_runs_nothing(store: Pool, fence: Fence) -> None:
    run = await create(store, fence, {"regions": []})
    tasks = {task.task_key: task for task in await list_tasks(store, run.id)}
    assert tasks["deploy"].state == TaskState.SKIPPED
    assert str(tasks["deploy"].last_error).startswith("NoItems")
    async with store.connection() as connection:  # what the read API's graph says why
        assert await creation_skips(connection, run.id) == {"deploy": NO_ITEMS}
    assert "undo-deploy" not in tasks
    assert tasks["verify"].pending_dependencies == 1
    await finish(store, fence, run, "migrate")
    await finish(store, fence, run, "verify")
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED


async def tolerated_run(store: Pool, fence: Fence) -> NamedRun:
    """A run that succeeded with a PartialFailure: its item ``deploy[us]`` failed within
    ``tolerateFailures``."""
    run = await create(store, fence, {}, definition=fanned(tolerateFailures=1))
    await finish(store, fence, run, "migrate")
    await finish(store, fence, run, "deploy[eu]")
    await finish(store, fence, run, "deploy[us]", failure())
    await finish(store, fence, run, "deploy[us]", failure())  # retries: 1, then tolerated
    await finish(store, fence, run, "verify")
    named = await find_run_by_name(store, namespace=NAMESPACE, name=run.name)
    assert named is not None and named.phase is RunPhase.SUCCEEDED
    return named


# its counts, as every reader shows them: the item that failed within tolerateFailures is
# no failure of the run (as in its status)
TOLERATED_COUNTS = {"total": 4, "succeeded": 3, "tolerated": 1}


def shown(counts: Mapping[str, int]) -> dict[str, int]:
    return {state: n for state, n in counts.items() if n}


async def test_describe_counts_a_tolerated_item_apart_from_the_failed(
    store: Pool, fence: Fence
) -> None:
    """`flowforge describe run` of a run that succeeded with a PartialFailure."""
    report = await load_report(store, await tolerated_run(store, fence))
    assert shown(report.counts) == TOLERATED_COUNTS
    assert "Progress:   3/4 succeeded, 1 failed within tolerateFailures\n" in report_text(report)


async def test_the_read_api_counts_a_tolerated_item_apart_and_so_does_a_pruned_run(
    store: Pool, fence: Fence
) -> None:
    """The read API's run list and run (``browse``) count it as the status does, and so do
    they and `flowforge describe` once retention pruned the run (its ``final_counts``)."""
    named = await tolerated_run(store, fence)

    async def read() -> list[dict[str, int]]:
        async with store.connection() as connection:
            listed = await browse.list_runs(connection, namespaces=[NAMESPACE])
            found = await browse.find_run(connection, namespace=NAMESPACE, name=named.name)
        assert found is not None and [row.id for row in listed] == [found.id]
        api = views.progress(found.counts)
        assert (api.failed, api.tolerated) == (0, 1)
        report = await load_report(store, named, with_tasks=False)
        return [shown(listed[0].counts), shown(found.counts), shown(report.counts)]

    assert await read() == [TOLERATED_COUNTS] * 3
    assert (await prune(store, older_than=timedelta(0))).runs == 1
    assert await list_tasks(store, named.id) == []
    assert await read() == [TOLERATED_COUNTS] * 3


@pytest.mark.parametrize("parameters", [{}, {"regions": ["a", "b", "c"]}], ids=repr)
async def test_plan_prints_the_expansion_the_store_wrote(
    store: Pool, fence: Fence, parameters: dict[str, Any]
) -> None:
    run = await create(store, fence, parameters)
    printed = plan(fanned(), parameters)
    edges = await stored_edges(store, run.id)
    forward = [task.task_key for task in await list_tasks(store, run.id) if task.role == "forward"]
    graph = DependencyGraph({key: edges.get(key, set()) for key in forward})
    assert graph.levels() == printed.levels


async def test_a_retry_reuses_the_items_that_succeeded_by_key(store: Pool, fence: Fence) -> None:
    first = await create(store, fence, {"regions": ["eu", "us", "ap"]})
    await finish(store, fence, first, "migrate")
    await finish(store, fence, first, "deploy[eu]")
    await finish(store, fence, first, "deploy[ap]")
    await finish(store, fence, first, "deploy[us]", failure())
    decision = await finish(store, fence, first, "deploy[us]", failure())  # retries: 1
    assert await roll_back(store, fence, first, decision) == ["undo-deploy[ap]", "undo-deploy[eu]"]
    # undone items run again; a second attempt where nothing was undone reuses them by key
    regions = {"regions": ["eu", "us", "ap"]}
    retry = await create(store, fence, regions, retry_of=first.name)
    assert (await states(store, retry.id))["migrate"] == TaskState.SUCCEEDED
    assert (await states(store, retry.id))["deploy[eu]"] == TaskState.READY
    await finish(store, fence, retry, "deploy[eu]")
    await finish(store, fence, retry, "deploy[ap]")
    await finish(store, fence, retry, "deploy[us]", failure())
    await finish(store, fence, retry, "deploy[us]", failure())
    async with store.connection() as connection:  # the undo of eu halts: ap stays undone
        await connection.execute(
            "UPDATE flowforge_task SET state = 'skipped', started_at = NULL WHERE run_id = %s "
            "AND task_key IN ('undo-deploy[eu]', 'undo-deploy[ap]')",
            (retry.id,),
        )
    third = await create(store, fence, regions, retry_of=retry.name)
    assert {key: state for key, state in (await states(store, third.id)).items() if "[" in key} == {
        "deploy[eu]": TaskState.SUCCEEDED,
        "deploy[ap]": TaskState.SUCCEEDED,
        "deploy[us]": TaskState.READY,
        "undo-deploy[eu]": CompensationState.NOT_TRIGGERED,
        "undo-deploy[ap]": CompensationState.NOT_TRIGGERED,
        "undo-deploy[us]": CompensationState.NOT_TRIGGERED,
    }
    assert (await states(store, third.id))["verify"] == TaskState.WAITING


async def test_the_items_of_a_queued_type_wait_for_kueue_and_attempted_undo_is_per_item(
    store: Pool, fence: Fence
) -> None:
    tasks = [dict(task) for task in TASKS]
    tasks[3]["compensateOn"] = "Attempted"
    definition = parse_definition(
        {
            "workflow": "queued",
            "version": 1,
            "taskTypes": {
                "py": {"image": "python:3.12-slim"},
                "q": {"image": "python:3.12-slim", "queueName": "team-queue"},
            },
            "parameters": PARAMETERS,
            "tasks": [{"type": "q" if task["key"] == "deploy" else "py", **task} for task in tasks],
        }
    )
    await publish_definition(store, namespace=NAMESPACE, definition=definition)
    stored = await load_definition(store, namespace=NAMESPACE, workflow="queued", version=1)
    run = (
        await create_run(
            store,
            fence=fence,
            namespace=NAMESPACE,
            name=f"queued-{uuid.uuid4().hex[:8]}",
            uid=str(uuid.uuid4()),
            definition=stored,
        )
    ).run
    async with store.connection() as connection:
        cursor = await connection.execute(
            "SELECT task_key, admission_required, compensate_attempted FROM flowforge_task "
            "WHERE run_id = %s ORDER BY task_key",
            (run.id,),
        )
        flags = {
            str(key): (bool(queued), bool(attempted))
            for key, queued, attempted in await cursor.fetchall()
        }
    assert flags == {
        "deploy[eu]": (True, False),
        "deploy[us]": (True, False),
        "migrate": (False, False),
        "undo-deploy[eu]": (False, True),
        "undo-deploy[us]": (False, True),
        "verify": (False, False),
    }
