"""The operations CLI against real runs: get/describe, graph RUN, cancel, retry, logs, doctor.

Runs are driven to their end by the operator (a subprocess) on the local control plane; the
CLI is called in-process as a user would call it, with --dsn, --kubeconfig and -n.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from flowforge.cli.main import main
from flowforge.cli.output import EXIT_UNAVAILABLE
from flowforge.domain.states import RunPhase, TaskState
from flowforge.kube.webhook_config import delete_webhook_configurations
from flowforge.localdev.controlplane import Cluster
from tests.plugins.operator import OperatorProcess, RunDriver
from tests.plugins.webhooks import WebhookServer
from tests.support.waiting import wait_until
from tests.tools.mermaid_parser import parse_mermaid

pytestmark = pytest.mark.cluster

OK = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "1s"}}
FAIL = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-exit-code": "3"}}
SLOW = {"image": "busybox:1.36", "annotations": {"flowforge.io/simulate-duration": "60s"}}
FINISHED = {str(phase) for phase in (RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED)}

# c fails: d is skipped, a and b succeeded
FAILING_DIAMOND: dict[str, Any] = {
    "workflow": "diamond",
    "version": 1,
    "taskTypes": {"ok": OK, "fail": FAIL},
    "tasks": [
        {"key": "a", "type": "ok"},
        {"key": "b", "type": "ok", "dependsOn": ["a"]},
        {"key": "c", "type": "fail", "dependsOn": ["a"]},
        {"key": "d", "type": "ok", "dependsOn": ["b", "c"]},
    ],
}
# verify fails: deploy is undone; provision (no compensator) still stands
FAILING_SAGA: dict[str, Any] = {
    "workflow": "saga",
    "version": 1,
    "taskTypes": {"ok": OK, "fail": FAIL},
    "tasks": [
        {"key": "provision", "type": "ok"},
        {"key": "deploy", "type": "ok", "dependsOn": ["provision"]},
        {"key": "verify", "type": "fail", "dependsOn": ["deploy"]},
        {"key": "undeploy", "type": "ok", "compensateFor": "deploy"},
    ],
}


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


CliRunner = Callable[..., Awaitable[Result]]


@pytest.fixture
def cli(
    cluster: Cluster, store_dsn: str, engine_namespace: str, capsys: pytest.CaptureFixture[str]
) -> CliRunner:
    """``flowforge ARGS --dsn ... --kubeconfig ... -n NS`` in a thread (the CLI runs its own
    event loop), with its exit code and output."""

    async def run(*argv: str, namespace: bool = True) -> Result:
        options = ["--kubeconfig", str(cluster.kubeconfig)]
        if namespace:
            options += ["-n", engine_namespace]
        capsys.readouterr()
        code = await asyncio.to_thread(main, [*argv, *options])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def _job_tasks(driver: RunDriver, run: str) -> set[str]:
    return {job.metadata.labels["flowforge.io/task"] for job in driver.jobs(run)}


async def test_list_show_graph_logs_and_retry_of_a_failed_diamond(
    operator: OperatorProcess, driver: RunDriver, cli: CliRunner, store_dsn: str
) -> None:
    dsn = ["--dsn", store_dsn]
    await driver.publish(FAILING_DIAMOND)
    driver.create_run("d1", workflow="diamond", parameters={"date": "2026-11-30"})
    await driver.wait_phase("d1", FINISHED, operator=operator)

    listed = await cli("get", "runs", *dsn, "-o", "json")
    assert listed.code == 0, listed.err
    assert [(run["name"], run["phase"], run["progress"]) for run in listed.json()] == [
        ("d1", RunPhase.FAILED, "2/4")
    ]
    as_yaml = await cli("get", "wfr", *dsn, "-o", "yaml")
    assert as_yaml.code == 0 and as_yaml.out.startswith("- ")
    assert yaml.safe_load(as_yaml.out) == listed.json()
    named = await cli("get", "runs", "d1", *dsn, "-o", "name")
    assert (named.code, named.out) == (0, "workflowrun.flowforge.io/d1\n")
    wide = await cli("get", "runs", *dsn, "-o", "wide")
    assert wide.out.split("\n")[0].split()[-3:] == ["UID", "CREATED", "FINISHED"]
    assert wide.out.split("\n")[1].split()[-3] == listed.json()[0]["uid"]
    table = await cli("get", "runs", *dsn)
    assert table.out.split("\n")[0].split() == [
        "NAME",
        "WORKFLOW",
        "VERSION",
        "PHASE",
        "PROGRESS",
        "AGE",
        "DURATION",
    ]
    assert table.out.split("\n")[1].split()[:5] == ["d1", "diamond", "1", RunPhase.FAILED, "2/4"]
    alias = await cli("runs", "list", *dsn)  # the spelling of before `get runs`
    assert (alias.code, alias.out.split("\n")[0]) == (0, table.out.split("\n")[0])

    shown = (await cli("describe", "run", "d1", *dsn, "-o", "json")).json()
    tasks = {task["key"]: task for task in shown["tasks"]}
    assert {key: task["state"] for key, task in tasks.items()} == {
        "a": TaskState.SUCCEEDED,
        "b": TaskState.SUCCEEDED,
        "c": TaskState.FAILED,
        "d": TaskState.SKIPPED,
    }
    assert tasks["c"]["exitCode"] == 3 and tasks["c"]["reason"]
    assert [attempt["exitCode"] for attempt in tasks["c"]["attempts"]] == [3]
    assert tasks["a"]["durationSeconds"] > 0 and tasks["d"]["attempts"] == []
    assert shown["parameters"] == {"date": "2026-11-30"} and shown["compensation"] == []
    text = (await cli("describe", "run", "d1", *dsn)).out
    assert f"Phase:      {RunPhase.FAILED}" in text
    c_fields = next(line for line in text.splitlines() if line.startswith("c ")).split()
    assert (c_fields[:3], c_fields[4]) == (["c", TaskState.FAILED, "1/1"], "3")  # [3]: duration
    wide_text = (await cli("describe", "run", "d1", *dsn, "-o", "wide")).out
    assert "STARTED" in wide_text and "FINISHED" in wide_text.split("TASK")[1]
    assert (await cli("runs", "show", "d1", *dsn)).out.split("Created")[0] == text.split("Created")[
        0
    ]

    graph = await cli("graph", "d1", *dsn)
    assert graph.code == 0, graph.err
    parsed = parse_mermaid([graph.out])[0]
    assert parsed["ok"], parsed
    classes = {vertex["text"]: vertex["classes"] for vertex in parsed["vertices"]}
    assert set(classes) == {"a (succeeded)", "b (succeeded)", "c (failed)", "d (skipped)"}
    for label, names in classes.items():
        state = label.split("(")[1].rstrip(")")
        assert any(state in name for name in names), (label, names)
        assert any(state in name for name in parsed["classes"]), parsed["classes"]

    # kwok runs no containers: the API has no logs to give, and says so in one line
    logs = await cli("logs", "d1", "c")
    assert logs.code == 1
    assert logs.err.startswith("flowforge logs: c attempt 1 (pod d1-c-1-")
    assert "cannot serve its logs" in logs.err and len(logs.err.splitlines()) == 1
    missing = await cli("logs", "d1", "no-such-task")
    assert missing.code == 1 and "no Pods of run d1 task no-such-task" in missing.err

    retried = await cli("retry", "d1", *dsn)
    assert retried.code == 0, retried.err
    assert "workflowrun.flowforge.io/d1-retry-1 created" in retried.out
    assert "reusing 2 tasks (a, b)" in retried.out
    body = driver.run("d1-retry-1")
    assert body["spec"]["retryOf"] == "d1"
    assert body["spec"]["parameters"] == {"date": "2026-11-30"}
    assert (body["spec"]["workflow"], body["spec"]["version"]) == ("diamond", 1)


async def test_retry_runs_only_what_did_not_succeed(
    operator: OperatorProcess, driver: RunDriver, cli: CliRunner, store_dsn: str
) -> None:
    """Needs the operator to create a retry's rows with ``store.reuse.create_run_reusing``."""
    dsn = ["--dsn", store_dsn]
    await driver.publish(FAILING_DIAMOND)
    driver.create_run("d1", workflow="diamond")
    await driver.wait_phase("d1", FINISHED, operator=operator)
    assert (await cli("retry", "d1", *dsn)).code == 0
    await driver.wait_phase("d1-retry-1", FINISHED, operator=operator)
    # a and b are reused: only c runs again (and fails again, so d is skipped again)
    assert _job_tasks(driver, "d1-retry-1") == {"c"}
    again = (await cli("describe", "run", "d1-retry-1", *dsn, "-o", "json")).json()
    assert again["retryOf"] == "d1"
    assert {task["key"]: task["reusedFrom"] for task in again["tasks"]} == {
        "a": "d1",
        "b": "d1",
        "c": None,
        "d": None,
    }
    second = await cli("retry", "d1-retry-1", *dsn, "-o", "json")
    assert second.json()["metadata"]["name"] == "d1-retry-2", second.err
    assert second.json()["spec"]["retryOf"] == "d1-retry-1"


