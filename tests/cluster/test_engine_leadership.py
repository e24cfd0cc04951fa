"""Two operators: only the lease holder acts; a standby takes over; a deposed one is fenced."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from flowforge.store import dispatch as store_dispatch
from flowforge.store.errors import StaleEpochError
from flowforge.store.events import run_history
from flowforge.store.lease import Fence, current_lease
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.support.waiting import wait_until_blocking

pytestmark = pytest.mark.cluster

SPEC = {
    "workflow": "chain",
    "version": 1,
    "taskTypes": {
        "step": {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
    },
    "tasks": [{"key": "one", "type": "step"}, {"key": "two", "type": "step", "dependsOn": ["one"]}],
}
# the operators' lease settings in tests/plugins/operator.py: TTL 4 s, renewed every 1 s
HANDOVER_BOUND_SECONDS = 4 + 1 + 10


async def epochs_of(driver: RunDriver, name: str) -> set[int | None]:
    body = driver.run(name)
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    return {event.epoch for event in await run_history(driver.pool, run.id)}


async def test_only_the_holder_acts_and_a_standby_takes_over(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    first = operators(identity="first")
    first_epoch = await wait_for_leader(driver.pool, "first", process=first)
    second = operators(identity="second")
    await driver.publish(SPEC)

    driver.create_run("before", workflow="chain")
    body = await driver.wait_phase("before", {"Succeeded", "Failed"}, operator=first)
    assert body["status"]["phase"] == "Succeeded"
    assert await epochs_of(driver, "before") == {first_epoch}, "the standby acted"
    lease = await current_lease(driver.pool)
    assert lease is not None and lease.holder == "first"

    wait_until_blocking(
        lambda: "standing by" in second.log_tail(400), timeout=60, what="the standby to be up"
    )
    killed_at = time.monotonic()
    first.kill()
    second_epoch = await wait_for_leader(
        driver.pool, "second", process=second, timeout=HANDOVER_BOUND_SECONDS
    )
    handover = time.monotonic() - killed_at
    assert second_epoch > first_epoch
    print(f"handover after SIGKILL took {handover:.1f} s")

    driver.create_run("after", workflow="chain")
    body = await driver.wait_phase("after", {"Succeeded", "Failed"}, operator=second)
    assert body["status"]["phase"] == "Succeeded"
    assert await epochs_of(driver, "after") == {second_epoch}

    # a write carrying the deposed operator's epoch is refused by the store
    run = await find_run(
        driver.pool, namespace=driver.namespace, name="after", uid=body["metadata"]["uid"]
    )
    with pytest.raises(StaleEpochError):
        await store_dispatch.record_jobs_created(
            driver.pool,
            fence=Fence(lease="operator", epoch=first_epoch),
            run_id=run.id,
            jobs=(
                store_dispatch.JobCreated(
                    task_key="one", attempt=1, job="forged", uid="forged-uid", created=True
                ),
            ),
        )


async def test_a_frozen_operator_is_deposed_and_stops_acting(
    operators: Callable[..., OperatorProcess], driver: RunDriver
) -> None:
    first = operators(identity="first")
    first_epoch = await wait_for_leader(driver.pool, "first", process=first)
    second = operators(identity="second")
    await driver.publish(SPEC)
    assert first.process is not None
    wait_until_blocking(
        lambda: "standing by" in second.log_tail(400), timeout=60, what="the standby to be up"
    )
    first.process.send_signal(signal.SIGSTOP)  # alive but silent: its lease expires
    try:
        second_epoch = await wait_for_leader(
            driver.pool, "second", process=second, timeout=HANDOVER_BOUND_SECONDS
        )
        driver.create_run("during", workflow="chain")
        body = await driver.wait_phase("during", {"Succeeded", "Failed"}, operator=second)
        assert body["status"]["phase"] == "Succeeded"
    finally:
        first.process.send_signal(signal.SIGCONT)
    wait_until_blocking(
        lambda: "no longer acting" in first.log_tail(200),
        timeout=15,
        what="the deposed operator to say it stopped acting",
        operator=first,
    )
    driver.create_run("later", workflow="chain")
    body = await driver.wait_phase("later", {"Succeeded", "Failed"}, operator=second)
    assert body["status"]["phase"] == "Succeeded"
    assert first_epoch not in await epochs_of(driver, "during")
    assert await epochs_of(driver, "later") == {second_epoch}
    lease = await current_lease(driver.pool)
    assert lease is not None and lease.holder == "second"
