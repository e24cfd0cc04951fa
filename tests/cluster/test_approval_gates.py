"""Approval gates on the real control plane, decided by people through `kubectl apply --as`
of WorkflowRunActions (the actor recorded by the mutating webhook, the `approve` verb
checked with a SubjectAccessReview): with `required: 2` one approval leaves the gate
waiting (the run Running with AwaitingApproval) and a second approver passes it; the run's
creator is refused under `forbidSelf`; a user without the verb is refused at apply; a
rejection rolls the run back in reverse order; a 5 s timeout rejects."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from flowforge.domain.api import API_VERSION, REQUESTED_BY_ANNOTATION
from flowforge.domain.run_actions import KIND
from flowforge.localdev.controlplane import Cluster, kubectl
from flowforge.store.queries import list_tasks
from flowforge.store.runs import find_run
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer, store_webhooks  # noqa: F401 (a fixture)
from tests.support.rbac import grant
from tests.support.run_actions import processed
from tests.support.sagas import OK, UNDO, compensation_history
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

APPROVERS = ("alice", "bob")
# who may ask for a decision: create actions, and the approve verb on the namespace's runs
DECIDER_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["flowforge.io"],
        "resources": ["workflowrunactions"],
        "verbs": ["create", "get"],
    },
    {"apiGroups": ["flowforge.io"], "resources": ["workflowruns"], "verbs": ["approve"]},
]


def gated(workflow: str, *, approval: dict[str, Any]) -> dict[str, Any]:
    return {
        "workflow": workflow,
        "version": 1,
        "taskTypes": {"ok": OK, "undo": UNDO},
        "tasks": [
            {"key": "build", "type": "ok"},
            {"key": "stage", "type": "ok", "dependsOn": ["build"]},
            {"key": "approve-prod", "dependsOn": ["stage"], "approval": approval},
            {"key": "deploy", "type": "ok", "dependsOn": ["approve-prod"]},
            {"key": "unbuild", "type": "undo", "compensateFor": "build"},
            {"key": "unstage", "type": "undo", "compensateFor": "stage"},
        ],
    }


def decide(
    cluster: Cluster, driver: RunDriver, name: str, *, user: str, spec: dict[str, Any]
) -> Any:
    """`kubectl apply --as USER` of a WorkflowRunAction; the completed process."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": driver.namespace},
        "spec": spec,
    }
    return kubectl(
        cluster,
        "apply",
        *(["--as", user] if user else []),
        "-f",
        "-",
        stdin=yaml.safe_dump(document),
        check=False,
    )


async def gate_state(driver: RunDriver, run: str) -> tuple[str, str | None]:
    body = driver.run(run)
    stored = await find_run(
        driver.pool, namespace=driver.namespace, name=run, uid=body["metadata"]["uid"]
    )
    (gate,) = [t for t in await list_tasks(driver.pool, stored.id) if t.task_key == "approve-prod"]
    return gate.state, gate.last_error