async def test_cancel_stops_a_run_and_errors_are_one_line(
    operator: OperatorProcess, driver: RunDriver, cli: CliRunner, store_dsn: str
) -> None:
    dsn = ["--dsn", store_dsn]
    await driver.publish(
        {
            "workflow": "slow",
            "version": 1,
            "taskTypes": {"slow": SLOW},
            "tasks": [
                {"key": "wait", "type": "slow"},
                {"key": "after", "type": "slow", "dependsOn": ["wait"]},
            ],
        }
    )
    driver.create_run("s1", workflow="slow")
    await wait_until(lambda: driver.jobs("s1"), timeout=60, what="s1's first Job")
    running = await cli("retry", "s1", *dsn)
    assert running.code == 1 and f"still {RunPhase.RUNNING}" in running.err, running.err

    cancelled = await cli("cancel", "s1")
    assert (cancelled.code, cancelled.out.strip()) == (
        0,
        "workflowrun.flowforge.io/s1 cancel requested",
    )
    again = await cli("cancel", "s1", "-o", "name")
    assert (again.code, again.out) == (0, "workflowrun.flowforge.io/s1\n")
    body = await driver.wait_phase("s1", FINISHED, operator=operator)
    assert body["status"]["phase"] == RunPhase.CANCELLED
    shown = (await cli("describe", "run", "s1", *dsn, "-o", "json")).json()
    assert {task["key"]: task["state"] for task in shown["tasks"]} == {
        "wait": TaskState.CANCELLED,
        "after": TaskState.CANCELLED,
    }

    for argv, expected in [
        (("cancel", "nope"), "flowforge cancel: no WorkflowRun 'nope' in namespace"),
        (("describe", "run", "nope", *dsn), "flowforge describe: no run 'nope' in namespace"),
        (("get", "runs", "nope", *dsn), "flowforge get: no run 'nope' in namespace"),
        (("graph", "nope", *dsn), "flowforge graph: no run 'nope' in namespace"),
        (("retry", "nope", *dsn), "flowforge retry: no run 'nope' in namespace"),
    ]:
        result = await cli(*argv)
        assert result.code == 1 and result.err.startswith(expected), (argv, result.err)
        assert len(result.err.splitlines()) == 1
    no_dsn = await cli("get", "runs")
    assert no_dsn.code == 2 and "pass --dsn, or --admin with FLOWFORGE_DSN set" in no_dsn.err


