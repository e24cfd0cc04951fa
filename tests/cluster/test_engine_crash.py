"""Crash safety: SIGKILLed operators and a stopped PostgreSQL lose and duplicate nothing."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from flowforge.localdev import postgres as localdev
from flowforge.store.connection import Pool
from flowforge.store.events import run_history
from flowforge.store.migrate import migrate
from flowforge.store.pool import open_pool
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
        await asyncio.sleep(1.0)  # let the watch catch up with the last creations
    finally:
        log.close()
    assert operator.starts == 9
    await assert_exactly_once(driver, log, names)


@pytest.fixture
async def outage_postgres() -> AsyncIterator[tuple[Path, int, str]]:
    """A PostgreSQL server of this test alone, so that it can be stopped and restarted on
    the same port."""
    directory = Path(tempfile.mkdtemp(prefix="flowforge-outage-"))
    server = localdev.start(directory, settings={"fsync": "off"})
    await migrate(server.dsn)
    try:
        yield directory, server.port, server.dsn
    finally:
        localdev.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


async def test_postgres_stopped_for_twenty_seconds_pauses_runs(
    operators: Callable[..., OperatorProcess],
    driver: RunDriver,
    outage_postgres: tuple[Path, int, str],
) -> None:
    directory, port, dsn = outage_postgres
    pool: Pool = await open_pool(dsn, min_size=1, max_size=4)
    outage_driver = RunDriver(api=driver.api, namespace=driver.namespace, pool=pool)
    try:
        operator = operators(dsn=dsn)
        await wait_for_leader(pool, operator.identity, process=operator)
        await outage_driver.publish(diamond("outage"))
        log = JobCreationLog(driver.api, driver.namespace)
        names = [f"outage-{i}" for i in range(5)]
        for name in names:
            outage_driver.create_run(name, workflow="outage")
        deadline = time.monotonic() + 60
        while len(outage_driver.jobs()) < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await pool.close()
        localdev.stop(directory)
        await asyncio.sleep(20)
        paused = {
            name: (outage_driver.run(name).get("status") or {}).get("phase") for name in names
        }
        localdev.start(directory, settings={"fsync": "off", "port": str(port)})
        pool = await open_pool(dsn, min_size=1, max_size=4)
        outage_driver.pool = pool
        assert "Failed" not in paused.values(), paused
        phases = await wait_all(outage_driver, names, timeout=120)
        assert set(phases.values()) == {"Succeeded"}, (phases, operator.log_tail())
        await asyncio.sleep(1.0)
        log.close()
        assert operator.running, "the operator must ride out the outage, not die"
        await assert_exactly_once(outage_driver, log, names)
    finally:
        await pool.close()