def condition(driver: RunDriver, run: str, kind: str) -> dict[str, Any] | None:
    conditions = (driver.run(run).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


async def test_two_approvers_pass_a_gate_the_creator_and_a_user_without_the_verb_do_not(
    cluster: Cluster,
    store_webhooks: WebhookServer,  # noqa: F811
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    for user in APPROVERS:
        grant(cluster, driver.namespace, role=f"decider-{user}", rules=DECIDER_RULES, subject=user)
    grant(
        cluster,
        driver.namespace,
        role="actions-only",
        rules=DECIDER_RULES[:1],
        subject="mallory",
    )
    whoami = json.loads(kubectl(cluster, "auth", "whoami", "-o", "json").stdout)
    creator = whoami["status"]["userInfo"]["username"]
    approval = {"approvers": {"users": [*APPROVERS, creator]}, "required": 2, "forbidSelf": True}
    await driver.publish(gated("release", approval=approval))
    driver.create_run("release-1", workflow="release")
    assert driver.run("release-1")["metadata"]["annotations"][REQUESTED_BY_ANNOTATION] == creator
    waiting = await wait_until(
        lambda: condition(driver, "release-1", "AwaitingApproval"),
        timeout=60,
        what="the gate to await approval",
        operator=operator,
    )
    assert "approve-prod" in waiting["message"]
    assert "awaiting approval" in driver.run("release-1")["status"]["progress"]
    assert "approve-prod" not in {
        j.metadata.labels["flowforge.io/task"] for j in driver.jobs("release-1")
    }

    approve = {"run": "release-1", "action": "Approve", "task": "approve-prod"}
    own = decide(cluster, driver, "by-creator", user="", spec=approve)
    assert own.returncode == 0, own.stderr
    refused = await processed(driver, "by-creator", operator)
    assert (
        refused["result"] == "Refused" and "forbids approving one's own run" in refused["message"]
    )
    no_verb = decide(cluster, driver, "by-mallory", user="mallory", spec=approve)
    assert no_verb.returncode != 0 and "approve" in no_verb.stderr
    assert decide(cluster, driver, "by-alice", user="alice", spec=approve).returncode == 0
    first = await processed(driver, "by-alice", operator)
    assert (first["result"], first["actor"]["username"]) == ("Accepted", "alice")
    assert "approval 1 of 2" in first["message"]
    assert (await gate_state(driver, "release-1"))[0] == "awaiting"
    assert driver.run("release-1")["status"]["phase"] == "Running"

    assert decide(cluster, driver, "by-bob", user="bob", spec=approve).returncode == 0
    second = await processed(driver, "by-bob", operator)

    assert second["result"] == "Accepted" and "approved (alice, bob)" in second["message"]
    await driver.wait_phase("release-1", {"Succeeded"}, timeout=60, operator=operator)
    assert (await gate_state(driver, "release-1"))[0] == "succeeded"
    assert condition(driver, "release-1", "AwaitingApproval") is None


async def test_a_rejection_and_a_timeout_fail_the_gate_and_roll_the_run_back(
    cluster: Cluster,
    store_webhooks: WebhookServer,  # noqa: F811
    operator: OperatorProcess,
    driver: RunDriver,
) -> None:
    grant(cluster, driver.namespace, role="decider", rules=DECIDER_RULES, subject="alice")
    await driver.publish(gated("rejected", approval={"approvers": {"users": ["alice"]}}))
    await driver.publish(gated("timed", approval={"timeoutSeconds": 5}))
    driver.create_run("rejected-1", workflow="rejected")
    driver.create_run("timed-1", workflow="timed")
    await wait_until(
        lambda: condition(driver, "rejected-1", "AwaitingApproval"),
        timeout=60,
        what="the gate to await approval",
        operator=operator,
    )

    reject = {
        "run": "rejected-1",
        "action": "Reject",
        "task": "approve-prod",
        "reason": "prod is frozen",
    }
    assert decide(cluster, driver, "reject-1", user="alice", spec=reject).returncode == 0
    assert (await processed(driver, "reject-1", operator))["result"] == "Accepted"

    await driver.wait_phase("rejected-1", {"Failed"}, timeout=90, operator=operator)
    state, error = await gate_state(driver, "rejected-1")
    assert (state, error) == ("failed", "Rejected: rejected by alice: prod is frozen")
    # undone in reverse order: stage's work first, then build's
    assert [task for kind, task in await compensation_history(driver, "rejected-1")] == [
        "unstage",
        "unstage",
        "unbuild",
        "unbuild",
    ]
    await driver.wait_phase("timed-1", {"Failed"}, timeout=90, operator=operator)
    state, error = await gate_state(driver, "timed-1")
    assert state == "failed" and error is not None and error.startswith("ApprovalTimedOut")
    failed = condition(driver, "timed-1", "Failed")
    assert failed is not None and "approve-prod" in failed["message"]
    assert [task for kind, task in await compensation_history(driver, "timed-1")][::2] == [
        "unstage",
        "unbuild",
    ]
