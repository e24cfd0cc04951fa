"""WorkflowRunActions on the real control plane, through the webhooks as `kubectl apply`
sends them (the actor recorded by the mutating webhook, the verb checked with a
SubjectAccessReview): a halted rollback finished by SkipCompensator, another by
RetryCompensator once its failure is fixed (who and why in the history and describe), an
action on a run that is not halted Refused, and Pause/Resume: a paused run starts nothing
new until resumed, and a cancel during the pause is applied after. One webhook server and
one operator per test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from flowforge.cli.run_report import load_report, report_text
from flowforge.kube.jobs import SIMULATE_FAIL_ATTEMPTS
from flowforge.localdev.controlplane import Cluster
from flowforge.store.reuse import find_run_by_name
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer, store_webhooks  # noqa: F401 (a fixture)
from tests.support.run_actions import act, processed
from tests.support.sagas import FAIL, OK, UNDO, compensator_states
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

HALTING: dict[str, Any] = {
    "workflow": "halting",
    "version": 1,
    "taskTypes": {"ok": OK, "undo": UNDO, "fail": FAIL},
    "tasks": [
        {"key": "provision", "type": "ok"},
        {"key": "deploy", "type": "ok", "dependsOn": ["provision"]},
        {"key": "verify", "type": "fail", "dependsOn": ["deploy"]},
        {"key": "unprovision", "type": "undo", "compensateFor": "provision"},
        {"key": "undeploy", "type": "fail", "compensateFor": "deploy"},
    ],
}
# undeploy fails its first attempt only: fixed before a person asks for it again
FIXABLE: dict[str, Any] = {
    **HALTING,
    "workflow": "fixable",
    "taskTypes": {
        **HALTING["taskTypes"],
        "fail": {**FAIL, "annotations": {**FAIL["annotations"], SIMULATE_FAIL_ATTEMPTS: "1"}},
    },
    "tasks": [
        *HALTING["tasks"][:2],
        {"key": "verify", "type": "stuck", "dependsOn": ["deploy"]},
        *HALTING["tasks"][3:],
    ],
}
FIXABLE["taskTypes"]["stuck"] = FAIL
LINE: dict[str, Any] = {
    "workflow": "line",
    "version": 1,
    "taskTypes": {
        "ok": OK,
        "undo": UNDO,
        "slow": {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "4s"}},
    },
    "tasks": [
        {"key": "first", "type": "slow"},
        {"key": "second", "type": "ok", "dependsOn": ["first"]},
        {"key": "undo-first", "type": "undo", "compensateFor": "first"},
    ],
}


async def test_skip_finishes_a_halted_rollback_and_a_run_not_halted_refuses(
    cluster: Cluster,
    store_webhooks: WebhookServer,  # noqa: F811
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    await driver.publish(HALTING)
    await driver.publish(FIXABLE)
    driver.create_run("halted", workflow="halting")
    driver.create_run("fixable", workflow="fixable")
    await driver.wait_phase("halted", {"Failed"}, timeout=120, operator=operator)
    states = await compensator_states(driver.pool, driver, "halted")
    assert (states["undeploy"], states["unprovision"]) == ("failed", "skipped")

    act(cluster, driver, "too-early", {"run": "halted", "action": "Pause"})
    refused = await processed(driver, "too-early", operator)
    assert refused["result"] == "Refused" and "finished" in refused["message"]

    act(
        cluster,
        driver,
        "skip-undeploy",
        {
            "run": "halted",
            "action": "SkipCompensator",
            "compensator": "undeploy",
            "reason": "undeployed by hand, OPS-1234",
        },
    )
    accepted = await processed(driver, "skip-undeploy", operator)

    assert accepted["result"] == "Accepted"
    assert accepted["actor"]["username"]  # recorded by the webhook, not by the object
    final = await until_states(
        driver, "halted", lambda states: states.get("unprovision") == "succeeded", operator
    )
    assert final["undeploy"] == "skipped"
    body = await driver.wait_phase("halted", {"Failed"}, operator=operator)
    reasons = {c["type"]: c["reason"] for c in body["status"]["conditions"]}
    await wait_until(
        lambda: (
            {c["type"]: c["reason"] for c in driver.run("halted")["status"]["conditions"]}.get(
                "Compensating"
            )
            == "RolledBackAfterAction"
        ),
        timeout=30,
        what="the run's conditions to say the rollback finished after a person acted",
        operator=operator,
    )
    assert reasons["Failed"]
    # its rollback is complete now: no compensator is halted, a recovery is refused
    again = {"run": "halted", "action": "RetryCompensator", "compensator": "undeploy"}
    act(cluster, driver, "retry-too-late", again)
    late = await processed(driver, "retry-too-late", operator)
    assert late["result"] == "Refused" and "not halted" in late["message"]

    # another run halted at its first attempt: retried once the failure is fixed
    await driver.wait_phase("fixable", {"Failed"}, timeout=120, operator=operator)
    retry = {
        "run": "fixable",
        "action": "RetryCompensator",
        "compensator": "undeploy",
        "reason": "load balancer fixed, OPS-1235",
    }
    act(cluster, driver, "retry-undeploy", retry)
    assert (await processed(driver, "retry-undeploy", operator))["result"] == "Accepted"
    final = await until_states(
        driver, "fixable", lambda states: states.get("unprovision") == "succeeded", operator
    )
    assert final["undeploy"] == "succeeded"
    assert driver.run("fixable")["status"]["phase"] == "Failed"
    for name, action, reason in (
        ("halted", "SkipCompensator", "undeployed by hand, OPS-1234"),
        ("fixable", "RetryCompensator", "load balancer fixed, OPS-1235"),
    ):  # who and why, in the run's history and in describe
        named = await find_run_by_name(driver.pool, namespace=driver.namespace, name=name)
        assert named is not None
        report = await load_report(driver.pool, named)
        (shown,) = [a for a in report.to_dict()["actions"] if a["action"] == action]
        assert (shown["result"], shown["reason"], shown["actor"]) == (
            "Accepted",
            reason,
            accepted["actor"]["username"],
        )
        assert reason in report_text(report)


async def until_states(
    driver: RunDriver,
    name: str,
    done: Callable[[dict[str, str]], bool],
    operator: OperatorProcess,
    *,
    timeout: float = 60,
) -> dict[str, str]:
    """The run's compensator states once ``done`` holds for them."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = await compensator_states(driver.pool, driver, name)
        if done(states):
            return states
        await asyncio.sleep(0.25)
    raise AssertionError(f"compensators of {name}: {states}\n{operator.log_tail()}")


