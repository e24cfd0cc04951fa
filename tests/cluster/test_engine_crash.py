"""Crash safety: SIGKILLed operators lose and duplicate nothing (PostgreSQL outages:
``test_postgres_faults.py``)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from flowforge.store.events import run_history
from flowforge.store.runs import find_run
from tests.plugins.operator import JobCreationLog, OperatorProcess, RunDriver, wait_for_leader

pytestmark = pytest.mark.cluster

STEP = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}


def diamond(workflow: str) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"step": STEP},
        "tasks": [
            {"key": "a", "type": "step"},
            {"key": "b", "type": "step", "dependsOn": ["a"]},
            {"key": "c", "type": "step", "dependsOn": ["a"]},
            {"key": "d", "type": "step", "dependsOn": ["b", "c"]},
        ],
    }


async def wait_all(driver: RunDriver, names: list[str], *, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        phases = {name: (driver.run(name).get("status") or {}).get("phase", "") for name in names}
        if all(phase in ("Succeeded", "Failed", "Cancelled") for phase in phases.values()):
            return phases
        await asyncio.sleep(0.5)
    raise AssertionError(f"runs not finished after {timeout} s: {phases}")


async def log_caught_up(log: JobCreationLog, *, jobs: int, timeout: float = 30) -> None:
    """Wait until the Jobs' watch has seen ``jobs`` Jobs (it lags behind the runs' status);
    ``assert_exactly_once`` then says whether they are the right ones."""
    deadline = time.monotonic() + timeout
    while len(log.labels_by_name) < jobs and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def assert_exactly_once(driver: RunDriver, log: JobCreationLog, names: list[str]) -> None:
    """One Job object per (run, task, attempt) ever created, every outcome recorded once."""
    duplicates = {name: uids for name, uids in log.uids_by_name.items() if len(uids) > 1}
    assert not duplicates, f"Jobs created more than once: {duplicates}"
    per_attempt = Counter(
        (labels["flowforge.io/run"], labels["flowforge.io/task"], labels["flowforge.io/attempt"])
        for labels in log.labels_by_name.values()
    )
    assert all(count == 1 for count in per_attempt.values()), per_attempt
    assert len(per_attempt) == 4 * len(names)
    assert {attempt for _, _, attempt in per_attempt} == {"1"}, "an attempt was lost or repeated"
    for name in names:
        body = driver.run(name)
        run = await find_run(
            driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
        )
        events = await run_history(driver.pool, run.id)
        outcomes = Counter((e.task_key, e.attempt) for e in events if e.kind == "task.succeeded")
        assert outcomes == {(key, 1): 1 for key in "abcd"}, (name, outcomes)


async def test_sigkill_at_random_moments_during_twenty_runs(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    await driver.publish(diamond("crash"))
    log = JobCreationLog(driver.api, driver.namespace)
    names = [f"crash-{i:02d}" for i in range(20)]
    try:
        for name in names:
            driver.create_run(name, workflow="crash")
        chance = random.Random(20261130)
        for _ in range(8):
            await asyncio.sleep(chance.uniform(0.3, 4.0))
            operator.kill()
            operator.start()
        phases = await wait_all(driver, names, timeout=240)
        assert set(phases.values()) == {"Succeeded"}, phases
        await log_caught_up(log, jobs=4 * len(names))
    finally:
        log.close()
    assert operator.starts == 9
    await assert_exactly_once(driver, log, names)
