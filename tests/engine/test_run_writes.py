"""The apiserver writes a single-task run costs (issue 26): its status patches and Events.

Every write is one the user reads; what is cut is a write that repeats what another says.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from flowforge.operator.status import COALESCE_SECONDS
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

pytestmark = pytest.mark.store

ONLY: list[dict[str, Any]] = [{"key": "only"}]


def shown_phase(harness: Harness, name: str) -> Any:
    return harness.kube.runs[(NAMESPACE, name)].get("status", {}).get("phase")


async def test_a_view_older_than_the_final_patch_does_not_patch_it_again(
    harness: Harness,
) -> None:
    """A watch event handled late (or a reconciler's LIST page read before the final patch)
    shows the run Running after its Succeeded status went out: no second final patch."""
    run = await harness.start("late", ONLY)
    await wait_until(lambda: shown_phase(harness, "late") == "Running", what="Running")
    stale = copy.deepcopy(harness.kube.runs[(NAMESPACE, "late")])
    await harness.finish("only")
    await wait_until(lambda: shown_phase(harness, "late") == "Succeeded", what="the status")
    patches = len(harness.kube.status_patches)

    await harness.engine.start_run(stale)
    await harness.reconciler.pass_once()
    await asyncio.sleep(3 * COALESCE_SECONDS)

    assert len(harness.kube.status_patches) == patches
    assert harness.engine.status.pending() == 0
    assert (await harness.run(run)).phase.value == "Succeeded"


async def test_a_single_task_runs_start_is_told_by_its_run_started_event(
    harness: Harness,
) -> None:
    """One Event, in TaskStarted's words, where there were two; a retry's start is an Event
    of its own, as is every task's start in a run of more than one."""
    run = await harness.start("one", [{"key": "only", "retries": 1}])
    job = harness.job_of("only")
    await harness.settle_background()  # Events are posted in the background
    [started] = [event for event in harness.kube.events if event.reason == "RunStarted"]
    assert started.message.endswith(f"(1 tasks); task only attempt 1: Job {job}")
    assert "TaskStarted" not in harness.kube.reasons()

    await harness.finish("only", succeeded=False)
    await wait_until(  # after the backoff (0.05 s)
        lambda: any("-only-2-" in name for name in harness.kube.created), what="attempt 2's Job"
    )
    retried = harness.job_of("only", attempt=2)

    def starts() -> list[str]:
        return [e.message for e in harness.kube.events if e.reason == "TaskStarted"]

    await wait_until(lambda: starts(), what="the retry's TaskStarted Event")
    assert starts() == [f"task only attempt 2: Job {retried}"]
    await harness.finish("only", attempt=2)
    assert (await harness.run(run)).phase.value == "Succeeded"
    assert len(harness.engine.notifier) == 0  # nothing kept of the finished run

    await harness.start("two", [{"key": "a"}, {"key": "b"}])
    await wait_until(lambda: len(starts()) == 3, what="both tasks' TaskStarted Events")
    [second] = [e for e in harness.kube.events if e.reason == "RunStarted" and "two" in e.run_name]
    assert second.message.endswith("(2 tasks)")
