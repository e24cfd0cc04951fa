"""The saga rollback on the real control plane: compensators' Jobs one at a time, in
reverse dependency order, durable across an operator SIGKILL."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from flowforge.domain.api import FORCE_DELETE_ANNOTATION, GROUP, RUN_PLURAL, VERSION
from flowforge.domain.validation import parse_definition
from flowforge.store.connection import Pool
from flowforge.store.queries import list_tasks
from flowforge.store.runs import RunRecord, find_run
from tests.plugins.operator import JobCreationLog, OperatorProcess, RunDriver, wait_for_leader
from tests.support.sagas import (
    FAIL,
    OK,  # noqa: F401 (test_run_actions.py imports it from here)
    ORDER_SAGA,
    QUICK,
    REFUND_THEN_RELEASE,
    SLOW,
    UNDO,
    compensation_history,
    compensation_jobs,
    compensator_states,
    condition,
    history,
    started_order,
    steps,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cluster

FINISHED = {"Succeeded", "Failed", "Cancelled"}


async def test_refund_then_release_run_one_at_a_time_and_the_run_ends_failed(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(ORDER_SAGA)
    driver.create_run("o1", workflow="order")
    # while the rollback runs, the run is still running and kubectl shows it compensating
    rolling = await wait_until(
        lambda: (
            "compensating" in (driver.printer_row("o1").get("Progress") or "")
            and driver.printer_row("o1")
        ),
        timeout=90,
        what="the rollback to show in kubectl get wfr",
        operator=operator,
    )
    assert rolling["Phase"] == "Running", rolling
    during = driver.run("o1")["status"]
    assert during["compensation"]["active"] is True
    assert condition({"status": during}, "Compensating")["status"] == "True"

    body = await driver.wait_phase("o1", FINISHED, operator=operator)
    assert body["status"]["phase"] == "Failed", body["status"]
    assert steps(body) == [("refund", "charge", "succeeded"), ("release", "reserve", "succeeded")]
    assert body["status"]["compensation"]["active"] is False
    assert "compensating" not in body["status"]["progress"]
    compensating = condition(body, "Compensating")
    assert (compensating["status"], compensating["reason"]) == ("False", "RolledBack")
    assert condition(body, "CompensationFailed")["status"] == "False"

    jobs = compensation_jobs(driver, "o1")
    assert [job.metadata.labels["flowforge.io/task"] for job in jobs] == ["refund", "release"]
    assert all(job.metadata.name.startswith("o1-c-") for job in jobs)
    refund, release = jobs
    # one at a time: release's Job exists only after refund's Pod succeeded (second
    # resolution; its Job says so about a second later)
    assert refund.status.completion_time is not None and release.status.start_time is not None
    assert release.metadata.creation_timestamp >= driver.pod_finished(refund)
    assert release.status.start_time >= driver.pod_finished(refund)
    # ... and to the microsecond in the history: started, succeeded, started, succeeded
    assert await compensation_history(driver, "o1") == REFUND_THEN_RELEASE
    reasons = [event.reason for event in driver.events("o1")]
    assert {"RollbackStarted", "CompensationStarted", "CompensationSucceeded", "RunFailed"} <= set(
        reasons
    )
    assert reasons.count("CompensationStarted") == 2


WIDE_SAGA: dict[str, Any] = {
    "workflow": "wide",
    "version": 1,
    "taskTypes": {"quick": QUICK, "fail": FAIL},
    "tasks": [
        {"key": "prepare", "type": "quick"},
        {"key": "left-a", "type": "quick", "dependsOn": ["prepare"]},
        {"key": "left-b", "type": "quick", "dependsOn": ["left-a"]},
        {"key": "right", "type": "quick", "dependsOn": ["prepare"]},
        {"key": "side", "type": "quick"},
        {"key": "join", "type": "quick", "dependsOn": ["left-b", "right"]},
        {"key": "boom", "type": "fail", "dependsOn": ["join"]},
        {"key": "never", "type": "quick", "dependsOn": ["boom"]},
        # declared in no particular order: the rollback order comes from the graph
        {"key": "undo-side", "type": "quick", "compensateFor": "side"},
        {"key": "undo-prepare", "type": "quick", "compensateFor": "prepare"},
        {"key": "undo-join", "type": "quick", "compensateFor": "join"},
        {"key": "undo-left-a", "type": "quick", "compensateFor": "left-a"},
        {"key": "undo-right", "type": "quick", "compensateFor": "right"},
        {"key": "undo-left-b", "type": "quick", "compensateFor": "left-b"},
        {"key": "undo-boom", "type": "quick", "compensateFor": "boom"},
        {"key": "undo-never", "type": "quick", "compensateFor": "never"},
    ],
}


async def test_a_wide_dag_rolls_back_in_reverse_dependency_order_on_every_run(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(WIDE_SAGA)
    spec = parse_definition(WIDE_SAGA)
    succeeded = {"prepare", "left-a", "left-b", "right", "side", "join"}
    expected = list(
        spec.graph.compensation_order(
            succeeded, {key: task.key for key, task in spec.compensators.items()}
        )
    )
    assert (
        expected.index("undo-join")
        < expected.index("undo-left-b")
        < expected.index("undo-left-a")
        < expected.index("undo-prepare")
    )
    assert expected.index("undo-right") < expected.index("undo-prepare")

    orders = []
    for name in ("w1", "w2"):
        driver.create_run(name, workflow="wide")
        body = await driver.wait_phase(name, FINISHED, operator=operator, timeout=120)
        assert body["status"]["phase"] == "Failed", body["status"]
        assert [step[0] for step in steps(body)] == expected
        assert {step[2] for step in steps(body)} == {"succeeded"}
        order = started_order(await history(driver, name))
        assert order == expected
        jobs = {
            job.metadata.labels["flowforge.io/task"]: job for job in compensation_jobs(driver, name)
        }
        assert set(jobs) == set(expected)
        # one at a time, in the rollback's order (not the Jobs' whole-second creation times,
        # which tie)
        for earlier, later in itertools.pairwise(expected):
            assert jobs[later].metadata.creation_timestamp >= driver.pod_finished(jobs[earlier])
        states = await compensator_states(driver.pool, driver, name)
        # the failed task and the one it skipped are not compensated
        assert states["undo-boom"] == "skipped" and states["undo-never"] == "skipped"
        orders.append(order)
    assert orders[0] == orders[1]


async def test_a_failing_compensator_halts_the_rollback_and_the_condition_names_it(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "halt",
            "version": 1,
            "taskTypes": {"quick": QUICK, "fail": FAIL},
            "tasks": [
                {"key": "a", "type": "quick"},
                {"key": "b", "type": "quick", "dependsOn": ["a"]},
                {"key": "c", "type": "quick", "dependsOn": ["b"]},
                {"key": "d", "type": "fail", "dependsOn": ["c"]},
                {"key": "undo-a", "type": "quick", "compensateFor": "a"},
                {
                    "key": "undo-b",
                    "type": "fail",
                    "compensateFor": "b",
                    "retries": 1,
                    "timeoutSeconds": 30,
                },
                {"key": "undo-c", "type": "quick", "compensateFor": "c"},
            ],
        }
    )
    driver.create_run("h1", workflow="halt")
    body = await driver.wait_phase("h1", FINISHED, operator=operator, timeout=120)
    assert body["status"]["phase"] == "Failed", body["status"]
    assert steps(body) == [
        ("undo-c", "c", "succeeded"),
        ("undo-b", "b", "failed"),
        ("undo-a", "a", "skipped"),
    ]
    failed = condition(body, "CompensationFailed")
    assert (failed["status"], failed["reason"]) == ("True", "CompensatorFailed")
    assert "undo-b" in failed["message"] and "undo-a" in failed["message"], failed
    assert "undo-b" in body["status"]["message"]
    compensating = condition(body, "Compensating")
    assert (compensating["status"], compensating["reason"]) == ("False", "CompensationFailed")

    jobs = compensation_jobs(driver, "h1")
    # undo-b honours its retries (a new Job per attempt) and its timeout; undo-a never runs
    assert [
        (job.metadata.labels["flowforge.io/task"], job.metadata.labels["flowforge.io/attempt"])
        for job in jobs
    ] == [("undo-c", "1"), ("undo-b", "1"), ("undo-b", "2")]
    assert {
        job.spec.active_deadline_seconds
        for job in jobs
        if job.metadata.labels["flowforge.io/task"] == "undo-b"
    } == {30}
    reasons = {event.reason for event in driver.events("h1")}
    assert {"CompensationRetrying", "CompensationFailed", "RunFailed"} <= reasons


async def test_a_succeeded_run_is_never_compensated_and_cancel_rolls_back(
    operator: OperatorProcess, driver: RunDriver
) -> None:
    await driver.publish(
        {
            "workflow": "fine",
            "version": 1,
            "taskTypes": {"quick": QUICK},
            "tasks": [
                {"key": "a", "type": "quick"},
                {"key": "b", "type": "quick", "dependsOn": ["a"]},
                {"key": "undo-a", "type": "quick", "compensateFor": "a"},
                {"key": "undo-b", "type": "quick", "compensateFor": "b"},
            ],
        }
    )
    driver.create_run("ok1", workflow="fine")
    body = await driver.wait_phase("ok1", FINISHED, operator=operator)
    assert body["status"]["phase"] == "Succeeded"
    assert compensation_jobs(driver, "ok1") == []
    assert "compensation" not in body["status"]
    assert set((await compensator_states(driver.pool, driver, "ok1")).values()) == {"not_triggered"}

    await driver.publish(
        {
            "workflow": "stoppable",
            "version": 1,
            "taskTypes": {"quick": QUICK, "slow": SLOW},
            "tasks": [
                {"key": "a", "type": "quick"},
                {"key": "b", "type": "slow", "dependsOn": ["a"]},
                {"key": "c", "type": "quick", "dependsOn": ["b"]},
                {"key": "undo-a", "type": "quick", "compensateFor": "a"},
                {"key": "undo-b", "type": "quick", "compensateFor": "b"},
                {"key": "undo-c", "type": "quick", "compensateFor": "c"},
            ],
        }
    )
    driver.create_run("c1", workflow="stoppable")
    await wait_until(
        lambda: any(job.metadata.labels["flowforge.io/task"] == "b" for job in driver.jobs("c1")),
        timeout=60,
        what="b's Job",
        operator=operator,
    )
    assert compensation_jobs(driver, "c1") == []  # never while the run goes forward
    driver.cancel("c1")
    body = await driver.wait_phase("c1", FINISHED, operator=operator)
    assert body["status"]["phase"] == "Cancelled", body["status"]
    assert steps(body) == [("undo-a", "a", "succeeded")]
    assert [
        job.metadata.labels["flowforge.io/task"] for job in compensation_jobs(driver, "c1")
    ] == ["undo-a"]
    assert not [job for job in driver.jobs("c1") if job.metadata.labels["flowforge.io/task"] == "b"]
    kinds = [(event.kind, event.task_key) for event in await history(driver, "c1")]
    assert kinds.index(("task.cancelled", "b")) < kinds.index(("compensation.started", "undo-a"))
    assert condition(body, "Cancelled")["status"] == "True"


async def test_a_rollback_interrupted_by_sigkill_finishes_after_restart_exactly_once(
    operator: OperatorProcess, driver: RunDriver, engine_store: Pool
) -> None:
    spec = {
        "workflow": "crashy",
        "version": 1,
        "taskTypes": {"quick": QUICK, "undo": UNDO, "fail": FAIL},
        "tasks": [
            {"key": "one", "type": "quick"},
            {"key": "two", "type": "quick", "dependsOn": ["one"]},
            {"key": "three", "type": "quick", "dependsOn": ["two"]},
            {"key": "four", "type": "fail", "dependsOn": ["three"]},
            {"key": "undo-one", "type": "undo", "compensateFor": "one"},
            {"key": "undo-two", "type": "undo", "compensateFor": "two"},
            {"key": "undo-three", "type": "undo", "compensateFor": "three"},
        ],
    }
    await driver.publish(spec)
    log = JobCreationLog(driver.api, driver.namespace)
    try:
        driver.create_run("k1", workflow="crashy")

        async def second_running() -> bool:
            # running in the store, and its Job made (the store moves first): killed before
            # the Job exists, nothing would ever finish it
            states = await compensator_states(engine_store, driver, "k1")
            return states.get("undo-two") == "running" and any(
                job.metadata.labels["flowforge.io/task"] == "undo-two" for job in driver.jobs("k1")
            )

        await wait_until(
            second_running,
            timeout=90,
            interval=0.1,  # its Job runs 2 s: the kill must come before it ends
            what="undo-two running, its Job made",
            operator=operator,
        )
        operator.kill()

        def undo_two_finished() -> bool:
            return any(
                job.metadata.labels["flowforge.io/task"] == "undo-two"
                and job.status is not None
                and (job.status.succeeded or job.status.failed)
                for job in driver.jobs("k1")
            )

        # undo-two's Job finishes while no operator is watching
        await wait_until(undo_two_finished, timeout=60, what="undo-two's Job to finish")
        operator.start()
        await wait_for_leader(engine_store, operator.identity, process=operator)
        body = await driver.wait_phase("k1", FINISHED, operator=operator, timeout=120)
    finally:
        log.close()
    assert body["status"]["phase"] == "Failed", body["status"]
    expected = ["undo-three", "undo-two", "undo-one"]
    assert steps(body) == [
        ("undo-three", "three", "succeeded"),
        ("undo-two", "two", "succeeded"),
        ("undo-one", "one", "succeeded"),
    ]
    events = await history(driver, "k1")
    assert started_order(events) == expected
    epoch = {(event.kind, event.task_key): event.epoch for event in events}
    # undo-two was started by the killed operator and recorded by the restarted one
    assert epoch[("compensation.started", "undo-two")] is not None
    assert epoch[("compensation.succeeded", "undo-two")] is not None
    assert (
        epoch[("compensation.started", "undo-two")] < epoch[("compensation.succeeded", "undo-two")]
    )
    created = {
        name: labels
        for name, labels in log.labels_by_name.items()
        if labels.get("flowforge.io/run") == "k1"
        and labels.get("flowforge.io/role") == "compensation"
    }
    assert sorted(
        (labels["flowforge.io/task"], labels["flowforge.io/attempt"]) for labels in created.values()
    ) == sorted((key, "1") for key in expected)
    duplicates = {name: uids for name, uids in log.uids_by_name.items() if len(uids) > 1}
    assert not duplicates, duplicates


async def test_a_forced_deletion_during_its_rollback_ends_it_cancelled_in_the_store(
    operator: OperatorProcess, driver: RunDriver, engine_store: Pool
) -> None:
    await driver.publish(
        {
            "workflow": "gone",
            "version": 1,
            "taskTypes": {"quick": QUICK, "slow": SLOW, "fail": FAIL},
            "tasks": [
                {"key": "a", "type": "quick"},
                {"key": "b", "type": "quick", "dependsOn": ["a"]},
                {"key": "c", "type": "fail", "dependsOn": ["b"]},
                {"key": "undo-a", "type": "quick", "compensateFor": "a"},
                {"key": "undo-b", "type": "slow", "compensateFor": "b"},
            ],
        }
    )
    body = driver.create_run("g1", workflow="gone")
    uid = body["metadata"]["uid"]

    async def undo_b_running() -> bool:
        return (await compensator_states(engine_store, driver, "g1")).get("undo-b") == "running"

    await wait_until(undo_b_running, timeout=90, what="undo-b running", operator=operator)
    # annotated before it is deleted: the deletion skips the rollback (test_run_deletion.py
    # has the deletion that waits for it); with the WorkflowRun gone its Jobs go too
    driver.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        driver.namespace,
        RUN_PLURAL,
        "g1",
        {"metadata": {"annotations": {FORCE_DELETE_ANNOTATION: "true"}}},
    )
    driver.delete_run("g1")

    async def finished() -> RunRecord | None:
        run = await find_run(engine_store, namespace=driver.namespace, name="g1", uid=uid)
        return run if run.finished_at is not None else None

    run = await wait_until(finished, timeout=90, what="g1 finished in the store", operator=operator)
    assert str(run.phase) == "Cancelled"
    tasks = {task.task_key: str(task.state) for task in await list_tasks(engine_store, run.id)}
    assert (tasks["undo-b"], tasks["undo-a"]) == ("skipped", "skipped")


async def test_a_vanished_compensation_job_is_a_lost_attempt_and_retried(
    operator: OperatorProcess, driver: RunDriver, engine_store: Pool
) -> None:
    await driver.publish(
        {
            "workflow": "vanish",
            "version": 1,
            "taskTypes": {"quick": QUICK, "undo": UNDO, "fail": FAIL},
            "tasks": [
                {"key": "a", "type": "quick"},
                {"key": "b", "type": "fail", "dependsOn": ["a"]},
                {"key": "undo-a", "type": "undo", "compensateFor": "a", "retries": 1},
            ],
        }
    )
    driver.create_run("v1", workflow="vanish")
    first = await wait_until(
        lambda: next(
            (
                job
                for job in compensation_jobs(driver, "v1")
                if job.metadata.labels["flowforge.io/attempt"] == "1"
            ),
            None,
        ),
        timeout=60,
        what="undo-a's first Job",
        operator=operator,
    )
    driver.batch.delete_namespaced_job(
        first.metadata.name, driver.namespace, propagation_policy="Background"
    )
    body = await driver.wait_phase("v1", FINISHED, operator=operator)
    assert body["status"]["phase"] == "Failed", body["status"]
    step = body["status"]["compensation"]["steps"][0]
    assert (step["name"], step["state"], step["attempt"]) == ("undo-a", "succeeded", 2)
    retried = [
        event
        for event in await history(driver, "v1")
        if event.kind == "compensation.attempt_failed"
    ]
    assert [event.attempt for event in retried] == [1]
    assert retried[0].detail["reason"] == "JobVanished"
    assert "vanished" in retried[0].detail["message"]
