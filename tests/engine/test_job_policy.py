"""The namespace's policy judged again before each Job: a run admitted under a policy that an
admin tightens afterwards gets no Job the policy now refuses (forward attempts, retries and
compensators alike); the attempt fails ``PolicyRefused`` and the run goes on by the usual
failure rules. Against the real store and the Kubernetes fake."""

from __future__ import annotations

from typing import Any

from flowforge.domain.states import CompensationState, RunPhase, TaskState
from flowforge.domain.validation import parse_definition
from flowforge.operator.job_policy import MAX_AGE_SECONDS, NamespacePolicies
from flowforge.operator.runs import RunContext
from flowforge.store.definitions import publish_definition
from flowforge.store.queries import latest_outcomes
from tests.engine.conftest import NAMESPACE, Harness
from tests.support.waiting import wait_until

TRUSTED = "ghcr.io/acme/app:1"
HUB = "busybox:1.36"  # docker.io/library/busybox
OPEN = {"metadata": {"name": "registries"}, "spec": {"registries": ["ghcr.io", "docker.io"]}}
TIGHT = {"metadata": {"name": "registries"}, "spec": {"registries": ["ghcr.io"]}}


async def start(
    harness: Harness, name: str, *, task_types: dict[str, Any], tasks: list[dict[str, Any]]
) -> RunContext:
    """Publish a definition of these task types and tasks, and start a run of it."""
    await publish_definition(
        harness.pool,
        namespace=NAMESPACE,
        definition=parse_definition(
            {"workflow": name, "version": 1, "taskTypes": task_types, "tasks": tasks}
        ),
    )
    body = harness.stored_run(name, workflow=name)
    await harness.engine.start_run(body)
    context = await harness.engine.runs.by_uid(namespace=NAMESPACE, uid=body["metadata"]["uid"])
    assert context is not None
    return context


async def tighten(harness: Harness, *policies: dict[str, Any]) -> None:
    """An admin replaces the namespace's policies; the operator's watch delivers it."""
    harness.kube.policies[NAMESPACE] = list(policies)
    await harness.engine.policy_changed(NAMESPACE)


def images_created(harness: Harness) -> list[str]:
    return [
        container["image"]
        for job in harness.kube.jobs.values()
        for container in [
            *job["spec"]["template"]["spec"]["containers"],
            *job["spec"]["template"]["spec"].get("initContainers", []),
        ]
    ]


async def outcome(harness: Harness, run: RunContext, task_key: str) -> dict[str, Any]:
    return (await latest_outcomes(harness.pool, run.run_id, [task_key]))[task_key]


async def test_a_task_whose_registry_was_removed_after_admission_gets_no_job(
    harness: Harness,
) -> None:
    harness.kube.policies[NAMESPACE] = [OPEN]
    run = await start(
        harness,
        "tightened",
        task_types={"app": {"image": TRUSTED}, "hub": {"image": HUB}},
        tasks=[
            {"key": "first", "type": "app"},
            {"key": "second", "type": "hub", "dependsOn": ["first"], "retries": 1},
        ],
    )
    await tighten(harness, TIGHT)
    await harness.finish("first")

    async def retried_and_failed() -> bool:
        return (await harness.states(run))["second"] == TaskState.FAILED

    await wait_until(retried_and_failed, what="both attempts of second refused")
    assert HUB not in images_created(harness) and len(harness.kube.created) == 1
    refused = await outcome(harness, run, "second")
    assert refused["reason"] == "PolicyRefused"
    assert (
        "spec.taskTypes.hub.image: registry docker.io is not allowed by policy "
        in (refused["message"])
    )
    assert (await harness.run(run)).phase is RunPhase.FAILED
    reasons = harness.kube.reasons()
    assert reasons.count("PolicyRefused") == 2  # the retry was judged again, and refused
    assert "TaskRetrying" in reasons and "TaskFailed" in reasons
    event = next(e for e in harness.kube.events if e.reason == "PolicyRefused")
    assert "task second attempt 1" in event.message and "registry docker.io" in event.message


async def test_a_compensator_the_policy_now_refuses_halts_the_rollback_without_a_job(
    harness: Harness,
) -> None:
    harness.kube.policies[NAMESPACE] = [OPEN]
    run = await start(
        harness,
        "saga",
        task_types={"app": {"image": TRUSTED}, "undo": {"image": HUB}},
        tasks=[
            {"key": "reserve", "type": "app"},
            {"key": "charge", "type": "app", "dependsOn": ["reserve"]},
            {"key": "release", "type": "undo", "compensateFor": "reserve"},
        ],
    )
    await harness.finish("reserve")
    await tighten(harness, TIGHT)
    await harness.finish("charge", succeeded=False)

    assert (await harness.states(run))["release"] == CompensationState.FAILED
    assert not any(role == "compensation" for role, _ in harness.roles_created())
    assert HUB not in images_created(harness)
    refused = await outcome(harness, run, "release")
    assert refused["reason"] == "PolicyRefused"
    assert "spec.taskTypes.undo.image" in refused["message"]
    assert "CompensationFailed" in harness.kube.reasons()
    assert "PolicyRefused" in harness.kube.reasons()


