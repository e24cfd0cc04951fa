"""The reconciler and the engine's memory at scale, as engine logic against the fake port:
a pass pages its LISTs and its sweep of the store, a pass with nothing changed patches
nothing, a finished run leaves nothing cached, and the definitions cache is bounded.
"""

from __future__ import annotations

from typing import Any

import pytest

from flowforge.domain.states import RunPhase
from flowforge.operator.engine import Engine
from flowforge.operator.finalizer import observe_run
from flowforge.operator.reconciler import Reconciler
from flowforge.operator.runs import RunCache
from flowforge.store.connection import Pool
from flowforge.store.queries import find_run_id_by_uid
from flowforge.store.runs import get_run
from tests.engine.conftest import NAMESPACE, Harness, engine_settings, open_harness
from tests.engine.fake_clock import FakeClock
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

ONE_TASK: list[dict[str, Any]] = [{"key": "only"}]


async def statuses_written(harness: Harness) -> None:
    """Wait until the status writer has written every status marked (it coalesces for 0.1 s,
    and a projection is a few queries on a busy machine)."""
    await harness.settle_background()
    await wait_until(lambda: not harness.engine.status.pending(), what="status writes done")


def tasks(count: int) -> list[dict[str, Any]]:
    return [{"key": f"t{n}"} for n in range(count)]


async def test_a_pass_pages_its_lists_and_repairs_runs_on_every_page(harness: Harness) -> None:
    reconciler = Reconciler(harness.engine, interval=3600, page_size=2, sweep_page_size=2)
    runs = [await harness.start(f"paged-{n}", ONE_TASK) for n in range(5)]
    # missed events: the first and the last run's Jobs finished, a sixth run was never seen
    for run in (runs[0], runs[4]):
        harness.kube.finish(run.job_name(task_key="only", attempt=1), succeeded=True)
    late = await harness.unstarted("paged-late", tasks(1))
    harness.kube.lists.clear()

    await reconciler.pass_once()
    await harness.settle_background()

    listed = [
        (call.kind, call.limit, call.continue_token, call.field_selector)
        for call in harness.kube.lists
    ]
    unsucceeded = "status.successful=0"  # the four unfinished Jobs; the two succeeded are read
    assert listed == [
        ("runs", 2, None, None),
        ("runs", 2, "2", None),
        ("runs", 2, "4", None),
        ("jobs", 2, None, unsucceeded),
        ("jobs", 2, "2", unsucceeded),
    ]
    assert (await harness.run(runs[0])).phase is RunPhase.SUCCEEDED
    assert (await harness.run(runs[4])).phase is RunPhase.SUCCEEDED  # on the last sweep page
    assert {(await harness.run(run)).phase for run in runs[1:4]} == {RunPhase.RUNNING}
    late_id = await find_run_id_by_uid(
        harness.pool, namespace=NAMESPACE, uid=late["metadata"]["uid"]
    )
    assert late_id is not None  # on the last LIST page: created, its Job too
    assert any("-t0-1-" in name for name in harness.kube.created)


async def test_a_pass_with_nothing_changed_patches_nothing(harness: Harness) -> None:
    runs = [
        await harness.start(f"quiet-{n}", [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}])
        for n in range(3)
    ]
    finished = await harness.start("quiet-done", ONE_TASK)
    await harness.finish("only")
    await harness.unstarted("quiet-late", tasks(1))
    await harness.reconciler.pass_once()  # catches up: the late run is started
    await statuses_written(harness)
    before = (
        list(harness.kube.status_patches),
        list(harness.kube.created),
        list(harness.kube.deleted),
        len(harness.kube.events),
    )

    for _ in range(2):
        await harness.reconciler.pass_once()
        await statuses_written(harness)

    after = (
        harness.kube.status_patches,
        harness.kube.created,
        harness.kube.deleted,
        len(harness.kube.events),
    )
    assert after == before
    assert (await harness.run(finished)).phase is RunPhase.SUCCEEDED

    # something does change (a Job finished without its event): that run alone is patched
    harness.kube.finish(runs[1].job_name(task_key="a", attempt=1), succeeded=True)
    await harness.reconciler.pass_once()
    await statuses_written(harness)
    assert harness.kube.status_patches[len(before[0]) :] == ["quiet-1"]


