"""The saga on the real control plane, as several modules stage and read it: step types that
succeed, fail or take their time (busybox with the simulate annotations), the order saga
(``examples/saga-order.yaml``'s shape) and readers of a rollback from the store, the status
and the Jobs."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from flowforge.domain.api import FINALIZER
from flowforge.store.connection import Pool
from flowforge.store.events import Event, run_history
from flowforge.store.queries import list_tasks
from flowforge.store.reuse import find_run_by_name
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.support.waiting import wait_until

QUICK = {"image": "busybox:1.36"}
OK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
UNDO = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "2s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
SLOW = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "60s"}}

ORDER_SAGA: dict[str, Any] = {
    "workflow": "order",
    "version": 1,
    "taskTypes": {"ok": OK, "undo": UNDO, "fail": FAIL},
    "tasks": [
        {"key": "reserve", "type": "ok"},
        {"key": "charge", "type": "ok", "dependsOn": ["reserve"]},
        {"key": "ship", "type": "fail", "dependsOn": ["charge"]},
        {"key": "release", "type": "undo", "compensateFor": "reserve"},
        {"key": "refund", "type": "undo", "compensateFor": "charge"},
    ],
}


async def history(driver: RunDriver, name: str) -> list[Event]:
    body = driver.run(name)
    run = await find_run(
        driver.pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
    )
    return await run_history(driver.pool, run.id)


# The order saga's rollback (ORDER_SAGA here, examples/saga-order.yaml), as the history has it.
REFUND_THEN_RELEASE = [
    ("compensation.started", "refund"),
    ("compensation.succeeded", "refund"),
    ("compensation.started", "release"),
    ("compensation.succeeded", "release"),
]


async def compensation_history(driver: RunDriver, name: str) -> list[tuple[str, str | None]]:
    """(kind, task) of every compensator's start and success, in the order recorded."""
    return [
        (event.kind, event.task_key)
        for event in await history(driver, name)
        if event.kind in ("compensation.started", "compensation.succeeded")
    ]


def started_order(events: list[Event]) -> list[str]:
    return [str(event.task_key) for event in events if event.kind == "compensation.started"]


def compensation_jobs(driver: RunDriver, run: str) -> list[Any]:
    jobs = [
        job
        for job in driver.jobs(run)
        if job.metadata.labels["flowforge.io/role"] == "compensation"
    ]
    # creationTimestamp has whole seconds: two compensators' Jobs may share one, so a tie
    # goes by the rollback's own order (its steps in the status) and the attempt
    shown = (driver.run(run).get("status") or {}).get("compensation") or {}
    order = {step["name"]: index for index, step in enumerate(shown.get("steps") or [])}
    return sorted(
        jobs,
        key=lambda job: (
            job.metadata.creation_timestamp,
            order.get(job.metadata.labels["flowforge.io/task"], len(order)),
            int(job.metadata.labels["flowforge.io/attempt"]),
            job.metadata.name,
        ),
    )


def steps(body: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (step["name"], step["compensates"], step["state"])
        for step in body["status"]["compensation"]["steps"]
    ]


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == kind)


async def compensator_states(pool: Pool, driver: RunDriver, name: str) -> dict[str, str]:
    """Each compensator's state in the store ({} before the operator has the run); read by
    name, so it answers while the WorkflowRun is being deleted too."""
    run = await find_run_by_name(pool, namespace=driver.namespace, name=name)
    if run is None:
        return {}
    return {
        task.task_key: str(task.state)
        for task in await list_tasks(pool, run.id)
        if task.compensates_key is not None
    }


HANG = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "600s"}}


def saga(workflow: str, undo: dict[str, Any]) -> dict[str, Any]:
    """The order saga, with compensators that take ``undo``'s time."""
    return {
        **ORDER_SAGA,
        "workflow": workflow,
        "taskTypes": {**ORDER_SAGA["taskTypes"], "undo": undo},
    }


async def wait_gone(
    operator: OperatorProcess, driver: RunDriver, name: str, *, timeout: float
) -> None:
    await wait_until(
        lambda: present(driver, name) is None,
        timeout=timeout,
        what=f"{name} to go",
        operator=operator,
    )


def present(driver: RunDriver, name: str) -> dict[str, Any] | None:
    try:
        return driver.run(name)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


async def delete_mid_rollback(
    operator: OperatorProcess, driver: RunDriver, name: str, *, undo: dict[str, Any]
) -> None:
    """Start a saga run whose compensators take ``undo``'s time; delete it once ``refund``
    (the first compensator) runs."""
    await driver.publish(saga(f"w-{name}", undo))
    driver.create_run(name, workflow=f"w-{name}")
    await wait_until(
        lambda: (
            FINALIZER in (present(driver, name) or {}).get("metadata", {}).get("finalizers", [])
        ),
        timeout=60,
        what="the operator's finalizer on the run",
        operator=operator,
    )

    async def refund_running() -> bool:
        return (await compensator_states(driver.pool, driver, name)).get("refund") == "running"

    await wait_until(
        refund_running, timeout=90, what="the rollback to start (refund running)", operator=operator
    )
    driver.delete_run(name)