async def test_a_sidecar_image_and_a_kueue_queue_are_judged_at_job_creation_too(
    harness: Harness,
) -> None:
    run = await start(
        harness,
        "sidecar",
        task_types={
            "app": {"image": TRUSTED},
            "proxied": {
                "image": TRUSTED,
                "queueName": "team-b-gpu",
                "initContainers": [{"name": "proxy", "image": HUB, "restartPolicy": "Always"}],
            },
        },
        tasks=[{"key": "first", "type": "app"}, {"key": "second", "type": "proxied"}],
    )
    # the namespace had no policy; now one limits registries and queues
    await tighten(
        harness, {"metadata": {"name": "p"}, "spec": {"registries": ["ghcr.io"], "queues": ["a-*"]}}
    )
    assert len(harness.kube.created) == 2  # created before the policy came
    await harness.finish("first")
    # a later run of the same definition: its tasks are refused before any Job exists
    later = await start(
        harness,
        "sidecar-later",
        task_types={
            "proxied": {
                "image": TRUSTED,
                "queueName": "team-b-gpu",
                "initContainers": [{"name": "proxy", "image": HUB, "restartPolicy": "Always"}],
            }
        },
        tasks=[{"key": "only", "type": "proxied"}],
    )
    refused = await outcome(harness, later, "only")
    assert refused["reason"] == "PolicyRefused"
    assert (
        "spec.taskTypes.proxied.initContainers[0].image: registry docker.io" in (refused["message"])
    )
    assert (
        "spec.taskTypes.proxied.queueName: LocalQueue 'team-b-gpu' is not allowed"
        in (refused["message"])
    )
    assert len(harness.kube.created) == 2
    assert (await harness.states(run))["first"] == TaskState.SUCCEEDED


async def test_an_unreadable_policy_refuses_every_job_and_a_fixed_one_lets_them_run(
    harness: Harness,
) -> None:
    harness.kube.policies[NAMESPACE] = [
        {"metadata": {"name": "broken"}, "spec": {"caps": {"maxTasks": 0}}}
    ]
    run = await start(
        harness,
        "broken",
        task_types={"app": {"image": TRUSTED}},
        tasks=[{"key": "a", "type": "app"}],
    )
    refused = await outcome(harness, run, "a")
    assert refused["reason"] == "PolicyRefused"
    assert "FlowForgePolicy team-a/broken is invalid (spec.caps.maxTasks" in refused["message"]
    assert harness.kube.created == []

    await tighten(harness, OPEN)
    fixed = await start(
        harness, "fixed", task_types={"app": {"image": HUB}}, tasks=[{"key": "a", "type": "app"}]
    )
    assert (await harness.states(fixed))["a"] == TaskState.RUNNING
    assert len(harness.kube.created) == 1


async def test_a_missed_watch_event_is_caught_up_with_once_the_copy_is_old(
    harness: Harness,
) -> None:
    """The copy is read again after MAX_AGE_SECONDS (a missed event) and under a new
    leadership epoch (a follower skipped the watch's events)."""
    now = [0.0]
    epoch = [1]
    policies = NamespacePolicies(harness.kube, epoch=lambda: epoch[0], clock=lambda: now[0])
    harness.engine.launcher.policies = policies
    harness.kube.policies[NAMESPACE] = [OPEN]
    await harness.engine.policy_changed(NAMESPACE)  # the engine's copy is the launcher's
    run = await start(
        harness,
        "stale",
        task_types={"hub": {"image": HUB}},
        tasks=[
            {"key": "a", "type": "hub"},
            {"key": "b", "type": "hub", "dependsOn": ["a"]},
            {"key": "c", "type": "hub", "dependsOn": ["b"]},
        ],
    )
    harness.kube.policies[NAMESPACE] = [TIGHT]  # no event comes
    await harness.finish("a")
    assert (await harness.states(run))["b"] == TaskState.RUNNING  # the copy is young

    epoch[0] = 2  # led again: what was read under another epoch is read anew
    await harness.finish("b")
    assert (await outcome(harness, run, "c"))["reason"] == "PolicyRefused"

    harness.kube.policies[NAMESPACE] = [OPEN]
    assert await policies.refusal(run, "hub") is not None  # still the copy of epoch 2
    now[0] = MAX_AGE_SECONDS
    assert await policies.refusal(run, "hub") is None