async def test_a_finished_run_leaves_nothing_cached(store: Pool) -> None:
    # a view unlike the final patch is believed a reconciler's interval after that patch
    clock = FakeClock()
    async with open_harness(store, settings=engine_settings(), clock=clock) as harness:
        await _nothing_cached(harness, clock)


async def _nothing_cached(harness: Harness, clock: FakeClock) -> None:
    run = await harness.start("evicted", ONE_TASK)
    assert harness.engine.cached_runs() > 0
    await statuses_written(harness)
    assert len(harness.engine.status) == 1  # its last patched projection, while it runs

    await harness.finish("only")
    await statuses_written(harness)

    body = harness.kube.runs[(NAMESPACE, "evicted")]
    assert body["status"]["phase"] == "Succeeded"
    assert harness.engine.cached_runs() == 0  # the context, the sighting, the projection
    patches = len(harness.kube.status_patches)
    # the object's next events (our own final patch coming back) keep nothing either
    await observe_run(harness.engine, body)
    await harness.reconciler.pass_once()
    await statuses_written(harness)
    assert harness.engine.cached_runs() == 0
    assert len(harness.kube.status_patches) == patches
    # but an object that does not show the final phase (a crash before the last patch) is
    # patched once more, and still nothing stays
    body = harness.kube.runs[(NAMESPACE, "evicted")]  # with the finalizer added since
    body["status"]["phase"] = "Running"
    clock.advance(harness.engine.settings.reconcile_interval_seconds)
    await observe_run(harness.engine, body)
    await statuses_written(harness)
    assert harness.kube.runs[(NAMESPACE, "evicted")]["status"]["phase"] == "Succeeded"
    assert harness.engine.cached_runs() == 0
    # the definition is kept by content, not per run
    assert run.definition.fingerprint in harness.engine.runs.definitions


async def test_the_definitions_cache_is_bounded_by_the_tasks_it_holds(harness: Harness) -> None:
    cache = RunCache(harness.pool, definition_tasks=12)  # two 5-task definitions fit
    contexts = []
    for n in range(4):
        body = await harness.unstarted(f"lru-{n}", tasks(5))
        contexts.append((await cache.ensure(body, fence=harness.engine.fence())).context)

    fingerprints = [context.definition.fingerprint for context in contexts]
    assert cache.definitions.currsize <= 12
    assert sorted(cache.definitions) == sorted(fingerprints[2:])  # the least recent went
    # an evicted definition stays with the runs that run it, and is loaded again by content
    assert contexts[0].definition.spec.task("t4").type == "py"
    cache.forget(contexts[0])
    again = await cache.by_id(contexts[0].run_id)
    assert again.definition == contexts[0].definition
    assert fingerprints[0] in cache.definitions and cache.definitions.currsize <= 12
    record = await get_run(harness.pool, contexts[0].run_id)
    assert record.phase is RunPhase.RUNNING


async def test_a_cancelled_run_leaves_nothing_cached_either(harness: Harness) -> None:
    run = await harness.start("cancelled", ONE_TASK)
    body = harness.kube.runs[(NAMESPACE, "cancelled")]
    body["spec"]["cancel"] = True

    await observe_run(harness.engine, body)
    await statuses_written(harness)

    assert (await harness.run(run)).phase is RunPhase.CANCELLED
    assert harness.engine.cached_runs() == 0


async def test_a_restarted_engine_patches_no_status_its_objects_already_show(
    harness: Harness,
) -> None:
    for n in range(3):
        await harness.start(f"shown-{n}", [{"key": "a"}, {"key": "b", "dependsOn": ["a"]}])
    await statuses_written(harness)
    patches = list(harness.kube.status_patches)
    restarted = Engine(
        pool=harness.pool,
        kube=harness.kube,
        settings=harness.engine.settings,
        leadership=harness.engine.leadership,
    )
    try:
        for n in range(3):  # kopf's first listing after the restart: every object once
            await restarted.start_run(harness.kube.runs[(NAMESPACE, f"shown-{n}")])
        await harness.settle_background()
        await wait_until(lambda: not restarted.status.pending(), what="status writes done")
        assert harness.kube.status_patches == patches
    finally:
        await restarted.shutdown()