async def test_a_paused_run_starts_nothing_until_resumed_and_a_cancel_waits_for_the_resume(
    cluster: Cluster,
    store_webhooks: WebhookServer,  # noqa: F811
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    await driver.publish(LINE)
    driver.create_run("paused", workflow="line")
    await driver.wait_phase("paused", {"Running"}, operator=operator)
    act(cluster, driver, "pause-1", {"run": "paused", "action": "Pause", "reason": "freeze"})
    assert (await processed(driver, "pause-1", operator))["result"] == "Accepted"

    # first (4 s) finishes while paused; second gets no Job
    await wait_until(
        lambda: any(job.status.succeeded for job in driver.jobs("paused")),
        timeout=60,
        what="first's Job to finish",
        operator=operator,
    )
    await wait_until(
        lambda: (
            "Paused"
            in {c["type"] for c in (driver.run("paused").get("status") or {}).get("conditions", [])}
        ),
        timeout=30,
        what="a Paused condition",
        operator=operator,
    )
    await asyncio.sleep(2.0)  # what would have started by now (second's Job) has not
    tasks = {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("paused")}
    assert tasks == {"first"}
    driver.cancel("paused")
    await wait_until(
        lambda: any(event.reason == "CancelDeferred" for event in driver.events("paused")),
        timeout=30,
        what="the cancel deferred",
        operator=operator,
    )
    assert driver.run("paused")["status"]["phase"] == "Running"

    act(cluster, driver, "resume-1", {"run": "paused", "action": "Resume"})
    assert (await processed(driver, "resume-1", operator))["result"] == "Accepted"

    # the cancel applies now: second never runs, first is undone, the run ends Cancelled
    await driver.wait_phase("paused", {"Cancelled"}, timeout=60, operator=operator)
    tasks = {job.metadata.labels["flowforge.io/task"] for job in driver.jobs("paused")}
    assert tasks == {"first", "undo-first"}