async def test_show_lists_the_rollback_of_a_failed_saga_and_retry_redoes_it(
    operator: OperatorProcess, driver: RunDriver, cli: CliRunner, store_dsn: str
) -> None:
    dsn = ["--dsn", store_dsn]
    await driver.publish(FAILING_SAGA)
    driver.create_run("saga1", workflow="saga")
    body = await driver.wait_phase("saga1", FINISHED, operator=operator, timeout=120)
    assert body["status"]["phase"] == RunPhase.FAILED
    shown = (await cli("describe", "run", "saga1", *dsn, "-o", "json")).json()
    assert [
        (step["key"], step["compensates"], step["state"]) for step in shown["compensation"]
    ] == [("undeploy", "deploy", TaskState.SUCCEEDED)]
    text = (await cli("describe", "run", "saga1", *dsn)).out
    assert "Compensation (in the order it runs" in text
    assert "undeploy" in text.split("Compensation")[1]

    assert (await cli("retry", "saga1", *dsn)).code == 0
    await driver.wait_phase("saga1-retry-1", FINISHED, operator=operator, timeout=120)
    # provision has no compensator and still stands; deploy was undone: it runs again
    assert "provision" not in _job_tasks(driver, "saga1-retry-1")
    assert {"deploy", "verify"} <= _job_tasks(driver, "saga1-retry-1")


