"""A WorkflowSchedule's overlap policy with real runs that outlast the interval (`@every 10s`,
each run 22 s): under `Skip` runs never overlap, from the runs' own times, and the skipped
times are counted; under `Queue` at most one time waits and it starts only after the
active run has finished. Both schedules share one operator and about 40 s."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import pytest

from flowforge.domain.api import GROUP, VERSION
from flowforge.domain.schedule import PLURAL
from tests.plugins.operator import OperatorProcess, RunDriver
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


async def test_skip_never_overlaps_and_counts_queue_keeps_one_until_the_active_run_ends(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(LONG)
    for name, policy in (("skipper", "Skip"), ("queuer", "Queue")):
        driver.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            driver.namespace,
            PLURAL,
            schedule(name, schedule="@every 10s", overlapPolicy=policy),
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
        lambda: (
            len(runs_of(driver, "queuer")) >= 2
            and all(
                (run.get("status") or {}).get("startedAt")
                for run in runs_of(driver, "queuer").values()
            )
        ),
        timeout=60,
        what="the queued time's run",
    )

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
