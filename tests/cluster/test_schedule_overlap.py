"""A WorkflowSchedule's overlap policy with real runs that outlast the interval (`@every 10s`,
each run 22 s): under `Skip` runs never overlap, from the runs' own times, and the skipped
times are counted; under `Queue` at most one time waits and it starts only after the
active run has finished; under `Replace` the active run is cancelled, rolls back (a 4 s
compensator) and the new run starts only after that rollback finished, from the runs' own
recorded times. The three schedules share one operator and about 40 s."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import pytest

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.history import EventKind
from flowforge.domain.schedule import PLURAL
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.sagas import QUICK, history, steps
from tests.support.schedules import nominal, runs_of, schedule
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.cluster

LONG = {
    "workflow": "tick",
    "version": 1,
    "taskTypes": {
        "step": {
            "image": "busybox:1.36",
            "annotations": {"flowforge.io/simulate-duration": "22s"},
        }
    },
    "tasks": [{"key": "only", "type": "step"}],
}
# the long step, after a quick one whose 4 s compensator is the rollback Replace waits for
UNDOABLE = {
    "workflow": "undoable",
    "version": 1,
    "taskTypes": {
        "quick": QUICK,
        "step": LONG["taskTypes"]["step"],
        "undo": {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "4s"}},
    },
    "tasks": [
        {"key": "a", "type": "quick"},
        {"key": "b", "type": "step", "dependsOn": ["a"]},
        {"key": "undo-a", "type": "undo", "compensateFor": "a"},
    ],
}


def spans(runs: dict[str, dict[str, Any]]) -> list[tuple[datetime, datetime | None]]:
    """Each run's (start, finish) from its own status, in nominal-time order."""
    ordered = sorted(runs.values(), key=nominal)
    found = []
    for run in ordered:
        status = run.get("status") or {}
        started = status.get("startedAt")
        finished = status.get("finishedAt")
        assert started is not None, run["metadata"]["name"]
        found.append(
            (
                datetime.fromisoformat(started),
                None if finished is None else datetime.fromisoformat(finished),
            )
        )
    return found


def status_of(driver: RunDriver, name: str) -> dict[str, Any]:
    body = driver.custom.get_namespaced_custom_object(
        GROUP, VERSION, driver.namespace, PLURAL, name
    )
    return dict(body.get("status") or {})


def two_started(driver: RunDriver, name: str) -> bool:
    runs = runs_of(driver, name).values()
    return len(runs) >= 2 and all((run.get("status") or {}).get("startedAt") for run in runs)


async def recorded(driver: RunDriver, run: str, kind: EventKind) -> list[datetime]:
    """When the store recorded each event of ``kind`` in the run's history."""
    return [event.recorded_at for event in await history(driver, run) if event.kind == kind]


async def assert_replaced_after_its_rollback(driver: RunDriver) -> None:
    """The first run was cancelled, its compensator ran, and the run of the next time was
    created, and made its first Job, only after that rollback had finished."""
    old, new = sorted(runs_of(driver, "replacer").values(), key=nominal)[:2]
    old_name, new_name = old["metadata"]["name"], new["metadata"]["name"]
    assert old["status"]["phase"] == "Cancelled", old["status"]
    assert steps(old) == [("undo-a", "a", "succeeded")]
    (rollback_end,) = await recorded(driver, old_name, EventKind.COMPENSATION_SUCCEEDED)
    (old_final,) = await recorded(driver, old_name, EventKind.RUN_CANCELLED)
    (new_created,) = await recorded(driver, new_name, EventKind.RUN_CREATED)
    first_job = min(await recorded(driver, new_name, EventKind.TASK_JOB_CREATED))
    assert rollback_end <= old_final <= new_created <= first_job, (
        rollback_end,
        old_final,
        new_created,
        first_job,
    )
    (_, old_end), (new_start, _) = spans({old_name: old, new_name: new})
    assert old_end is not None and new_start >= old_end


async def test_skip_never_overlaps_queue_keeps_one_replace_waits_for_the_rollback(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(LONG)
    await driver.publish(UNDOABLE)
    for name, policy, workflow in (
        ("skipper", "Skip", "tick"),
        ("queuer", "Queue", "tick"),
        ("replacer", "Replace", "undoable"),
    ):
        driver.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            driver.namespace,
            PLURAL,
            schedule(name, workflow=workflow, schedule="@every 10s", overlapPolicy=policy),
        )

    # the first runs outlast two more nominal times: Skip counts them, Queue keeps one
    wait_until_blocking(
        lambda: (
            status_of(driver, "skipper").get("missed", {}).get("Overlap", 0) >= 1
            and status_of(driver, "queuer").get("queued") is not None
        ),
        timeout=45,
        what="a skipped time and a queued one",
    )
    wait_until_blocking(
        lambda: two_started(driver, "queuer"), timeout=60, what="the queued time's run"
    )
    wait_until_blocking(
        lambda: two_started(driver, "replacer"), timeout=60, what="the replacing run"
    )
    await assert_replaced_after_its_rollback(driver)

    for name in ("skipper", "queuer"):
        started = spans(runs_of(driver, name))
        # a run starts only once the one before it has finished (its own times)
        for (_, before_end), (after_start, _) in itertools.pairwise(started):
            assert before_end is not None and after_start >= before_end, (name, started)
    assert len(runs_of(driver, "skipper")) <= 2
    skipped = status_of(driver, "skipper")["missed"]["Overlap"]
    assert skipped >= 1
    assert len(status_of(driver, "skipper").get("active") or []) <= 1
    assert len(status_of(driver, "queuer").get("active") or []) <= 1