async def test_doctor_is_quiet_when_healthy_and_names_a_missing_webhook_configuration(
    cluster: Cluster,
    flowforge_crds: list[str],
    admission_webhooks: WebhookServer,
    operator: OperatorProcess,
    cli: CliRunner,
    store_dsn: str,
) -> None:
    healthy = await cli("doctor", "--dsn", store_dsn, namespace=False)
    assert healthy.code == 0, healthy.out + healthy.err
    lines = healthy.out.splitlines()
    assert lines and all(line.startswith("ok") for line in lines), healthy.out
    checks = {line.split()[1] for line in lines}
    assert checks == {"cluster", "crds", "store", "lease", "runs", "webhooks"}
    report = (await cli("doctor", "--dsn", store_dsn, "-o", "json", namespace=False)).json()
    assert report["ok"] is True
    as_yaml = await cli("doctor", "--dsn", store_dsn, "-o", "yaml", namespace=False)
    from_yaml = yaml.safe_load(as_yaml.out)  # a second run: messages carry times, checks do not
    assert [(check["check"], check["ok"]) for check in from_yaml["checks"]] == [
        (check["check"], check["ok"]) for check in report["checks"]
    ]

    delete_webhook_configurations(kubeconfig=cluster.kubeconfig)
    broken = await cli("doctor", "--dsn", store_dsn, namespace=False)
    assert broken.code == 1
    failing = [line for line in broken.out.splitlines() if line.startswith("FAIL")]
    assert len(failing) == 2 and all(
        "webhooks" in line and "is missing" in line for line in failing
    ), broken.out
    assert "restart the operator" in broken.out

    operator.stop()
    stopped = await cli("doctor", "--dsn", store_dsn, namespace=False)
    assert stopped.code == 1
    assert any(line.startswith("FAIL  lease") for line in stopped.out.splitlines()), stopped.out


def test_an_unreachable_api_or_store_is_a_system_failure_exiting_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on port 1 of the loopback: the command may work later, so not 1."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: ns}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    assert main(["cancel", "r1", "--kubeconfig", str(kubeconfig)]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert error.startswith("flowforge cancel: cannot reach the Kubernetes API")
    assert len(error.splitlines()) == 1
    store = ["--dsn", "postgresql://flowforge@127.0.0.1:1/flowforge?connect_timeout=2"]
    assert main(["get", "runs", *store, "-n", "ns"]) == EXIT_UNAVAILABLE
    error = capsys.readouterr().err
    assert error.startswith("flowforge get: store: ") and len(error.splitlines()) == 1
