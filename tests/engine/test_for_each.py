"""``forEach`` in the engine (``domain/for_each.py``): each item's Job carries its item
(``FLOWFORGE_ITEM``, ``FLOWFORGE_ITEM_KEY``, the run's files), retries on its own, and the
dependent starts once, after every item."""

from __future__ import annotations

import json
from typing import Any

from flowforge.domain.execution import config_map_name
from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.kube.jobs import LABEL_ITEM, JobIdentity
from tests.engine.conftest import NAMESPACE, Harness, task_of_job
from tests.support.waiting import wait_until


def env_of(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {entry["name"]: entry.get("value", "") for entry in container["env"]}


def jobs_by_task(harness: Harness) -> dict[str, dict[str, Any]]:
    return {task_of_job(job): job for job in harness.kube.jobs.values()}


DEPLOY: list[dict[str, Any]] = [
    {
        "key": "deploy",
        "retries": 1,
        "config": {"image": "v2"},
        "forEach": {"items": [{"region": "eu"}, {"region": "us", "size": 3}], "key": "region"},
    },
    {"key": "verify", "dependsOn": ["deploy"]},
]


async def test_each_item_runs_in_its_own_job_with_its_item(harness: Harness) -> None:
    run = await harness.start("fan", DEPLOY)
    await harness.settle_background()
    jobs = jobs_by_task(harness)
    assert set(jobs) == {"deploy[eu]", "deploy[us]"}
    us = jobs["deploy[us]"]
    env = env_of(us)
    assert json.loads(env["FLOWFORGE_ITEM"]) == {"region": "us", "size": 3}
    assert env["FLOWFORGE_ITEM_KEY"] == "us"
    assert env["FLOWFORGE_TASK"] == "deploy[us]"
    assert us["metadata"]["labels"][LABEL_ITEM] == "us"
    identity = JobIdentity.of(us)
    assert identity is not None and identity.task_key == "deploy[us]"
    # the run's files: the task's config, and its items by key
    (volume,) = us["spec"]["template"]["spec"]["volumes"]
    files = {item["path"]: item["key"] for item in volume["configMap"]["items"]}
    assert files["config.json"] == "config.deploy.json"
    body = harness.kube.runs[(NAMESPACE, "fan")]["metadata"]
    data = harness.kube.config_maps[
        (NAMESPACE, config_map_name(run_name=body["name"], run_uid=body["uid"]))
    ]["data"]
    assert json.loads(data[files["items.json"]]) == {
        "eu": {"region": "eu"},
        "us": {"region": "us", "size": 3},
    }
    # each item retries on its own; the dependent waits for both
    await harness.finish("deploy[eu]")
    await harness.finish("deploy[us]", succeeded=False)
    await harness.settle_background()
    assert "verify" not in jobs_by_task(harness)
    states = await harness.states(run)
    assert states["deploy[us]"] in (TaskState.READY, TaskState.RUNNING)
    # the backoff (0.05 s) wakes the run up and the second attempt's Job is created
    await wait_until(
        lambda: any("-deploy-us-2-" in name for name in harness.kube.created),
        what="attempt 2's Job",
    )
    await harness.finish("deploy[us]", attempt=2)
    await harness.finish("verify")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    created = [task_of_job(job) for job in harness.kube.jobs.values()]
    assert created.count("verify") == 1


async def test_max_parallel_runs_at_most_that_many_items_and_the_dependent_once(
    harness: Harness,
) -> None:
    regions = ["r1", "r2", "r3", "r4", "r5", "r6"]
    run = await harness.start(
        "capped",
        [
            {"key": "migrate"},
            {
                "key": "deploy",
                "dependsOn": ["migrate"],
                "forEach": {"items": regions, "maxParallel": 2},
            },
            {"key": "verify", "dependsOn": ["deploy"]},
        ],
    )
    await harness.finish("migrate")  # releases all six: the hot path starts none itself
    finished: list[str] = []
    most = 0
    while len(finished) < len(regions):
        await harness.settle_background()
        alive = [
            task_of_job(job)
            for job in harness.kube.jobs.values()
            if not job["status"] and task_of_job(job).startswith("deploy[")
        ]
        most = max(most, len(alive))
        assert alive, f"no item runs, {len(finished)} finished"
        assert "verify" not in jobs_by_task(harness)
        await harness.finish(sorted(alive)[0])
        finished.append(sorted(alive)[0])
    assert most == 2
    assert finished == [f"deploy[{region}]" for region in regions]  # in item order
    await wait_until(lambda: "verify" in jobs_by_task(harness), what="verify's Job")
    await harness.finish("verify")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    assert [task_of_job(job) for job in harness.kube.jobs.values()].count("verify") == 1


ITEMS = ["eu", "us", "ap", "sa"]


def undo_saga(**for_each: Any) -> list[dict[str, Any]]:
    """prepare -> deploy (per item) -> verify; undo-prepare, undo-deploy compensate."""
    return [
        {"key": "prepare"},
        {"key": "deploy", "dependsOn": ["prepare"], "forEach": {"items": ITEMS, **for_each}},
        {"key": "verify", "dependsOn": ["deploy"]},
        {"key": "undo-prepare", "compensateFor": "prepare"},
        {"key": "undo-deploy", "compensateFor": "deploy"},
    ]


async def undo_all(harness: Harness) -> list[tuple[str, str]]:
    """Finish each compensator Job as it comes, one at a time; the (task, item key) of each."""
    ran: list[tuple[str, str]] = []
    while True:
        await harness.settle_background()
        active = harness.kube.active()
        if not active:
            return ran
        assert len(active) == 1, f"one compensator at a time: {active}"
        job = next(job for (_, name), job in harness.kube.jobs.items() if name == active[0])
        ran.append((task_of_job(job), env_of(job).get("FLOWFORGE_ITEM_KEY", "")))
        await harness.finish(task_of_job(job))


async def test_each_item_that_succeeded_is_undone_with_its_item_last_completed_first(
    harness: Harness,
) -> None:
    run = await harness.start("undo", undo_saga())
    await harness.finish("prepare")
    for key in ("ap", "sa", "eu"):  # their completion order
        await harness.finish(f"deploy[{key}]")
    await harness.finish("deploy[us]", succeeded=False)
    assert await undo_all(harness) == [
        ("undo-deploy[eu]", "eu"),
        ("undo-deploy[sa]", "sa"),
        ("undo-deploy[ap]", "ap"),
        ("undo-prepare", ""),
    ]
    states = await harness.states(run)
    assert states["undo-deploy[us]"] == CompensationState.SKIPPED  # a failed item is not undone
    assert states["verify"] == TaskState.SKIPPED
    assert (await harness.run(run)).phase is RunPhase.FAILED


async def test_within_tolerate_failures_the_task_succeeds_with_a_partial_failure(
    harness: Harness,
) -> None:
    run = await harness.start("tolerant", undo_saga(tolerateFailures=1))
    await harness.finish("prepare")
    await harness.finish("deploy[eu]")
    await harness.finish("deploy[us]", succeeded=False)
    await harness.finish("deploy[ap]")
    assert "verify" not in jobs_by_task(harness)  # sa still runs
    await harness.finish("deploy[sa]")
    await wait_until(lambda: "verify" in jobs_by_task(harness), what="verify's Job")
    await harness.finish("verify")
    assert (await harness.run(run)).phase is RunPhase.SUCCEEDED
    states = await harness.states(run)
    assert states["deploy[us]"] == TaskState.FAILED
    assert states["undo-deploy[eu]"] == CompensationState.NOT_TRIGGERED  # nothing undone
    assert "PartialFailure" in harness.kube.reasons()
    await wait_until(
        lambda: any(
            condition["type"] == "PartialFailure" and condition["status"] == "True"
            for condition in harness.kube.runs[(NAMESPACE, "tolerant")]
            .get("status", {})
            .get("conditions", [])
        ),
        what="the run's PartialFailure condition",
    )


async def test_past_tolerate_failures_no_item_starts_the_running_stop_and_the_run_fails(
    harness: Harness,
) -> None:
    run = await harness.start("intolerant", undo_saga(maxParallel=2, tolerateFailures="25%"))
    await harness.finish("prepare")
    assert sorted(jobs_by_task(harness)) == ["deploy[eu]", "deploy[us]", "prepare"]
    await harness.finish("deploy[eu]", succeeded=False)  # 1 of 4: within 25 %
    await harness.settle_background()
    assert "deploy[ap]" in jobs_by_task(harness)  # its slot went to the next item
    await harness.finish("deploy[us]", succeeded=False)  # 2 of 4: past it
    await harness.settle_background()
    states = await harness.states(run)
    assert states["deploy[ap]"] == states["deploy[sa]"] == TaskState.CANCELLED
    assert "deploy[sa]" not in jobs_by_task(harness)  # never started
    assert harness.job_of_created("deploy-ap") in harness.kube.deleted  # stopped
    assert states["verify"] == TaskState.SKIPPED
    assert await undo_all(harness) == [("undo-prepare", "")]
    assert (await harness.run(run)).phase is RunPhase.FAILED
    assert "ItemsStopped" in harness.kube.reasons()
