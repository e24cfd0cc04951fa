"""A run shaped by its parameters: ``create_run`` writes ``expand(definition, parameters)``
(defaults recorded, tasks whose ``when`` is false skipped with reason ConditionFalse, their
dependents waiting for their upstreams), the same expansion ``flowforge plan -p`` prints."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from flowforge.domain.expansion import CONDITION_FALSE, is_condition_false
from flowforge.domain.graph import DependencyGraph
from flowforge.domain.history import EventKind
from flowforge.domain.models import DefinitionSpec
from flowforge.domain.parameters import ParameterError
from flowforge.domain.planning import plan
from flowforge.domain.projection import progress_text
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.domain.validation import parse_definition
from flowforge.store import browse
from flowforge.store.browse import creation_skips
from flowforge.store.connection import Pool
from flowforge.store.definitions import load_definition, publish_definition
from flowforge.store.events import run_history
from flowforge.store.lease import Fence
from flowforge.store.queries import forward_counts, list_tasks, run_progress
from flowforge.store.retention import prune
from flowforge.store.runs import RunRecord, create_run, get_run
from tests.store.conftest import NAMESPACE, failure, finish, roll_back, states, stored_edges

pytestmark = pytest.mark.store

PARAMETERS: list[dict[str, Any]] = [
    {"name": "mode", "type": "string", "enum": ["full", "incremental"], "default": "incremental"},
    {"name": "regions", "type": "array", "items": {"type": "string"}, "default": ["eu"]},
    {"name": "batchSize", "type": "integer", "minimum": 1, "default": 500},
]
# extract -> migrate (full runs only) -> {load, report}; seed (us runs only) -> report
TASKS: list[dict[str, Any]] = [
    {"key": "extract"},
    {"key": "migrate", "dependsOn": ["extract"], "when": "params.mode == 'full'"},
    {"key": "seed", "when": "'us' in params.regions"},
    {"key": "load", "dependsOn": ["migrate"]},
    {"key": "report", "dependsOn": ["migrate", "seed"]},
    {"key": "undo-extract", "compensateFor": "extract"},
    {"key": "undo-migrate", "compensateFor": "migrate"},
]


def shaped() -> DefinitionSpec:
    return parse_definition(
        {
            "workflow": "shaped",
            "version": 1,
            "taskTypes": {"py": {"image": "python:3.12-slim"}},
            "parameters": PARAMETERS,
            "tasks": [{"type": "py", **task} for task in TASKS],
        }
    )


async def create(pool: Pool, fence: Fence, parameters: dict[str, Any]) -> RunRecord:
    definition = shaped()
    await publish_definition(pool, namespace=NAMESPACE, definition=definition)
    stored = await load_definition(pool, namespace=NAMESPACE, workflow="shaped", version=1)
    created = await create_run(
        pool,
        fence=fence,
        namespace=NAMESPACE,
        name=f"shaped-{uuid.uuid4().hex[:8]}",
        uid=str(uuid.uuid4()),
        definition=stored,
        parameters=parameters,
    )
    return created.run


async def test_defaults_are_recorded_and_a_false_condition_is_skipped_at_creation(
    store: Pool, fence: Fence
) -> None:
    run = await create(store, fence, {"batchSize": 20})
    assert dict((await get_run(store, run.id)).parameters) == {
        "mode": "incremental",
        "regions": ["eu"],
        "batchSize": 20,
    }
    tasks = {task.task_key: task for task in await list_tasks(store, run.id)}
    assert {key: task.state for key, task in tasks.items()} == {
        "extract": TaskState.READY,
        "migrate": TaskState.SKIPPED,
        "seed": TaskState.SKIPPED,
        "load": TaskState.WAITING,  # waits for extract, as it waited for migrate
        "report": TaskState.WAITING,
        "undo-extract": CompensationState.NOT_TRIGGERED,
        "undo-migrate": CompensationState.NOT_TRIGGERED,
    }
    assert is_condition_false(tasks["migrate"].last_error)
    assert tasks["migrate"].started_at is None and tasks["migrate"].finished_at is not None
    assert tasks["load"].pending_dependencies == 1
    assert tasks["report"].pending_dependencies == 1
    skipped = [
        (event.task_key, event.detail)
        for event in await run_history(store, run.id)
        if event.kind == EventKind.TASK_SKIPPED
    ]
    assert sorted(skipped) == [
        ("migrate", {"reason": CONDITION_FALSE}),
        ("seed", {"reason": CONDITION_FALSE}),
    ]


async def test_dependents_run_and_the_run_succeeds(store: Pool, fence: Fence) -> None:
    run = await create(store, fence, {})
    await finish(store, fence, run, "extract")
    assert (await states(store, run.id))["load"] in (TaskState.READY, TaskState.RUNNING)
    await finish(store, fence, run, "load")
    await finish(store, fence, run, "report")
    assert (await get_run(store, run.id)).phase is RunPhase.SUCCEEDED
    assert (await states(store, run.id))["migrate"] == TaskState.SKIPPED
    # counted apart from skips after a failure, in the status and in describe
    counts = await forward_counts(store, run.id)
    assert (counts.succeeded, counts.skipped, counts.condition_false) == (3, 2, 2)
    assert progress_text(counts) == "3/3"
    assert (await run_progress(store, run.id)).forward.condition_false == 2


async def test_a_pruned_run_still_counts_its_condition_false_tasks_apart(
    store: Pool, fence: Fence
) -> None:
    """Retention keeps them in ``final_counts``; the status, describe and the read API read
    the same counts as before the task rows went."""
    run = await create(store, fence, {})
    for key in ("extract", "load", "report"):
        await finish(store, fence, run, key)

    async def read() -> tuple[tuple[int, int, int, int], dict[str, int]]:
        forward = (await run_progress(store, run.id)).forward
        async with store.connection() as connection:
            found = await browse.find_run(connection, namespace=NAMESPACE, name=run.name)
        assert found is not None
        listed = {state: n for state, n in found.counts.items() if n}
        return (forward.total, forward.succeeded, forward.skipped, forward.condition_false), listed

    before = await read()
    assert before == ((5, 3, 2, 2), {"total": 5, "succeeded": 3, "skipped": 2})
    assert (await prune(store, older_than=timedelta(0))).runs >= 1
    assert await list_tasks(store, run.id) == []
    assert await read() == before


async def test_a_skipped_task_is_never_compensated(store: Pool, fence: Fence) -> None:
    run = await create(store, fence, {"regions": ["us"]})
    await finish(store, fence, run, "extract")
    await finish(store, fence, run, "load")
    decision = await finish(store, fence, run, "seed", failure())
    counts = await forward_counts(store, run.id)
    # migrate by its condition, report because seed failed
    assert (counts.skipped, counts.condition_false) == (2, 1)
    async with store.connection() as connection:  # what the read API's graph says why
        assert await creation_skips(connection, run.id) == {"migrate": CONDITION_FALSE}
    assert await roll_back(store, fence, run, decision) == ["undo-extract"]  # not undo-migrate
    final = await states(store, run.id)
    assert final["undo-migrate"] == CompensationState.SKIPPED
    assert (await get_run(store, run.id)).phase is RunPhase.FAILED


async def test_a_true_condition_runs_the_task(store: Pool, fence: Fence) -> None:
    run = await create(store, fence, {"mode": "full", "regions": ["eu", "us"]})
    tasks = {task.task_key: task for task in await list_tasks(store, run.id)}
    assert tasks["migrate"].state == TaskState.WAITING
    assert tasks["seed"].state == TaskState.READY
    assert tasks["report"].pending_dependencies == 2


@pytest.mark.parametrize(
    "parameters",
    [{}, {"mode": "full"}, {"regions": ["us"]}, {"mode": "full", "regions": ["eu", "us"]}],
    ids=repr,
)
async def test_plan_prints_the_expansion_the_store_wrote(
    store: Pool, fence: Fence, parameters: dict[str, Any]
) -> None:
    """`flowforge plan -p` and the operator's `create_run` agree: the same skipped tasks,
    parameters, edges and so levels."""
    run = await create(store, fence, parameters)
    printed = plan(shaped(), parameters)
    tasks = await list_tasks(store, run.id)
    written_skips = {
        task.task_key
        for task in tasks
        if task.state == TaskState.SKIPPED and is_condition_false(task.last_error)
    }
    assert written_skips == set(printed.skipped)
    assert dict((await get_run(store, run.id)).parameters) == dict(printed.parameters)
    edges = await stored_edges(store, run.id)
    running = [
        task.task_key
        for task in tasks
        if task.role == "forward" and task.task_key not in written_skips
    ]
    graph = DependencyGraph({key: edges.get(key, set()) for key in running})
    assert graph.levels() == printed.levels


async def test_parameters_that_do_not_fit_create_nothing(store: Pool, fence: Fence) -> None:
    with pytest.raises(ParameterError) as caught:
        await create(store, fence, {"regoins": ["us"]})
    assert caught.value.errors[0][0] == "spec.parameters.regoins"
