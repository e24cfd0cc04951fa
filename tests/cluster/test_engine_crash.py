"""Crash safety: SIGKILLed operators lose and duplicate nothing (PostgreSQL outages:
``test_postgres_faults.py``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from tests.plugins.operator import JobCreationLog, OperatorProcess, RunDriver, wait_for_leader
from tests.support.exactly_once import assert_exactly_once, diamond

pytestmark = pytest.mark.cluster


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
        phases = await driver.wait_finished(names, timeout=240)
        assert set(phases.values()) == {"Succeeded"}, phases
        await log.caught_up(jobs=4 * len(names))
    finally:
        log.close()
    assert operator.starts == 9
    await assert_exactly_once(driver, log, names)
