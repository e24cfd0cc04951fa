"""Run limits on the real control plane, PostgreSQL and operator (``domain/queue.py``):
maxParallelTasks checked from the Jobs' own times, a queue of 20 runs served in priority
then creation order across two SIGKILLs, Forbid refused at ``kubectl apply``, Replace, and a
namespace limit (a FlowForgePolicy) across two workflows."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from flowforge.domain.api import API_VERSION, GROUP, POLICY_KIND, POLICY_PLURAL, RUN_KIND, VERSION
from flowforge.domain.history import EventKind
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.connection import Pool
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver, wait_for_leader
from tests.plugins.webhooks import WebhookServer
from tests.support.job_times import JobTimes, most_at_once
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster


def step(seconds: str) -> dict[str, Any]:
    return {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": seconds}}


def create(
    driver: RunDriver,
    name: str,
    *,
    workflow: str,
    priority: int = 0,
    parameters: dict[str, str] | None = None,
    **spec: Any,
) -> None:
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        "workflowruns",
        {
            "apiVersion": API_VERSION,
            "kind": RUN_KIND,
            "metadata": {"name": name},
            "spec": {
                "workflow": workflow,
                "version": 1,
                "priority": priority,
                "parameters": parameters or {},
                **spec,
            },
        },
    )


async def test_max_parallel_tasks_three_over_a_thirty_wide_fan_out(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "wide",
            "version": 1,
            "maxParallelTasks": 5,
            "taskTypes": {"step": step("1s")},
            "tasks": [
                {"key": "root", "type": "step"},
                *(
                    {"key": f"leaf-{i:02d}", "type": "step", "dependsOn": ["root"]}
                    for i in range(30)
                ),
            ],
        }
    )
    jobs = JobTimes(driver.api, driver.namespace)
    try:
        create(driver, "wide-1", workflow="wide", maxParallelTasks=3)
        await driver.wait_phase("wide-1", {"Succeeded"}, timeout=120, operator=operator)
        await jobs.completed({"wide-1": 31})
    finally:
        jobs.close()
    intervals = jobs.intervals("wide-1", driver)
    assert len(intervals) == 31
    assert most_at_once(intervals) == 3  # 3 at once, and never more


async def _admission_order(pool: Pool, driver: RunDriver, names: Sequence[str]) -> None:
    """Whenever a run left the queue, no run queued at that moment was ahead of it (higher
    priority, or the same and created earlier); and at most 2 ran at any moment. Decided on
    the store's history, whose event ids are ordered by the namespace's lock."""
    moments: list[tuple[int, str, str]] = []
    keys = {}
    for name in names:
        body = driver.run(name)
        run = await find_run(
            pool, namespace=driver.namespace, name=name, uid=body["metadata"]["uid"]
        )
        keys[name] = (-int(body["spec"].get("priority", 0)), body["metadata"]["creationTimestamp"])
        async with pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT id, kind FROM flowforge_event WHERE run_id = %s AND kind = ANY(%s)",
                (
                    run.id,
                    [
                        EventKind.RUN_CREATED,
                        EventKind.RUN_ADMITTED,
                        EventKind.RUN_SUCCEEDED,
                        EventKind.RUN_FAILED,
                        EventKind.RUN_CANCELLED,
                    ],
                ),
            )
            events = await cursor.fetchall()
        kinds = [kind for _, kind in events]
        assert kinds.count(EventKind.RUN_CREATED) == 1 and kinds.count(EventKind.RUN_SUCCEEDED) == 1
        moments += [(int(event_id), str(kind), name) for event_id, kind in events]
    waited = {name for _, kind, name in moments if kind == EventKind.RUN_ADMITTED}
    queued: set[str] = set()
    running: set[str] = set()
    for _, kind, name in sorted(moments):
        starts = kind == EventKind.RUN_ADMITTED or (
            kind == EventKind.RUN_CREATED and name not in waited  # started as it was created
        )
        if kind == EventKind.RUN_CREATED:
            queued.add(name)
        if starts:
            ahead = [other for other in queued - {name} if keys[other] < keys[name]]
            assert not ahead, f"{name} started before {sorted(ahead)}, which were ahead of it"
            queued.discard(name)
            running.add(name)
        elif kind != EventKind.RUN_CREATED:
            running.discard(name)
        assert len(running) <= 2, f"running at once: {sorted(running)}"
    assert len(waited) >= len(names) - 4, f"only {sorted(waited)} waited in the queue"


async def test_twenty_runs_queue_behind_max_runs_two_across_two_sigkills(
    operators: Any, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "nightly",
            "version": 1,
            "concurrency": {"maxRuns": 2, "policy": "Queue"},
            "taskTypes": {"step": step("1s")},
            "tasks": [{"key": "a", "type": "step"}],
        }
    )
    operator = operators()
    await wait_for_leader(driver.pool, operator.identity, process=operator)
    names = [f"nightly-{i:02d}" for i in range(20)]
    jobs = JobTimes(driver.api, driver.namespace)
    for index, name in enumerate(names):
        create(driver, name, workflow="nightly", priority=(index * 7) % 3)
    for _ in range(2):
        await asyncio.sleep(2.0)
        operator.kill()
        operator.start()
    queued = driver.printer_row(names[-1])
    assert {"Priority", "Queue", "Position"} <= set(queued)
    try:
        await driver.wait_finished(names, timeout=240)
        await jobs.completed(dict.fromkeys(names, 1))
    finally:
        jobs.close()
    assert {driver.run(n)["status"]["phase"] for n in names} == {"Succeeded"}
    await _admission_order(driver.pool, driver, names)
    # two runs of the workflow at most, from the Jobs' own times: a run's Jobs span it
    spans = []
    for name in names:
        intervals = jobs.intervals(name, driver)
        assert len(intervals) == 1
        spans.append((min(s for s, _ in intervals), max(e for _, e in intervals)))
    shown = {
        name: (start.isoformat(), end.isoformat(), jobs.pods_of(name, driver))
        for name, (start, end) in zip(names, spans, strict=True)
    }
    assert most_at_once(spans) <= 2, shown


async def test_forbid_is_refused_at_kubectl_apply_and_replace_rolls_back_the_oldest(
    cluster: Cluster,
    store_webhooks: WebhookServer,
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    undo = {"key": "undo-a", "type": "step", "compensateFor": "a"}
    for name, policy in (("exclusive", "Forbid"), ("latest", "Replace")):
        await driver.publish(
            {
                "workflow": name,
                "version": 1,
                "concurrency": {"maxRuns": 1, "key": ["tenant"], "policy": policy},
                "taskTypes": {"step": step("1s"), "slow": step("60s")},
                "tasks": [
                    {"key": "a", "type": "step"},
                    {"key": "b", "type": "slow", "dependsOn": ["a"]},
                    undo,
                ],
            }
        )
    create(driver, "exclusive-1", workflow="exclusive", parameters={"tenant": "x"})
    await driver.wait_phase("exclusive-1", {"Running"}, operator=operator)
    manifest = {
        "apiVersion": API_VERSION,
        "kind": RUN_KIND,
        "metadata": {"name": "exclusive-2", "namespace": driver.namespace},
        "spec": {"workflow": "exclusive", "parameters": {"tenant": "x"}},
    }
    refused = kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(manifest), check=False)
    assert refused.returncode != 0
    assert "already has 1 runs running or queued" in refused.stderr
    assert "policy Forbid" in refused.stderr
    manifest["spec"]["parameters"] = {"tenant": "y"}  # another key: its own limit
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(manifest))

    create(driver, "latest-1", workflow="latest", parameters={"tenant": "x"})
    await wait_job(driver, "latest-1", "b")  # a succeeded, b runs: a is to be undone
    create(driver, "latest-2", workflow="latest", parameters={"tenant": "x"})
    old = await driver.wait_phase("latest-1", {"Cancelled"}, timeout=60, operator=operator)
    steps = {s["name"]: s["state"] for s in old["status"]["compensation"]["steps"]}
    assert steps == {"undo-a": "succeeded"}
    await driver.wait_phase("latest-2", {"Running"}, timeout=30, operator=operator)
    replaced = [e.reason for e in driver.events("latest-1")]
    assert "RunReplaced" in replaced


async def wait_job(driver: RunDriver, run: str, task: str, *, timeout: float = 60) -> None:
    await wait_until(
        lambda: any(j.metadata.labels.get("flowforge.io/task") == task for j in driver.jobs(run)),
        timeout=timeout,
        what=f"a Job of {run}/{task}",
    )


async def wait_any_queued(driver: RunDriver, names: list[str], *, timeout: float) -> dict[str, Any]:
    def queued() -> dict[str, Any] | None:
        bodies = (driver.run(name) for name in names)
        return next((b for b in bodies if (b.get("status") or {}).get("phase") == "Queued"), None)

    found: dict[str, Any] = await wait_until(
        queued, timeout=timeout, interval=0.1, what=f"one of {names} Queued"
    )
    return found


async def namespace_run_limit(driver: RunDriver, limit: int, *, timeout: float = 30) -> None:
    async def stored() -> bool:
        async with driver.pool.connection() as connection:
            cursor = await connection.execute(
                "SELECT max_running_runs FROM flowforge_namespace_limits WHERE namespace = %s",
                (driver.namespace,),
            )
            row = await cursor.fetchone()
        return row is not None and row[0] == limit

    await wait_until(stored, timeout=timeout, what=f"maxRunningRuns {limit} in the store")


async def test_a_namespace_run_limit_holds_across_two_workflows(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    driver.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        POLICY_PLURAL,
        {
            "apiVersion": API_VERSION,
            "kind": POLICY_KIND,
            "metadata": {"name": "limits"},
            "spec": {"maxRunningRuns": 1},
        },
    )
    for name in ("left", "right"):
        await driver.publish(
            {
                "workflow": name,
                "version": 1,
                "taskTypes": {"step": step("1s")},
                "tasks": [{"key": "a", "type": "step"}],
            }
        )
    await namespace_run_limit(driver, 1)  # the operator's policy watch copied it
    names = ["left-1", "right-1", "left-2", "right-2"]
    jobs = JobTimes(driver.api, driver.namespace)
    for name in names:
        create(driver, name, workflow=name.split("-")[0])
    # The operator may take up any of the four first; whichever it did, the others wait.
    held = await wait_any_queued(driver, names, timeout=30)
    queue = held["status"]["queue"]
    assert queue["reason"] == "NamespaceRunLimit" and queue["position"] >= 1
    assert any(c["type"] == "Queued" for c in held["status"]["conditions"])
    try:
        await driver.wait_finished(names, timeout=120)
        await jobs.completed(dict.fromkeys(names, 1))
    finally:
        jobs.close()
    spans = [jobs.intervals(name, driver)[0] for name in names]
    assert most_at_once(spans) == 1
